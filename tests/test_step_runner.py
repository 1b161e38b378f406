"""The step runner under gpu-check: each step bounded by its timeout, what it leaves behind
killed (also processes in sessions of their own), failures kept in its own words, and a
summary that ends the output and fits the device tool's last 12,000 characters."""
from __future__ import annotations

import os
import signal
import sys
import threading
import time

import psutil
import pytest

from course_authoring import step_runner
from course_authoring.step_runner import (SUMMARY_CHARS, TAG_VAR, Step, StepResult, failure_lines,
                                          run_step, run_steps, step_worst_s, summary_block, sweep,
                                          worst_case_s)

pytestmark = pytest.mark.timeout(120)
PY = sys.executable


def _py(code: str) -> list[str]:
    return [PY, "-c", code]


def _run(step: Step) -> tuple[StepResult, str]:
    seen: list[str] = []
    return run_step(step, seen.append), "".join(seen)


def test_a_passing_step_streams_its_output():
    result, out = _run(Step("hello", _py("print('hello'); import sys; print('err', file=sys.stderr)"), 30))
    assert result.status == "passed" and result.returncode == 0 and result.ok
    assert "hello" in out and "err" in out and result.failures == []


def test_a_failing_step_keeps_its_own_words():
    code = "print('working'); raise RuntimeError('CUDA error: out of memory (stand-in)')"
    result, out = _run(Step("broken", _py(code), 30))
    assert result.status == "failed" and result.returncode == 1 and not result.ok
    assert "RuntimeError: CUDA error: out of memory (stand-in)" in result.failures
    assert result.failures[-1].startswith("exit status 1; its last line: RuntimeError")
    assert "Traceback (most recent call last):" not in result.failures


def test_a_step_that_cannot_start_is_a_failure_not_a_crash():
    result, _ = _run(Step("missing", ["no-such-command-here"], 5, required=False))
    assert result.status == "failed" and "could not start" in result.failures[0]
    assert result.ok                                      # not required: it does not fail the run


def test_a_step_out_of_time_is_stopped_and_says_where_it_was():
    code = "import time\nprint('--- nb cell 3: slow()', flush=True)\nprint('tick', flush=True)\ntime.sleep(60)"
    t0 = time.perf_counter()
    result, _ = _run(Step("slow", _py(code), 3, grace_s=1, where=r"^--- .* cell \d+"))
    assert time.perf_counter() - t0 < 3 + 1 + 5
    assert result.status == "timed out" and not result.ok
    assert result.failures[-1] == "timed out after 3 s; it was at: --- nb cell 3: slow()"


def test_a_step_that_ignores_sigterm_is_killed_after_the_grace():
    code = ("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "print('stubborn', flush=True)\ntime.sleep(60)")
    step = Step("stubborn", _py(code), 2, grace_s=1)
    t0 = time.perf_counter()
    result, _ = _run(step)
    assert result.status == "timed out" and time.perf_counter() - t0 < step_worst_s(step) + 1


def test_a_stuck_step_and_its_stubborn_orphan_cost_at_most_the_counted_worst_case(tmp_path):
    # the step and a grandchild in a session of its own both ignore SIGTERM: the whole kill
    # path runs (SIGTERM to both, the grace, SIGKILL to both, the wait), once
    pid_file = tmp_path / "orphan.pid"
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"
    code = (f"import signal, subprocess, sys, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            f"p = subprocess.Popen([sys.executable, '-c', {stubborn!r}], start_new_session=True)\n"
            f"open({str(pid_file)!r}, 'w').write(str(p.pid))\nprint('stuck', flush=True)\ntime.sleep(120)")
    step = Step("stuck", _py(code), 3, grace_s=1)
    t0 = time.perf_counter()
    result, _ = _run(step)
    elapsed = time.perf_counter() - t0
    assert result.status == "timed out" and result.left_behind == 1
    pid = int(pid_file.read_text())
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert elapsed < step_worst_s(step) + 1            # 3 + 0.2 + 1 + 1.5 + 0.3, and start-up slack


def _orphan_code(pid_file) -> str:
    # a grandchild in a session of its own (as torchrun's ranks and notebook children are),
    # still holding the step's output: killing the step's group cannot reach it
    return (f"import subprocess, sys, time\n"
            f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], "
            f"start_new_session=True)\n"
            f"open({str(pid_file)!r}, 'w').write(str(p.pid))\nprint('left it running', flush=True)")


