"""``python -m course_utils diagnose train.py``: its command line, its faults, and its rules."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

from _helpers import DIAGNOSE_SCRIPTS as SCRIPTS, diagnose_cli
from course_utils.tools.cli import script_exit_status, split_diagnose_argv
from course_utils.tools.diagnose import DiagnoseError
from course_utils.tools.diagnose import script as ds
from course_utils.tools.diagnose.rules import LOAD_BUSY
from course_utils.tools.diagnose.script import OUT_OF_SCOPE
from course_utils.timing import MIN_TIMED_BATCHES

ROOT = Path(__file__).resolve().parents[1]
_cli = diagnose_cli


# ---- the command line --------------------------------------------------------------------
@pytest.mark.parametrize("argv, ours, theirs", [
    (["diagnose", "train.py", "--budget", "3"], ["diagnose", "train.py"], ["--budget", "3"]),
    (["diagnose", "--budget", "3", "--try", "num_workers=2", "train.py", "-x"],
     ["diagnose", "--budget", "3", "--try", "num_workers=2", "train.py"], ["-x"]),
    (["diagnose", "--budget=3", "-m", "pkg.train", "--lr", "1"],
     ["diagnose", "--budget=3", "-m", "pkg.train"], ["--lr", "1"]),
    (["diagnose", "--no-progress", "--bogus", "train.py"],
     ["diagnose", "--no-progress", "--bogus", "train.py"], []),
    (["diagnose", "--json=r.json", "train.py", "--json", "theirs.json"],
     ["diagnose", "--json=r.json", "train.py"], ["--json", "theirs.json"]),
])
def test_everything_after_the_script_is_the_scripts(argv, ours, theirs):
    assert split_diagnose_argv(argv) == (ours, theirs)


@pytest.mark.parametrize("text, expected", [
    ("num_workers=4", {"num_workers": 4}),
    ("num_workers=0,pin_memory=true", {"num_workers": 0, "pin_memory": True}),
    ("persistent_workers=False, prefetch_factor=4", {"persistent_workers": False, "prefetch_factor": 4}),
    ("pin_memory=1,persistent_workers=0", {"pin_memory": True, "persistent_workers": False}),
    ("prefetch_factor=1", {"prefetch_factor": 1}),
])
def test_try_reads_key_value_changes(text, expected):
    assert ds.parse_try(text) == expected


@pytest.mark.parametrize("text, says", [
    ("workers=4", "KEY=VALUE"), ("num_workers", "KEY=VALUE"), ("num_workers=four", "whole number"),
    ("pin_memory=yes", "true or false"), ("batch_size=0", "too small"), ("num_workers=-1", "too small"),
    ("num_workers=4=5", "whole number"), ("lr=0.1", "num_workers, batch_size, prefetch_factor"),
])
def test_a_bad_try_says_what_to_write(text, says):
    with pytest.raises(DiagnoseError, match=says):
        ds.parse_try(text)


def test_no_such_script_is_one_line():
    out = _cli("no_such_train.py", "--epochs", "1")
    assert out.returncode == 2 and "no such script" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


# ---- the rules, on recorded figures -------------------------------------------------------
def _stats(index=0, waits=(0.02,) * 10, steps=(0.01,) * 10, **settings):
    base = {"num_workers": 1, "batch_size": 8, "pin_memory": False, "persistent_workers": False,
            "prefetch_factor": 2, "start_method": "fork", "dataset": "D", "transform": "None",
            "iterable_dataset": False}
    return ds.LoaderStats({"index": index, "where": "train.py:9", "settings": {**base, **settings},
                           "overridden": {}, "startup_s": 0.5, "warmup_batches": 2,
                           "batches": 13, "epochs": 3, "samples": 8 * len(waits),
                           "waits_s": list(waits), "steps_s": list(steps), "batch": "uint8 (8, 3)",
                           "wait_busy_s": 0.0, "epoch_start_wait_s": 0.0, "worker_busy_s": 0.2,
                           "worker_wall_s": 1.0, "workers_seen": 1, "worker_threads": [2],
                           "gpu_busy": None, "batch_tensors": 1, "batch_bytes": 192,
                           "shm_free": 2**30, "fds": {"at_start": 9, "peak": 11}, "worker_rss": [],
                           "limits": {"nofile": 1024, "memory": 2**33, "memory_of": "the machine's RAM",
                                      "sharing": "file_descriptor"}})


def _run(*loaders, label="as it is", changes=None):
    return ds.ScriptRun(label, changes or {}, "the budget was spent", 0, None, 2.0, False,
                        list(loaders))


def test_the_busiest_loader_is_the_loop():
    small = _stats(0, waits=(0.01,) * 10, steps=(0.01,) * 10)
    big = _stats(1)
    assert _run(small, big).main_loader() is big
    assert _run(_stats(0, waits=(), steps=())).main_loader() is None
    # the engine's rule: a loader with one batch fewer than MIN_TIMED_BATCHES is not the loop,
    # however long its batches took (a validation loader of 6, a script that died in step 3)
    n = MIN_TIMED_BATCHES - 1
    few = _stats(0, waits=(1.0,) * n, steps=(1.0,) * n)
    assert _run(few, small).main_loader() is small and _run(few).main_loader() is None
    assert (few.wait_fraction, few.samples_per_s, few.mean_step_s(), few.load_busy()) == (None,) * 4
    assert _stats(0, waits=(1.0,) * (n + 1), steps=(1.0,) * (n + 1)).wait_fraction == 0.5
    assert big.wait_fraction == pytest.approx(2 / 3) and big.samples_per_s == pytest.approx(80 / 0.3)


@pytest.mark.parametrize("rate, best", [(1.06, True), (1.04, False)])
def test_a_fix_counts_when_it_gains_more_than_five_percent(rate, best):
    base = _stats()
    faster = _stats(waits=(0.02 / rate - 0.01 * (1 - 1 / rate),) * 10, steps=(0.01,) * 10)
    fix = _run(faster, label="num_workers=2", changes={"num_workers": 2})
    d = ds.ScriptDiagnosis("train.py", _run(base), "data-bound", [], fixes=[fix])
    assert d.gain(fix) == pytest.approx(rate)
    assert (d.best_fix() is fix) is best
    text = str(d)
    assert ("change: train.py:9: DataLoader(..., num_workers=2)" in text) is best
    assert json.loads(json.dumps(d.to_dict()))["best_fix"] == ({"num_workers": 2} if best else None)


def test_default_fixes_come_best_expected_first(monkeypatch):
    monkeypatch.setattr(ds, "usable_cpus", lambda: 4)
    stats = _stats(num_workers=1)
    assert ds.default_tries(stats, cuda=False) == [      # its 3 epochs restarted the workers
        {"persistent_workers": True}, {"num_workers": 4, "persistent_workers": True},
        {"num_workers": 2, "persistent_workers": True}]  # one per CPU before twice as many
    assert ds.default_tries(stats, cuda=True) == [{"pin_memory": True}, *ds.default_tries(stats, cuda=False)]
    assert ds.default_tries(_stats(num_workers=0, persistent_workers=False), cuda=False) == [
        {"num_workers": 4, "persistent_workers": True}, {"num_workers": 1, "persistent_workers": True}]
    assert ds.default_tries(_stats(num_workers=4, pin_memory=True), cuda=True) == [
        {"persistent_workers": True}, {"num_workers": 8, "persistent_workers": True}]
    assert ds.default_tries(_stats(num_workers=8, persistent_workers=True), cuda=False) == []
    assert ds.default_tries(_stats(num_workers=4, persistent_workers=True), cuda=False) == [
        {"num_workers": 8}]                                  # up to twice the CPUs, no more
    assert ds.default_tries(_stats(num_workers=5, persistent_workers=True), cuda=False) == []
    assert ds.default_tries(_stats(num_workers=3, persistent_workers=True), cuda=False) == [
        {"num_workers": 4}, {"num_workers": 6}]              # within the CPUs first
    one_epoch, two = _stats(num_workers=0), _stats(num_workers=0)
    one_epoch.raw["epochs"], two.raw["epochs"] = 1, 2
    assert ds.default_tries(one_epoch, cuda=False) == [{"num_workers": 4}, {"num_workers": 1}]
    assert ds.default_tries(two, cuda=False)[0] == {"num_workers": 4, "persistent_workers": True}


def test_causes_follow_the_settings_and_the_figures(monkeypatch):
    monkeypatch.setattr(ds, "usable_cpus", lambda: 4)
    stats = _stats(num_workers=1)
    stats.raw["epoch_start_wait_s"] = 0.031                 # 10.3 % of the 0.3 s loop
    causes = " ".join(ds.likely_causes(stats, cuda=True))
    assert "num_workers=1 on 4" in causes and "unpinned memory: the copy to the GPU cannot overlap" in causes
    assert "restart every epoch: the epochs' first batches waited 0.03 s, 10% of the loop" in causes
    stats.raw["epoch_start_wait_s"] = 0.029                 # 9.7 %: not the cause
    assert "restart" not in " ".join(ds.likely_causes(stats, cuda=True))
    assert "num_workers=0 on 4" in " ".join(ds.likely_causes(_stats(num_workers=0), cuda=False))
    assert ds.likely_causes(_stats(num_workers=4, persistent_workers=True, pin_memory=True),
                            cuda=True) == []
    assert ds.likely_causes(_stats(num_workers=1), cuda=False) == [
        "too few workers: num_workers=1 on 4 usable CPUs"]  # no device: nothing about copies


@pytest.mark.parametrize("gains, left", [
    ([1.04], []), ([1.06], ["too few", "restart", "unpinned"]), ([None], ["too few", "restart", "unpinned"]),
    ([1.0, 1.5], ["too few", "restart", "unpinned"])])
def test_a_cause_its_measured_fix_did_not_help_is_not_listed(monkeypatch, gains, left):
    """A cause stays unless every try that changed its setting gained at most MIN_GAIN."""
    monkeypatch.setattr(ds, "usable_cpus", lambda: 4)
    stats = _stats(num_workers=1)
    stats.raw["epoch_start_wait_s"] = 0.1
    every = {"num_workers": 4, "persistent_workers": True, "pin_memory": True}
    causes = ds.likely_causes(stats, cuda=True, tried=[(every, g) for g in gains])
    names = {"too few": "too few workers", "restart": "restart every epoch", "unpinned": "unpinned memory"}
    assert [next(k for k, v in names.items() if v in c) for c in causes] == left
    only_pin = ds.likely_causes(stats, cuda=True, tried=[({"pin_memory": True}, 1.0)])
    assert len(only_pin) == 2 and not any("unpinned" in c for c in only_pin)


@pytest.mark.parametrize("workers, cpu, wall, waits, busy, per_sample_ms", [
    (0, 0.15, None, 0.2, 0.75, 1.875),   # the loop thread computed 0.15 s of its 0.2 s of waits
    (0, 0.25, None, 0.2, 1.0, 3.125),    # read just outside the waits: a share is at most 1
    (0, 0.09, None, 0.2, None, None),    # 45 %: waiting (a file, a sleep), not computing
    (2, 0.9, 1.0, 0.2, 0.9, 6.75),       # two workers 90 % busy, 266.7 samples/s
    (2, 0.4, 1.0, 0.2, None, None),
])
def test_the_per_sample_cpu_cost_is_named_when_the_loading_computes(monkeypatch, workers, cpu,
                                                                      wall, waits, busy, per_sample_ms):
    monkeypatch.setattr(ds, "usable_cpus", lambda: 1)
    stats = _stats(num_workers=workers, persistent_workers=True, dataset="Spectrograms",
                   waits=(waits / 10,) * 10)
    stats.raw.update(wait_busy_s=cpu if wall is None else 0.0, worker_busy_s=cpu, worker_wall_s=wall or 0.0)
    causes = [c for c in ds.likely_causes(stats, cuda=False) if not c.startswith("too few")]
    if busy is None:
        assert not any("per-sample CPU cost" in c for c in causes) and stats.load_busy() <= LOAD_BUSY
    else:
        assert stats.load_busy() == pytest.approx(busy) and len(causes) == 1
        assert causes[0].startswith(f"the per-sample CPU cost in Spectrograms (decode, transforms, "
                                    f"conversions): {per_sample_ms:.1f} ms computing per sample")
        assert f"busy {busy:.0%}" in causes[0]


# ---- whole runs: the script's own endings ----------------------------------------------
def test_a_script_that_raises_in_step_3_says_so_in_one_line_with_its_own_traceback():
    out = _cli("--budget", "6", str(SCRIPTS / "faults.py"), "--fault", "raise", "--at", "3",
               "--workers", "0")
    assert out.returncode == 1, out.stderr
    raise_line = next(i for i, line in enumerate(SCRIPTS.joinpath("faults.py").read_text().splitlines(), 1)
                      if "raise RuntimeError" in line)
    # 4 batches: 2 of warm-up, the third timed once its step ended, the fourth's step never did
    assert (f"the run ended: the script raised RuntimeError: the model diverged (a loss of nan) at "
            f"{SCRIPTS / 'faults.py'}:{raise_line}, after 4 batch(es); its own traceback follows on "
            f"stderr") in out.stdout.splitlines()
    assert ": NO VERDICT (no loader had 10 timed batches)" in out.stdout
    assert "no figures: 4 batch(es), 1 timed after the 2 of warm-up" in out.stdout
    assert "DATA-BOUND" not in out.stdout and "--budget" not in out.stdout
    assert "likely causes" not in out.stdout and "too few workers" not in out.stdout
    err = out.stderr.strip().splitlines()
    assert err[0] == "Traceback (most recent call last):" and str(SCRIPTS / "faults.py") in err[1]
    assert not any(tool in out.stderr for tool in ("probe.py", "runpy", "course_utils")), out.stderr
    assert err[-1] == "RuntimeError: the model diverged (a loss of nan)"


def test_a_script_that_raises_after_its_loop_was_measured_keeps_the_verdict_and_tries_nothing():
    out = _cli("--budget", "6", str(SCRIPTS / "faults.py"), "--fault", "raise", "--at", "20",
               "--workers", "0")
    assert out.returncode == 1 and "NO VERDICT" not in out.stdout and "(the loop)" in out.stdout
    assert "after 21 batch(es)" in out.stdout and "fixes, each a re-run" not in out.stdout


def test_a_script_that_rejects_diagnoses_options_after_it_is_told_where_they_go():
    out = _cli(str(SCRIPTS / "plain_loop.py"), "--budget", "60")
    assert out.returncode == 2
    assert "unrecognized arguments: --budget 60" in out.stderr           # the script's own usage
    assert "the run ended: the script exited with a usage error" in out.stdout
    note = next(line for line in out.stdout.splitlines() if line.startswith("note: "))
    assert note.startswith("note: the script rejected its arguments (exit 2;")
    assert "--budget 60 went to the script" in note and "diagnose's options go before it" in note
    assert "run it for longer" not in out.stdout


def test_a_module_that_calls_sys_exit_keeps_its_status_and_its_arguments(tmp_path):
    report = tmp_path / "d.json"
    out = _cli("--budget", "3", "--json", str(report), "-m", "faults", "--fault", "exit",
               "--code", "0", "--at", "14", path=[str(SCRIPTS)])
    assert out.returncode == 0, out.stderr
    data = json.loads(report.read_text())
    assert data["baseline"]["end"] == "the script called sys.exit(0)"
    assert data["verdict"] in ("data-bound", "compute-bound") and data["main_loader"] == 0
    run = ds.run_script(str(SCRIPTS / "faults.py"), ["--fault", "exit", "--code", "3"],
                        module=False, budget_s=3)
    assert (run.status, run.end) == (3, "the script called sys.exit(3)")
    assert script_exit_status(ds.ScriptDiagnosis("faults.py", run, "compute-bound", [])) == 3


def test_a_script_that_iterates_no_loader_is_said_in_one_line():
    run = ds.run_script(str(SCRIPTS / "faults.py"), ["--fault", "no-loader"], module=False,
                        budget_s=3)
    assert run.loaders == [] and run.end == "the script ended"
    assert script_exit_status(ds.ScriptDiagnosis("faults.py", run, None, [])) == 2
    assert ds._why_no_figures(run, [], 3.0) == [
        "the script ended after 0 batch(es): give it more data or epochs (its own arguments) so "
        "that a loader has 10 timed after its warm-up"]
    run.status, run.end = 3, "the script called sys.exit(3)"
    assert ds._why_no_figures(run, [], 3.0) == ["the script called sys.exit(3) after 0 batch(es) (exit status 3)"]


def test_a_script_that_starts_ranks_is_out_of_scope(capsys):
    run = ds.run_script(str(SCRIPTS / "faults.py"), ["--fault", "ranks"], module=False, budget_s=3)
    assert run.end == OUT_OF_SCOPE and "starts training ranks of its own" in run.error
    assert script_exit_status(ds.ScriptDiagnosis("faults.py", run, None, [])) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "diagnose times one process" in err


def test_the_exit_status_follows_how_the_run_ended(capsys):
    def status(end, code, error=None, verdict="data-bound"):
        run = ds.ScriptRun("as it is", {}, end, code, error, 1.0, False, [])
        return script_exit_status(ds.ScriptDiagnosis("t.py", run, verdict, []))
    assert status("the budget was spent", 0) == 0 and status("the script ended", 0) == 0
    assert status("the script ended", 0, verdict=None) == 2          # nothing was timed
    assert status("interrupted (Ctrl-C)", 130) == 130
    assert status("the script raised", 1, "Traceback ...\nValueError: x\n") == 1
    assert capsys.readouterr().err.endswith("ValueError: x\n")       # the script's own traceback


def test_a_script_stuck_after_its_loop_is_ended_with_what_was_measured(monkeypatch):
    monkeypatch.setattr(ds, "GRACE_S", 1.0)
    t0 = time.monotonic()
    run = ds.run_script(str(SCRIPTS / "faults.py"), ["--fault", "hang"], module=False, budget_s=2)
    assert time.monotonic() - t0 < 20
    assert run.end == "no batch boundary after the budget"
    assert run.main_loader().raw["batches"] == 32


def _alive_in_group(pgid):
    """Live processes of the process group ``pgid`` (a diagnose run's probe and the workers
    forked from it); a zombie is dead, waiting only for its adopter to collect its status."""
    found = []
    for p in psutil.process_iter(["status"]):
        try:
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(p.pid)
        except (ProcessLookupError, PermissionError):
            pass
    return found


def test_ctrl_c_ends_in_one_line_with_no_process_left():
    proc = subprocess.Popen([sys.executable, "-m", "course_utils", "diagnose", "--budget", "60",
                             str(SCRIPTS / "faults.py"), "--fault", "forever"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)},
                            # a run started in the background (nohup ... &) ignores Ctrl-C and
                            # its children inherit that: the learner's terminal does not
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline, probe = time.monotonic() + 60, None
    while time.monotonic() < deadline and (probe is None or len(_alive_in_group(probe)) < 2):
        time.sleep(0.2)                   # until the script is in its loop, its worker running
        children = psutil.Process(proc.pid).children()
        probe = children[0].pid if children else None
    assert probe is not None and len(_alive_in_group(probe)) >= 2   # the probe and the worker
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1].endswith("interrupted (Ctrl-C); no workers left running."), err
    for _ in range(30):                   # SIGKILL is not instant
        if not (left := _alive_in_group(probe)):
            break
        time.sleep(0.1)
    assert not left, (left, err)


# ---- the whole diagnosis, with its runs faked ---------------------------------------------
class FakeRuns:
    """Stands in for run_script: the baseline's loaders, then one faster run per fix."""

    def __init__(self, baseline, status=0, fix_rate=2.0):
        self.baseline, self.status, self.fix_rate, self.calls = baseline, status, fix_rate, []

    def __call__(self, target, argv, *, module, budget_s, overrides=None, label="as it is"):
        self.calls.append({"budget_s": budget_s, "overrides": overrides, "label": label})
        if overrides is None:                 # the child sees the (patched) CUDA of this process
            return ds.ScriptRun(label, {}, "the budget was spent", self.status,
                                "Traceback\nValueError: x\n" if self.status else None, 1.0,
                                torch.cuda.is_available(), list(self.baseline))
        index, changes = next(iter(overrides.items()))
        r = self.fix_rate
        faster = _stats(index, waits=(0.02 / r - 0.01 * (1 - 1 / r),) * 10, steps=(0.01,) * 10)
        return ds.ScriptRun(label, changes, "the budget was spent", 0, None, 1.0, False, [faster])


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("print('training')\n")
    return str(path)


