"""Pins ``course_utils.tools.diagnose.probe`` (and the parts of ``.script`` that read what it
writes) in this process, where mutants are seen: ``run_probe`` on tiny workers-free scripts
(how each ending maps to ``end`` and the exit status, the batches timed after the warm-up, the
script's own error line and frame), the batch and transform descriptions, the worker samples'
sums and interval, and ``_why_no_figures``' advice. Each run is a fraction of a second."""
from __future__ import annotations

import json
import sys
import textwrap
import types
from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import DataLoader, Subset, TensorDataset

import course_utils.tools.diagnose.probe as probe
import course_utils.tools.diagnose.script as ds
from course_utils.tools.diagnose.probe import (LoaderRecord, _at, _describe_batch, _transform_of,
                                               run_probe, script_error)

SCRIPT = textwrap.dedent("""\
    import sys
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    mode = sys.argv[1]
    loader = DataLoader(TensorDataset(torch.zeros(40, 2)), batch_size=2)
    for epoch in range(2):
        for i, (x,) in enumerate(loader):
            if mode == "raise" and epoch == 1 and i == 3:
                raise ValueError("bad batch\\nsecond line")
    if mode == "exit":
        sys.exit(3)
    if mode == "exit_text":
        sys.exit("stopped")
    if mode == "usage":
        import argparse
        parser = argparse.ArgumentParser()
        parser.add_argument("--n", type=int, required=True)
        parser.parse_args(sys.argv[2:])
    if mode == "ctrl_c":
        raise KeyboardInterrupt
    if mode == "ranks":
        import torch.multiprocessing as mp
        mp.spawn(print, nprocs=1)
    """)


@pytest.fixture
def probe_run(tmp_path, monkeypatch):
    """Run SCRIPT (or a module) under the probe here; returns the JSON it wrote and the status."""
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)

    def run(*argv, budget_s=60.0, module=None, overrides=None):
        out = tmp_path / "probe.json"
        config = {"argv": list(argv), "budget_s": budget_s, "overrides": overrides or {},
                  "out": str(out), "grace_s": 30.0}
        config.update({"module": module} if module else {"script": str(script)})
        status = run_probe(config)
        return json.loads(out.read_text()), status

    run.script = script
    return run


def test_a_script_that_ends_is_timed_after_its_warm_up(probe_run):
    data, status = probe_run("ends")
    assert status == 0 and data["end"] == "the script ended" and data["error"] is None
    assert data["raised"] is None and data["elapsed_s"] > 0 and data["cuda"] is False
    [loader] = data["loaders"]
    # 2 epochs of 20 batches; the first 2 batches are the warm-up (no workers): 38 timed
    assert (loader["batches"], loader["epochs"]) == (40, 2)
    assert len(loader["waits_s"]) == len(loader["steps_s"]) == 38 and loader["samples"] == 76
    assert loader["where"].endswith("train.py:6") and loader["settings"]["num_workers"] == 0
    assert loader["settings"]["start_method"] == "main process"
    assert loader["settings"]["dataset"] == "TensorDataset" and loader["batch"] == "float32 (2, 2)"
    assert loader["startup_s"] >= 0 and loader["worker_busy_s"] == 0 and loader["workers_seen"] == 0
    stats = ds.LoaderStats(loader)
    assert stats.measured and stats.timed_batches == 38


def test_a_spent_budget_ends_at_the_first_batch_boundary(probe_run):
    data, status = probe_run("ends", budget_s=0.0)
    assert status == 0 and data["end"] == "the budget was spent"
    assert data["loaders"][0]["batches"] == 0


def test_an_override_is_recorded_on_its_loader(probe_run):
    data, status = probe_run("ends", overrides={"0": {"batch_size": 4}})
    [loader] = data["loaders"]
    assert loader["overridden"] == {"batch_size": 4} and loader["settings"]["batch_size"] == 4
    assert loader["batches"] == 20 and loader["samples"] == 4 * 18


