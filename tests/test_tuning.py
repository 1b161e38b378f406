"""The loader tuner: budget, early stopping, result consistency, image folders, CLI errors.

Tiny datasets and budgets keep every test to seconds; no timing claim is asserted.
"""
from __future__ import annotations

import json

import cv2
import matplotlib
import pytest
import torch
from torch.utils.data import DataLoader

from course_utils import JpegDataset, tune_loader
from course_utils.__main__ import main
from course_utils.tuning import PROBE_THRESHOLD, LoaderSettings, TuningResult

matplotlib.use("Agg")
pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def small_jpegs():
    return JpegDataset(n=64, min_side=48, max_side=96)


@pytest.fixture(scope="module")
def image_folder(tmp_path_factory, small_jpegs):
    root = tmp_path_factory.mktemp("images")
    for i in range(24):
        image, label = small_jpegs[i]
        (root / f"c{label % 2}").mkdir(exist_ok=True)
        cv2.imwrite(str(root / f"c{label % 2}" / f"{i}.jpg"), image[..., ::-1])
    return root


@pytest.fixture(scope="module")
def result(small_jpegs):
    return tune_loader(small_jpegs, budget_s=6, size=32, batch_size=8, worker_counts=[0, 1],
                       batch_sizes=[8, 16], progress=False)


def test_result_is_consistent(result):
    assert isinstance(result, TuningResult)
    assert isinstance(result.best, LoaderSettings)
    assert result.best_trial in result.trials and result.best_trial.complete
    assert result.best == result.best_trial.settings
    complete = [t for t in result.trials if t.complete]
    assert result.best_trial.score == max(t.score for t in complete)
    # every trial's settings appear in the table, in order
    table = result.table()
    for t in result.trials:
        assert t.settings.label() in table
    assert "<- best" in table
    text = str(result)
    assert "Code to paste" in text and "pin_memory" in text
    assert [t.index for t in result.trials] == list(range(1, len(result.trials) + 1))


def test_pin_memory_skip_is_explained_without_cuda(result):
    if torch.cuda.is_available():
        pytest.skip("CUDA is here: pin_memory is tried")
    assert any("pin_memory=True" in s and "no CUDA" in s for s in result.skipped)
    assert not any(t.settings.pin_memory for t in result.trials)


def test_code_to_paste_builds_the_best_loader(result, small_jpegs):
    code = result.code()
    assert "DataLoader(" in code and f"batch_size={result.best.batch_size}" in code
    if result.best.num_workers:
        assert f"worker_init_fn=make_worker_init({result.best.threads_per_worker})" in code
    scope = {"dataset": small_jpegs}
    exec(code.replace("size=32", "size=32"), scope)
    loader = scope["loader"]
    assert isinstance(loader, DataLoader)
    assert loader.batch_size == result.best.batch_size
    assert loader.num_workers == result.best.num_workers
    images, labels = next(iter(loader))
    assert images.dtype == torch.uint8 and tuple(images.shape[1:]) == (3, 32, 32)


def test_comparison_ratios_are_computed(result):
    rows = [m.label for m in result.comparison.rows]
    assert rows == ["defaults", "common recipe", "tuned"]
    tuned = result.comparison.row("tuned").samples_per_s
    assert result.speedup_vs_recipe == pytest.approx(
        tuned / result.comparison.row("common recipe").samples_per_s)
    assert all(len(m.times_s) >= 2 for m in result.comparison.rows)   # interleaved rounds


def test_to_dict_is_json(result):
    data = json.loads(json.dumps(result.to_dict()))
    assert data["best"] == result.best.to_dict()
    assert len(data["trials"]) == len(result.trials)
    assert data["thresholds"]["probe_threshold"] == PROBE_THRESHOLD
    assert "DataLoader(" in data["code"]


def test_plot_returns_a_figure_with_machine_and_settings(result):
    from course_utils import machine_summary

    fig = result.plot()
    assert isinstance(fig, matplotlib.figure.Figure)
    title = fig._suptitle.get_text()
    assert machine_summary() in title and result.best.label() in title
    import matplotlib.pyplot as plt
    plt.close(fig)


def test_tiny_budget_stops_early_and_says_what_was_skipped(small_jpegs):
    r = tune_loader(small_jpegs, budget_s=2.0, size=32, batch_size=8, progress=False,
                    worker_counts=[0, 1, 2, 3], batch_sizes=[4, 8, 16, 32],
                    compare_with_baselines=False)
    assert r.trials, "the first trial always runs"
    assert r.not_tried, "a 2 s budget cannot try every setting"
    assert "Not tried (budget ran out)" in str(r)
    assert r.comparison is None
    # the search starts a trial only while time is left: at most one trial past the budget
    assert r.search_s <= r.budget_s + max(t.seconds for t in r.trials) + 1.0