def test_a_compute_bound_script_is_run_once(monkeypatch, script):
    runs = FakeRuns([_stats(0, waits=(0.001,) * 10, steps=(0.05,) * 10)])
    monkeypatch.setattr(ds, "run_script", runs)
    d = ds.diagnose_script(script, ["--epochs", "1"], budget_s=20, progress=False)
    assert d.verdict == "compute-bound" and d.causes == [] and d.fixes == []
    assert [c["budget_s"] for c in runs.calls] == [10.0]       # half, the other half kept for fixes
    assert d.command == f"{script} --epochs 1"
    runs.calls.clear()
    ds.diagnose_script(script, budget_s=20, tries=[], progress=False)
    assert [c["budget_s"] for c in runs.calls] == [20.0]       # no fixes asked for: all of it


def test_a_data_bound_script_tries_the_default_fixes_on_its_busiest_loader(monkeypatch, script):
    monkeypatch.setattr(ds, "usable_cpus", lambda: 4)
    runs = FakeRuns([_stats(0, waits=(0.001,) * 3, steps=(0.001,) * 3), _stats(1, num_workers=1)])
    monkeypatch.setattr(ds, "run_script", runs)
    d = ds.diagnose_script(script, budget_s=30, progress=False)
    assert d.verdict == "data-bound" and d.main().index == 1
    assert [c["overrides"] for c in runs.calls[1:]] == [{1: t} for t in ds.default_tries(d.main(), False)]
    assert [c["budget_s"] for c in runs.calls] == [15.0, 5.0, 5.0, 5.0]
    assert all(d.gain(r) == pytest.approx(2.0) for r in d.fixes)
    assert d.best_fix() is d.fixes[0]
    text = str(d)
    assert text.startswith(f"diagnose {script}: DATA-BOUND (loader 1 waited 67% of its loop)")
    assert "change: train.py:9: DataLoader(..., persistent_workers=True)  (2.00x samples/s)" in text
    assert "too few workers: num_workers=1 on 4 usable CPUs" in text
    data = json.loads(json.dumps(d.to_dict()))
    assert (data["main_loader"], data["best_fix"], data["verdict"]) == (1, {"persistent_workers": True},
                                                                         "data-bound")
    assert data["data_wait_fraction"] == pytest.approx(2 / 3)
    assert [f["gain"] for f in data["fixes"]] == pytest.approx([2.0, 2.0, 2.0])
    assert "waits_s" not in data["baseline"]["loaders"][1]
    assert data["baseline"]["loaders"][1]["timed_batches"] == 10