@pytest.mark.parametrize("mode, status, end", [
    ("exit", 3, "the script called sys.exit(3)"),
    ("exit_text", 1, "the script called sys.exit('stopped')"),
    ("usage", 2, ds.USAGE_ERROR),
    ("ctrl_c", 130, "interrupted (Ctrl-C)"),
    ("ranks", 2, ds.OUT_OF_SCOPE),
])
def test_each_ending_has_its_status(probe_run, mode, status, end):
    data, got = probe_run(mode)
    assert (got, data["status"], data["end"]) == (status, status, end)
    assert data["raised"] is None
    assert (data["error"] is not None) == (mode == "ranks")
    import torch.multiprocessing as mp
    assert mp.spawn.__module__ != "course_utils.tools.diagnose.probe"     # undone


def test_a_script_that_raises_says_its_error_and_its_own_line(probe_run):
    data, status = probe_run("raise")
    assert status == 1 and data["end"] == "the script raised"
    assert data["raised"]["error"] == "ValueError: bad batch" and data["raised"]["usage"] is False
    assert data["raised"]["where"] == f"{probe_run.script}:10"
    assert "traceback" not in data["raised"]
    assert "ValueError: bad batch" in data["error"] and "runpy" not in data["error"]
    assert "probe.py" not in data["error"]
    assert data["loaders"][0]["batches"] == 24         # 20, then 4 of the second epoch


def test_a_module_runs_from_the_working_directory(probe_run, tmp_path, monkeypatch):
    (tmp_path / "mytrain.py").write_text(SCRIPT)
    monkeypatch.chdir(tmp_path)
    data, status = probe_run("exit", module="mytrain")
    assert status == 3 and data["loaders"][0]["batches"] == 40


# ---- the descriptions --------------------------------------------------------------------

def test_a_batch_is_described_by_its_images():
    assert _describe_batch((torch.zeros(4, 3, 8, 8, dtype=torch.uint8), torch.zeros(4))) == \
        "uint8 (4, 3, 8, 8)"
    assert _describe_batch([torch.zeros(2, 5)]) == "float32 (2, 5)"
    assert _describe_batch({"image": torch.zeros(2, 1, dtype=torch.float16), "y": 1}) == "float16 (2, 1)"
    assert _describe_batch(torch.zeros(3)) == "float32 (3,)"
    assert _describe_batch(["a", "b"]) == "str"
    assert _describe_batch([]) == "list" and _describe_batch({}) == "dict"


class Scale:
    def __call__(self, x):
        return x


def test_the_transform_is_found_through_wrapping_datasets():
    data = TensorDataset(torch.zeros(4, 1))
    data.transform = Scale()
    assert _transform_of(data) == "Scale"
    assert _transform_of(Subset(data, [0, 1])) == "Scale"
    assert _transform_of(Subset(Subset(Subset(data, [0]), [0]), [0])) == "Scale"     # 4 levels
    assert _transform_of(Subset(Subset(Subset(Subset(data, [0]), [0]), [0]), [0])) == "None"
    plain = TensorDataset(torch.zeros(4, 1))
    plain.transform = "not callable"
    plain.transforms = Scale()
    assert _transform_of(plain) == "Scale"
    assert _transform_of(TensorDataset(torch.zeros(4, 1))) == "None"


def test_an_error_is_its_type_and_first_line_at_the_scripts_deepest_frame():
    def script_frame():
        raise KeyError()

    try:
        script_frame()
    except KeyError as exc:
        found = script_error(exc)
    assert found["error"] == "KeyError" and found["usage"] is False
    assert found["where"].startswith(__file__ + ":")
    assert "script_frame" in found["traceback"]
    frames = [types.SimpleNamespace(filename=f, lineno=n) for f, n in (
        ("/x/site-packages/torch/a.py", 1), ("/home/me/train.py", 7), ("/home/me/model.py", 3))]
    assert _at(frames) == "/home/me/train.py:7"
    assert _at(frames[:1]) == "/x/site-packages/torch/a.py:1"      # only a library's: the first
    assert _at([]) == "unknown"