def test_what_a_step_leaves_behind_in_its_own_session_is_killed(tmp_path):
    pid_file = tmp_path / "orphan.pid"
    result, out = _run(Step("leaves one", _py(_orphan_code(pid_file)), 30))
    assert result.status == "passed" and result.left_behind == 1
    assert "killed 1 process(es) it left behind" in out
    pid = int(pid_file.read_text())
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_sweep_finds_processes_by_their_tag_only():
    mine = psutil.Popen([PY, "-c", "import time; time.sleep(60)"], env=dict(os.environ, **{TAG_VAR: "t1"}))
    other = psutil.Popen([PY, "-c", "import time; time.sleep(60)"], env=dict(os.environ, **{TAG_VAR: "t2"}))
    try:
        deadline = time.time() + 10
        while time.time() < deadline and mine.environ().get(TAG_VAR) != "t1":
            time.sleep(0.05)
        assert sweep("t1") == 1
        assert not mine.is_running() and other.is_running()
    finally:
        other.kill()
        other.wait()


def test_steps_run_whatever_the_others_did():
    steps = [Step("fails", _py("raise SystemExit(3)"), 20), Step("passes", _py("print('ok')"), 20)]
    results = run_steps(steps, lambda text: None)
    assert [(r.name, r.status, r.returncode) for r in results] == [("fails", "failed", 3),
                                                                    ("passes", "passed", 0)]


def test_sigterm_stops_the_running_step_and_the_rest_are_not_run(tmp_path):
    steps = [Step("long", _py("import time; print('started', flush=True); time.sleep(60)"), 50),
             Step("after", _py("print('never')"), 20)]
    timer = threading.Timer(2.0, lambda: os.kill(os.getpid(), signal.SIGTERM))
    timer.start()
    t0 = time.perf_counter()
    try:
        results = run_steps(steps, lambda text: None)
    finally:
        timer.cancel()
    assert time.perf_counter() - t0 < 20
    assert [r.status for r in results] == ["not run", "not run"]
    assert "stopped" in results[0].failures[0]
    assert signal.getsignal(signal.SIGTERM) is not None


def test_failure_lines_keep_the_last_distinct_ones():
    text = "\n".join(["Traceback (most recent call last):", "ok line"]
                     + [f"ValueError: bad {i}" for i in range(15)] + ["ValueError: bad 14"])
    lines = failure_lines(text)
    assert lines == [f"ValueError: bad {i}" for i in range(5, 15)]
    assert failure_lines("x" * 1000 + " Error")[0] == "x" * 300


def test_worst_case_counts_every_escalation_of_the_kill_path():
    # by hand: the poll that notices the timeout, SIGTERM's grace, the wait after SIGKILL and the
    # process-table scans, for each step, then what runs outside the steps
    assert (step_runner.POLL_S, step_runner.KILL_WAIT_S, step_runner.SCAN_S) == (0.2, 1.5, 0.3)
    steps = [Step("a", ["a"], 10, grace_s=2), Step("b", ["b"], 25.5, grace_s=1)]
    assert step_worst_s(steps[0]) == 10 + 0.2 + 2 + 1.5 + 0.3 == 14.0
    assert step_worst_s(steps[1]) == 25.5 + 0.2 + 1 + 1.5 + 0.3 == 28.5
    assert worst_case_s(steps, 7) == 14.0 + 28.5 + 7 == 49.5
    assert step_runner.GRACE_S == 1.0 and step_worst_s(Step("default grace", ["c"], 5)) == 8.0


def _result(name: str, status: str, failures=(), required=True) -> StepResult:
    return StepResult(name, status, 12.0, 30, 1 if status == "failed" else 0, list(failures),
                      required=required)


def test_the_summary_names_every_step_and_fits_whatever_the_failures():
    huge = [f"RuntimeError: line {i} " + "x" * 280 for i in range(10)]
    results = [_result(f"step {i}", "failed", huge) for i in range(40)]
    results += [_result("fine", "passed"), _result("info", "failed", ["nope"], required=False)]
    block = summary_block(results, title="test", extra=["targets:", "  [MET    ] t"])
    assert len(block) <= SUMMARY_CHARS
    for i in range(40):
        assert f"FAILED                12 s of   30 s  step {i}\n" in block
    assert "failed (info)" in block and "passed" in block
    assert "(cut to fit: the full log has every line)" in block
    assert block.rstrip().splitlines()[-1].startswith("exit status 1: 40 of 42 steps did not pass")
    assert block.index("targets:") > block.index("what failed")


def test_the_summary_of_a_clean_run():
    block = summary_block([_result("a", "passed"), _result("b", "passed")], title="t")
    assert "what failed" not in block
    assert block.rstrip().splitlines()[-1] == "exit status 0: all 2 steps passed (24 s in all)"