def test_fixes_that_do_not_help_are_said_and_not_recommended(monkeypatch, script):
    monkeypatch.setattr(ds, "run_script", FakeRuns([_stats(0)], fix_rate=1.0))
    d = ds.diagnose_script(script, budget_s=30, tries=[{"num_workers": 2}], progress=False)
    assert d.best_fix() is None and d.gain(d.fixes[0]) == pytest.approx(1.0)
    assert "none of the fixes gave more than 1.05x here." in str(d)


@pytest.mark.parametrize("budget, tried", [(2 * ds.MIN_SLICE_S * 2, 2), (2 * ds.MIN_SLICE_S * 2 - 0.1, 1),
                                           (2 * ds.MIN_SLICE_S - 0.1, 0)])
def test_as_many_fixes_run_as_fit_the_budget_in_their_order(monkeypatch, script, budget, tried):
    runs = FakeRuns([_stats(0)])
    monkeypatch.setattr(ds, "run_script", runs)
    d = ds.diagnose_script(script, budget_s=budget, tries=[{"num_workers": 2}, {"num_workers": 3}],
                           progress=False)
    assert [r.changes for r in d.fixes] == [{"num_workers": 2}, {"num_workers": 3}][:tried]
    assert all(c["budget_s"] >= ds.MIN_SLICE_S for c in runs.calls[1:])
    assert sum(c["budget_s"] for c in runs.calls[1:]) == pytest.approx(budget / 2 if tried else 0)
    assert sum(n.startswith("not tried: ") for n in d.notes) == (tried < 2)
    assert ("num_workers=3" in d.notes[0]) == (tried < 2) and ("num_workers=2;" in d.notes[0]) == (tried == 0)