# ---- the workers' samples --------------------------------------------------------------------

def test_workers_are_sampled_each_half_second_and_summed_first_to_last(monkeypatch):
    monkeypatch.setattr(probe, "loader_worker_pids", lambda it: [11, 12])
    busy = {"11": iter([1.0, 1.4, 2.0]), "12": iter([5.0, 5.1])}
    monkeypatch.setattr(probe, "busy_s", lambda task="": next(busy[task]))

    class Proc:
        threads = {11: iter([2, 5, 3]), 12: iter([1, 1])}
        rss = {11: iter([100, 150, 170]), 12: iter([50, 40])}

        def __init__(self, pid):
            self.pid = pid

        def num_threads(self):
            return next(Proc.threads[self.pid])

        def memory_info(self):
            return SimpleNamespace(rss=next(Proc.rss[self.pid]))

    monkeypatch.setattr(probe.psutil, "Process", Proc)
    r = LoaderRecord(0, DataLoader(TensorDataset(torch.zeros(8, 2)), batch_size=2), "t.py:1", {})
    r.sample(None, 10.0)                      # both workers: first seen at t=10
    r.sample(None, 10.49)                     # under 0.5 s later: not sampled
    r.sample(None, 10.5)                      # 0.5 s later: sampled
    monkeypatch.setattr(probe, "loader_worker_pids", lambda it: [11])
    r.sample(None, 10.6, force=True)          # an epoch's first batch: sampled whatever the time
    d = r.to_dict()
    # worker 11: busy 1.0 -> 2.0 over 10.0 -> 10.6; worker 12: 5.0 -> 5.1 over 10.0 -> 10.5
    assert d["worker_busy_s"] == pytest.approx(1.0 + 0.1)
    assert d["worker_wall_s"] == pytest.approx(0.6 + 0.5)
    assert d["workers_seen"] == 2 and d["worker_threads"] == [1, 5]      # each worker's most
    assert d["worker_rss"] == [[100, 170], [50, 40]]                     # first and last, not most


# ---- why a run gave no figures ------------------------------------------------------------

def run_ending(end, status=0, raised=None, batches=(3,)):
    loaders = [ds.LoaderStats({"index": k, "batches": b}) for k, b in enumerate(batches)]
    return ds.ScriptRun("as it is", {}, end, status, None, 1.0, False, loaders, raised)


def test_why_no_figures_says_what_to_do_for_each_ending():
    assert ds._why_no_figures(run_ending(ds.OUT_OF_SCOPE, 2), [], 30) == []
    assert ds._why_no_figures(run_ending("the script raised", 1, raised={"error": "E"}), [], 30) == []
    [usage] = ds._why_no_figures(run_ending(ds.USAGE_ERROR, 2),
                                 ["--epochs", "3", "--budget", "9", "--no-progress", "--json=x"], 30)
    assert usage.startswith("the script rejected its arguments (exit 2; its usage message is on "
                            "stderr): --budget 9 --no-progress --json=x went to the script;")
    [plain] = ds._why_no_figures(run_ending(ds.USAGE_ERROR, 2), ["--epochs", "3"], 30)
    assert "went to the script" not in plain
    [budget] = ds._why_no_figures(run_ending("the budget was spent"), [], 29.6)
    assert budget.startswith("no loader had 10 timed batches within 30 s (the budget was spent)")
    [ended] = ds._why_no_figures(run_ending("the script ended", batches=(3, 4)), [], 30)
    assert ended.startswith("the script ended after 7 batch(es) (loader 0: 3, loader 1: 4): give it")
    [failed] = ds._why_no_figures(run_ending("the script called sys.exit(4)", 4), [], 30)
    assert failed == "the script called sys.exit(4) after 3 batch(es) (exit status 4)"