def test_early_stopping_marks_probes(monkeypatch, small_jpegs):
    """A probe far below the best is not timed fully (a fake clock makes w=1 look slow)."""
    import course_utils.tuning as tuning

    real = tuning._Search._score
    calls = []

    def slow_workers(self, rate, startup, batch_size):
        calls.append(rate)
        return real(self, rate, startup, batch_size) * (0.1 if self.trials else 1.0)

    monkeypatch.setattr(tuning._Search, "_score", slow_workers)
    r = tune_loader(small_jpegs, budget_s=8, size=32, batch_size=8, worker_counts=[0, 1, 2],
                    batch_sizes=[8], compare_with_baselines=False, progress=False)
    assert r.trials[0].complete
    later = r.trials[1:]
    assert later and all(t.status == "stopped after probe" for t in later)
    # the num_workers ladder fell twice in a row and said so (or ran out of rungs)
    assert r.best == r.trials[0].settings


def test_image_folder_works(image_folder):
    r = tune_loader(image_folder, budget_s=5, size=32, batch_size=8, worker_counts=[0, 1],
                    batch_sizes=[8], progress=False)
    assert "ImageFolderDataset" in r.dataset
    assert f"ImageFolderDataset({str(image_folder)!r}" in r.code()
    scope: dict = {}
    exec(r.code(), scope)
    images, labels = next(iter(scope["loader"]))
    assert images.dtype == torch.uint8 and tuple(images.shape[1:]) == (3, 32, 32)


@pytest.mark.parametrize("kwargs, word", [
    ({"budget_s": 0}, "budget_s"),
    ({"budget_s": -5}, "budget_s"),
    ({"budget_s": 0.5}, "budget_s"),
    ({"budget_s": "60"}, "budget_s"),
    ({"budget_s": 10, "size": 0}, "size"),
    ({"budget_s": 10, "batch_size": 0}, "batch_size"),
    ({"budget_s": 10, "worker_counts": [-1]}, "worker_counts"),
    ({"budget_s": 10, "batch_sizes": []}, "batch_sizes"),
])
def test_bad_arguments_name_the_argument(kwargs, word, small_jpegs):
    with pytest.raises((ValueError, TypeError)) as info:
        tune_loader(small_jpegs, progress=False, **kwargs)
    assert word in str(info.value)


def test_bad_data(tmp_path):
    with pytest.raises(FileNotFoundError, match="data="):
        tune_loader(tmp_path / "missing", budget_s=5, progress=False)
    with pytest.raises(ValueError, match="no images"):
        tune_loader(tmp_path, budget_s=5, progress=False)
    with pytest.raises(TypeError, match="data must be"):
        tune_loader(42, budget_s=5, progress=False)


def test_settings_validate():
    assert LoaderSettings(num_workers=2).prefetch_factor == 2
    assert LoaderSettings(num_workers=0, prefetch_factor=4).prefetch_factor is None
    with pytest.raises(ValueError, match="num_workers"):
        LoaderSettings(num_workers=-1)
    with pytest.raises(ValueError, match="persistent_workers"):
        LoaderSettings(num_workers=0, persistent_workers=True)


# ---- command line ---------------------------------------------------------------------------

def test_cli_help(capsys):
    with pytest.raises(SystemExit) as info:
        main(["tune", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "FOLDER" in out and "--budget" in out and "--course-data" in out


@pytest.mark.parametrize("args, word", [
    (["tune", "/no/such/folder"], "does not exist"),
    (["tune", "--budget", "0"], "--budget"),
    (["tune", "--budget", "-3"], "--budget"),
    (["tune", "--budget", "0.5"], "too small"),
])
def test_cli_errors_are_one_line_exit_2(args, word, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert word in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_cli_empty_folder_and_both_sources(tmp_path, capsys):
    assert main(["tune", str(tmp_path)]) == 2
    assert "has no images" in capsys.readouterr().err
    assert main(["tune", str(tmp_path), "--course-data"]) == 2
    assert "not both" in capsys.readouterr().err


def test_cli_tunes_a_folder(image_folder, tmp_path, capsys):
    out_json = tmp_path / "r.json"
    code = main(["tune", str(image_folder), "--budget", "4", "--size", "32", "--batch-size", "8",
                 "--no-compare", "--no-progress", "--json", str(out_json)])
    assert code == 0
    out = capsys.readouterr().out
    assert "loader = DataLoader(" in out
    assert json.loads(out_json.read_text())["best"]["batch_size"] >= 1