@pytest.mark.parametrize("budget, labels", [
    (8, ["pin_memory=True", "num_workers=8, persistent_workers=True"]),     # the GPU check's budget
    (12, ["pin_memory=True", "num_workers=8, persistent_workers=True",
          "num_workers=1, persistent_workers=True"]),
    (7.9, ["pin_memory=True"])])
def test_on_cuda_with_8_cpus_pin_memory_runs_first_and_every_try_that_fits(monkeypatch, script,
                                                                             budget, labels):
    """N2: three tries of 1.33 s under MIN_SLICE_S used to skip them all; now as many as fit."""
    monkeypatch.setattr(ds, "usable_cpus", lambda: 8)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    runs = FakeRuns([_stats(0, num_workers=0)])            # pin_memory=False, 3 epochs
    monkeypatch.setattr(ds, "run_script", runs)
    d = ds.diagnose_script(script, budget_s=budget, progress=False)
    assert d.baseline.cuda and d.verdict == "data-bound"
    assert [c["label"] for c in runs.calls[1:]] == labels
    assert all(c["budget_s"] >= ds.MIN_SLICE_S for c in runs.calls[1:])
    assert sum(c["budget_s"] for c in runs.calls[1:]) == pytest.approx(budget / 2)
    assert any(n.startswith("not tried: ") for n in d.notes) == (len(labels) < 3)


