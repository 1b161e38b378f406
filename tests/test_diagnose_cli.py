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

from course_utils.__main__ import script_exit_status, split_diagnose_argv
from course_utils.tools.diagnose import DiagnoseError
from course_utils.tools.diagnose import script as ds
from course_utils.tools.diagnose.probe import OUT_OF_SCOPE

SCRIPTS = Path(__file__).parent / "diagnose_scripts"
ROOT = Path(__file__).resolve().parents[1]


def _cli(*args, path=(), timeout=120):
    """The command, with ``path`` on PYTHONPATH beside the course (for ``-m MODULE``)."""
    return subprocess.run([sys.executable, "-m", "course_utils", "diagnose", "--no-progress", *args],
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *path])})


# ---- the command line --------------------------------------------------------------------
@pytest.mark.parametrize("argv, ours, theirs", [
    (["diagnose", "train.py", "--budget", "3"], ["diagnose", "train.py"], ["--budget", "3"]),
    (["diagnose", "--budget", "3", "--try", "num_workers=2", "train.py", "-x"],
     ["diagnose", "--budget", "3", "--try", "num_workers=2", "train.py"], ["-x"]),
    (["diagnose", "--budget=3", "-m", "pkg.train", "--lr", "1"],
     ["diagnose", "--budget=3", "-m", "pkg.train"], ["--lr", "1"]),
    (["diagnose", "--no-progress", "--bogus", "train.py"],
     ["diagnose", "--no-progress", "--bogus", "train.py"], []),
    (["diagnose", "pkg.train:make_loop", "--budget", "3"],
     ["diagnose", "pkg.train:make_loop", "--budget", "3"], []),
])
def test_everything_after_the_script_is_the_scripts(argv, ours, theirs):
    assert split_diagnose_argv(argv) == (ours, theirs)


@pytest.mark.parametrize("text, expected", [
    ("num_workers=4", {"num_workers": 4}),
    ("num_workers=0,pin_memory=true", {"num_workers": 0, "pin_memory": True}),
    ("persistent_workers=False, prefetch_factor=4", {"persistent_workers": False, "prefetch_factor": 4}),
])
def test_try_reads_key_value_changes(text, expected):
    assert ds.parse_try(text) == expected


@pytest.mark.parametrize("text, says", [
    ("workers=4", "KEY=VALUE"), ("num_workers", "KEY=VALUE"), ("num_workers=four", "whole number"),
    ("pin_memory=yes", "true or false"), ("batch_size=0", "too small"), ("num_workers=-1", "too small"),
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
                           "worker_cpu_s": 1.0, "workers_seen": 1, "worker_threads": [2],
                           "gpu_busy": None})


def _run(*loaders, label="as it is", changes=None):
    return ds.ScriptRun(label, changes or {}, "the budget was spent", 0, None, 2.0, False,
                        list(loaders))


def test_the_busiest_loader_is_the_loop():
    small = _stats(0, waits=(0.01,) * 3, steps=(0.01,) * 3)
    big = _stats(1)
    assert _run(small, big).main_loader() is big
    assert _run(_stats(0, waits=(), steps=())).main_loader() is None
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


def test_default_fixes_and_causes_follow_the_settings(monkeypatch):
    monkeypatch.setattr(ds, "usable_cpus", lambda: 4)
    stats = _stats(num_workers=1)
    assert ds.default_tries(stats, cuda=False) == [      # its 3 epochs restarted the workers
        {"persistent_workers": True}, {"num_workers": 2, "persistent_workers": True},
        {"num_workers": 4, "persistent_workers": True}]
    assert ds.default_tries(_stats(num_workers=0, persistent_workers=False), cuda=False)[0] == {
        "num_workers": 1, "persistent_workers": True}
    assert {"pin_memory": True} in ds.default_tries(_stats(num_workers=4), cuda=True)
    assert ds.default_tries(_stats(num_workers=8, persistent_workers=True), cuda=False) == []
    causes = " ".join(ds.likely_causes(stats, cuda=True))
    assert "num_workers=1 on 4" in causes and "restart every epoch" in causes and "unpinned" in causes
    assert ds.likely_causes(_stats(num_workers=4, persistent_workers=True, pin_memory=True),
                            cuda=True) == []


# ---- whole runs: the script's own endings ----------------------------------------------
def test_a_script_that_raises_reports_then_shows_its_traceback():
    out = _cli("--budget", "6", str(SCRIPTS / "faults.py"), "--fault", "raise")
    assert out.returncode == 1
    assert "loader 0 (the loop)" in out.stdout and "the run ended: the script raised" in out.stdout
    assert out.stderr.rstrip().endswith("RuntimeError: the model diverged (a loss of nan)")


def test_a_module_that_calls_sys_exit_keeps_its_status_and_its_arguments(tmp_path):
    report = tmp_path / "d.json"
    out = _cli("--budget", "3", "--json", str(report), "-m", "faults", "--fault", "exit",
               "--code", "0", path=[str(SCRIPTS)])
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
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
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
