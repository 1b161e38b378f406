"""`diagnose`: the verdict on a data-bound and a compute-bound loop, measured fixes, bad input."""
from __future__ import annotations

import json
import multiprocessing
import textwrap

import psutil
import pytest

from course_utils.__main__ import main
from course_utils.diagnose import DiagnoseError, build_loop, load_target


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def _no_children_left(before: set[int]) -> None:
    """Nothing diagnose started is still running (a forkserver or resource tracker that another
    test started earlier in this process may be, and is not diagnose's)."""
    assert not multiprocessing.active_children()
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before
            and "resource_tracker" not in " ".join(p.cmdline())]   # multiprocessing's own helper
    assert not left, [p.cmdline() for p in left]


@pytest.mark.timeout(240)
def test_data_bound_example_is_data_bound_with_measured_fixes(tmp_path, capsys):
    before = _children()
    out = tmp_path / "d.json"
    assert main(["diagnose", "course_utils.examples.data_bound:make_loop", "--budget", "8",
                 "--steps", "40", "--no-progress", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["verdict"] == "data-bound", result
    assert result["data_wait_fraction"] > 0.1
    assert any("too few workers" in c for c in result["causes"])
    assert any("float32" in c for c in result["causes"])
    changes = [s["change"] for s in result["suggestions"]]
    assert "num_workers=1" in changes or "num_workers=2" in changes, changes
    for s in result["suggestions"]:           # measured, not asserted: every figure is a timing
        assert s["seconds_per_step"] > 0 and s["gain"] > 0
    assert set(result["wait_tail_s"]) == {"p50", "p95", "p99"}
    text = capsys.readouterr().out
    assert "DATA-BOUND" in text and "measured on the same loop" in text
    _no_children_left(before)


@pytest.mark.timeout(240)
def test_compute_bound_example_is_compute_bound(tmp_path):
    out = tmp_path / "c.json"
    assert main(["diagnose", "course_utils.examples.compute_bound:make_loop", "--budget", "6",
                 "--steps", "12", "--no-progress", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["verdict"] == "compute-bound", result
    assert result["data_wait_fraction"] < 0.1
    assert result["suggestions"] == []
    assert result["seconds_per_step_without_data"] > 0 and result["loader_samples_per_s"] > 0


SCRIPT = '''
import torch
from torch.utils.data import DataLoader, Dataset

class Squares(Dataset):
    def __len__(self):
        return 64
    def __getitem__(self, i):
        return torch.full((4,), float(i * i))

def make_loop():
    loader = DataLoader(Squares(), batch_size=8, num_workers=1, multiprocessing_context="spawn")
    return loader, lambda batch: batch.sum().item()

def not_a_pair():
    return 1, 2, 3

def bad_step():
    return DataLoader(Squares(), batch_size=8), lambda batch: 1 / 0

def raises():
    raise RuntimeError("no data folder")
'''


@pytest.mark.timeout(240)
def test_a_file_target_with_its_own_dataset_runs_under_spawn(tmp_path, capsys):
    before = _children()
    script = tmp_path / "learner_train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    out = tmp_path / "s.json"
    assert main(["diagnose", f"{script}:make_loop", "--budget", "6", "--steps", "10",
                 "--no-progress", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["start_method"] == "spawn" and result["verdict"] in ("data-bound", "compute-bound")
    assert len(result["worker_threads"]) == 1
    _no_children_left(before)


@pytest.mark.parametrize("target, message", [
    ("no_colon", "is not MODULE:FUNCTION"),
    ("surely_not_a_module_xyz:make", "cannot be imported"),
    ("{script}:missing", "has no 'missing'"),
    ("{script}:not_a_pair", "must return (loader, step)"),
    ("{script}:bad_step", "step(batch) raised ZeroDivisionError"),
    ("{script}:raises", "raises() raised RuntimeError: no data folder"),
    ("{dir}/nowhere.py:make", "no such file"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, target, message):
    script = tmp_path / "learner_bad.py"
    script.write_text(textwrap.dedent(SCRIPT))
    target = target.format(script=script, dir=tmp_path)
    assert main(["diagnose", target, "--budget", "3", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err
    assert "Traceback" not in err


def test_bad_budget_and_steps(capsys):
    assert main(["diagnose", "x:y", "--budget", "0"]) == 2
    assert "--budget" in capsys.readouterr().err
    assert main(["diagnose", "x:y", "--steps", "0"]) == 2
    assert "--steps" in capsys.readouterr().err


def test_build_loop_checks_the_pieces():
    with pytest.raises(DiagnoseError, match="must be iterable"):
        build_loop(lambda: (3, print))
    with pytest.raises(DiagnoseError, match="must be a function step"):
        build_loop(lambda: ([1, 2], "step"))
    assert callable(load_target("course_utils.examples.compute_bound:make_loop"))


class _SlowStartLoader:
    """A loader-like iterable: 12 batches an epoch, 16 workers x 2 prefetch slots, and a start-up
    per epoch (like starting worker processes) of ``startup_s`` seconds."""

    num_workers, prefetch_factor = 16, 2

    def __init__(self, startup_s: float) -> None:
        self.startup_s = startup_s

    def __len__(self) -> int:
        return 12

    def __iter__(self):
        import time
        import torch
        time.sleep(self.startup_s)
        for i in range(12):
            yield torch.full((4, 2), float(i))


def test_warmup_is_capped_by_the_epoch_so_steps_are_timed():
    from course_utils.diagnose import time_loop
    timing = time_loop(_SlowStartLoader(0.25), lambda batch: None, max_steps=100, seconds=0.3,
                       label="num_workers=16")
    assert timing.warmup_steps == 6            # half of a 12-batch epoch, not 16 x 2 = 32
    assert timing.steps >= 1 and timing.seconds_per_step > 0


def _fake_timing(label: str, wait: float, step: float, steps: int, warmup: int = 2):
    from course_utils.diagnose import LoopTiming
    return LoopTiming(label, [wait] * steps, [step] * steps, 8 * steps, 0.01, warmup)


def _patched_diagnose(monkeypatch, fixes: dict):
    """``diagnose`` on a small DataLoader with ``time_loop`` faked: the loop is data-bound, and
    each fix (by label) gets the timing in ``fixes``."""
    import math
    import torch
    from torch.utils.data import DataLoader
    import course_utils.diagnose as d

    timings = {"your loop": _fake_timing("your loop", 0.009, 0.001, 20),
               "loader alone": _fake_timing("loader alone", 0.009, 0.0, 20), **fixes}
    seen = []

    def fake_time_loop(loader, step, *, max_steps, seconds, label, tick=None):
        seen.append((label, seconds))
        return timings[label]

    monkeypatch.setattr(d, "time_loop", fake_time_loop)
    monkeypatch.setattr(d, "usable_cpus", lambda: 16)
    loader = DataLoader(torch.zeros(24, 4), batch_size=2)      # num_workers=0: fixes 1 and 16
    result = d.diagnose(loader, lambda batch: None, budget_s=10, progress=False)
    for s in result.suggestions:
        assert all(math.isfinite(v) for v in s.values() if isinstance(v, float)), s
    return result, dict(seen)


@pytest.mark.filterwarnings("ignore:This DataLoader will create")   # none is started
def test_a_fix_that_timed_no_step_is_a_note_not_a_nan_suggestion(monkeypatch):
    from course_utils.diagnose import LoopTiming
    result, seen = _patched_diagnose(monkeypatch, {
        "num_workers=1": _fake_timing("num_workers=1", 0.004, 0.001, 20),
        "num_workers=16": LoopTiming("num_workers=16", [], [], 0, 1.2, 32)})
    assert result.verdict == "data-bound"
    assert [s["change"] for s in result.suggestions] == ["num_workers=1"]
    assert result.suggestions[0]["gain"] == pytest.approx(2.0)
    note = [n for n in result.notes if n.startswith("not measured: num_workers=16")]
    assert note == [f"not measured: num_workers=16 timed no step in {seen['num_workers=16']:.1f} s "
                    f"(32 warm-up batches)"], result.notes
    assert "nan" not in str(result).lower()


@pytest.mark.filterwarnings("ignore:This DataLoader will create")   # none is started
def test_a_zero_step_time_in_the_loop_does_not_divide_by_zero(monkeypatch):
    loop = _fake_timing("your loop", 0.009, 0.0, 20)            # step_s all 0: base_step is 0
    result, _ = _patched_diagnose(monkeypatch, {
        "num_workers=1": _fake_timing("num_workers=1", 0.004, 0.002, 20),
        "num_workers=16": _fake_timing("num_workers=16", 0.001, 0.003, 20)} | {"your loop": loop})
    assert [s["change"] for s in result.suggestions] == ["num_workers=1", "num_workers=16"]
    assert not any("x as long" in n for n in result.notes), result.notes


def test_json_output_is_strict_json_without_nan_or_infinity(tmp_path, capsys):
    from course_utils.__main__ import _print_and_save

    class Result:
        def __str__(self) -> str:
            return "a result"

        def to_dict(self) -> dict:
            return {"gain": float("nan"), "rows": [1.5, float("inf"), {"low": float("-inf")}],
                    "pair": (2.0, float("nan")), "name": "x", "n": 3}

    def no_constants(name: str):
        raise ValueError(f"{name} is not JSON")

    out = tmp_path / "r.json"
    _print_and_save(Result(), str(out))
    text = out.read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text, parse_constant=no_constants) == {
        "gain": None, "rows": [1.5, None, {"low": None}], "pair": [2.0, None], "name": "x", "n": 3}
    assert "a result" in capsys.readouterr().out