def test_a_failed_run_tries_no_fix_and_no_loader_gives_no_verdict(monkeypatch, script):
    monkeypatch.setattr(ds, "run_script", FakeRuns([_stats(0)], status=1))
    d = ds.diagnose_script(script, budget_s=30, progress=False)
    assert d.verdict == "data-bound" and d.fixes == [] and script_exit_status(d) == 1
    monkeypatch.setattr(ds, "run_script", FakeRuns([]))
    d = ds.diagnose_script(script, budget_s=30, progress=False)
    assert d.verdict is None and d.main() is None
    assert d.notes == ["no loader had 10 timed batches within 15 s (the budget was spent); run it "
                       "for longer with --budget, or check that it reaches its loop"]
    assert str(d).startswith(f"diagnose {script}: NO VERDICT (no loader had 10 timed batches)")


@pytest.mark.parametrize("budget", [0, -1, float("nan")])
def test_a_budget_must_be_positive(script, budget):
    with pytest.raises(DiagnoseError, match="--budget must be a positive number"):
        ds.diagnose_script(script, budget_s=budget, progress=False)


@pytest.mark.parametrize("threads, batch, cuda, says", [
    ([4], "uint8 (8, 3)", False, "thread pools inside the workers: up to 4"),
    ([3], "uint8 (8, 3)", False, None),
    ([2], "float32 (8, 3, 8, 8)", True, "float32 batches from the loader (float32 (8, 3, 8, 8)); uint8"),
    ([2], "float32 (8, 3, 8, 8)", False, None),          # no device: nothing is copied to one
    ([2], "float32 (8, 10)", True, None),
])
def test_each_cause_comes_from_a_figure(threads, batch, cuda, says):
    stats = _stats(num_workers=8, pin_memory=True)
    stats.raw.update(worker_threads=threads, batch=batch)
    causes = [c for c in ds.likely_causes(stats, cuda=cuda) if not c.startswith("too few")]
    assert (causes == []) if says is None else (len(causes) == 1 and says in causes[0])


def test_a_gain_needs_timed_batches_on_both_sides():
    base, empty = _stats(0), _stats(0, waits=(), steps=())
    d = ds.ScriptDiagnosis("t.py", _run(base), "data-bound", [])
    assert d.gain(_run(_stats(1))) is None                  # the fix's run lacks the loop's loader
    assert d.gain(_run(empty)) is None
    assert ds.ScriptDiagnosis("t.py", _run(empty, _stats(1)), "data-bound", []).gain(_run(base)) is None


def test_a_loader_with_fewer_than_ten_timed_batches_has_no_figures():
    few = _stats(waits=(0.01,) * 9, steps=(0.01,) * 9)
    assert (few.wait_fraction, few.samples_per_s, few.mean_step_s()) == (None, None, None)
    assert few.tail_s() == {"p50": None, "p95": None, "p99": None}
    lines = str(ds.ScriptDiagnosis("t.py", _run(few, _stats(1)), "data-bound", [])).splitlines()
    at = lines.index(next(line for line in lines if line.startswith("loader 0")))
    assert lines[at + 1] == ("  no figures: 13 batch(es), 9 timed after the 2 of warm-up, fewer than "
                             "the 10 a figure needs (a batch is timed once its step has ended)")
    assert lines[at + 2].startswith("loader 1")          # one line, nothing more
    ten = _stats(waits=(0.01, 0.03) * 5, steps=(0.01,) * 10)
    assert ten.tail_s()["p50"] == pytest.approx(0.02)
