"""Run commands as *steps* for gpu-check: each in a process group of its own with a timeout, its
output streamed to the screen and to a log, and every process it started killed when it ends —
also those in sessions of their own (DataLoader workers, torchrun's ranks, a notebook's
children), found by a tag in their environment — so a step that hangs, crashes or times out
costs only its own time and the next step runs. :func:`summary_block` then ends the output:
one line per step, every failure's own lines again, and what the caller adds (targets, files).

Authors' tooling (:mod:`course_authoring.gpu_check` builds the steps), not a learner helper.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import psutil

__all__ = ["Step", "StepResult", "TAG_VAR", "GRACE_S", "KILL_WAIT_S", "POLL_S", "SCAN_S",
           "SUMMARY_CHARS", "step_worst_s", "worst_case_s", "sweep", "failure_lines", "run_step",
           "run_steps", "summary_block"]

#: Every process a step starts carries this variable (a fresh value per step) in its environment.
TAG_VAR = "COURSE_STEP_TAG"
#: Seconds between SIGTERM and SIGKILL when a step runs out of time (a Python process without a
#: SIGTERM handler, pytest and a notebook here included, ends at once on SIGTERM).
GRACE_S = 1.0
#: Seconds the runner waits, after SIGKILL, for the step's processes to go (a process stuck in
#: the kernel, e.g. a CUDA driver call, can outlive SIGKILL: it is then named and left).
KILL_WAIT_S = 1.5
#: The step's timeout is checked every POLL_S seconds, so it can run this much past it.
POLL_S = 0.2
#: Allowance for the process-table scans that find a step's processes by their tag (two on the
#: kill path; about 10 ms each with a few hundred processes).
SCAN_S = 0.3
#: The summary block stays under this many characters (the device tool shows the last 12,000).
SUMMARY_CHARS = 10_000
#: Lines of a step's output that say what went wrong (kept for the summary).
FAILURE_RE = re.compile(r"FAILED|Error\b|error:|Exception\b|Killed|[Tt]imed out|refused|"
                        r"Segmentation fault|core dumped")
MAX_FAILURE_LINES = 10
LINE_CHARS = 300


@dataclass
class Step:
    """One command: ``argv`` run from ``cwd`` with ``env`` added, stopped after ``timeout_s``
    seconds (SIGTERM, then SIGKILL ``grace_s`` later). ``max_cpus``: pin it to that many of this
    process's CPUs (steps that only prove a path works need no more). A step that is not
    ``required`` is shown but does not fail the run. ``where``: a regex for the output line
    that says what was running (named when the step times out)."""

    name: str
    argv: Sequence[str]
    timeout_s: float
    env: dict = field(default_factory=dict)
    max_cpus: int | None = None
    required: bool = True
    grace_s: float = GRACE_S
    where: str | None = None
    cwd: str | None = None


@dataclass
class StepResult:
    """How a step ended: ``status`` is "passed", "failed", "timed out" or "not run";
    ``failures`` its own lines that say why; ``left_behind`` processes killed after it."""

    name: str
    status: str
    seconds: float
    timeout_s: float
    returncode: int | None = None
    failures: list[str] = field(default_factory=list)
    left_behind: int = 0
    required: bool = True

    @property
    def ok(self) -> bool:
        return self.status == "passed" or not self.required

    def to_dict(self) -> dict:
        return {"name": self.name, "status": self.status, "seconds": round(self.seconds, 1),
                "timeout_s": self.timeout_s, "returncode": self.returncode,
                "failures": self.failures, "left_behind": self.left_behind,
                "required": self.required}


def step_worst_s(step: Step) -> float:
    """The longest one step can hold the runner, every escalation of :func:`run_step` counted:
    its timeout, the poll that notices it (``POLL_S``), SIGTERM's grace (``grace_s``), the wait
    after SIGKILL (``KILL_WAIT_S``, shared by the step's group and everything tagged with it,
    leftovers of a step that ended by itself included) and the scans (``SCAN_S``)."""
    return round(step.timeout_s + POLL_S + step.grace_s + KILL_WAIT_S + SCAN_S, 6)


def worst_case_s(steps: Sequence[Step], in_process_s: float = 0.0) -> float:
    """The longest the steps can take (:func:`step_worst_s` each), plus ``in_process_s``."""
    return round(sum(step_worst_s(s) for s in steps) + in_process_s, 6)


def _tagged(tag: str) -> list[psutil.Process]:
    """Every process but this one whose environment holds ``TAG_VAR=tag``."""
    found = []
    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        try:
            if proc.environ().get(TAG_VAR) == tag:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def _signal(procs: Sequence[psutil.Process], sig: int) -> None:
    for proc in procs:
        try:
            proc.send_signal(sig)
        except psutil.Error:
            pass


def sweep(tag: str, wait_s: float = KILL_WAIT_S) -> int:
    """Kill every process whose environment holds ``TAG_VAR=tag`` and wait up to ``wait_s``
    seconds for them to go; how many there were."""
    found = _tagged(tag)
    _signal(found, signal.SIGKILL)
    psutil.wait_procs(found, timeout=wait_s)
    return len(found)


def failure_lines(output: str, limit: int = MAX_FAILURE_LINES) -> list[str]:
    """The last ``limit`` distinct lines of ``output`` that say what went wrong, each cut to
    LINE_CHARS (a traceback's header line is left out: its last line says more)."""
    seen: dict[str, None] = {}
    for line in output.splitlines():
        text = line.strip()
        if text and FAILURE_RE.search(text) and not text.startswith("Traceback (most recent"):
            seen.pop(text[:LINE_CHARS], None)
            seen[text[:LINE_CHARS]] = None
    return list(seen)[-limit:]


def _last_line(output: str, pattern: str | None = None) -> str:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    if pattern is not None:
        lines = [line for line in lines if re.search(pattern, line)] or lines
    return lines[-1][:LINE_CHARS] if lines else "(it printed nothing)"


def _stop(proc: subprocess.Popen, tag: str, grace_s: float) -> int:
    """Stop a step that ran out of time: SIGTERM to its process group and to every process tagged
    with it (those in sessions of their own too), SIGKILL to whatever is left ``grace_s`` later,
    then wait at most ``KILL_WAIT_S`` for all of them. These are all the waits it makes
    (:func:`step_worst_s` counts them); returns how many tagged processes besides the step's own."""
    def signal_all(sig: int, procs: list) -> None:
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        _signal(procs, sig)

    others = [p for p in _tagged(tag) if p.pid != proc.pid]
    signal_all(signal.SIGTERM, others)
    t0 = time.perf_counter()
    alive = [p for p in psutil.wait_procs(others, timeout=grace_s)[1]]
    try:
        proc.wait(timeout=max(0.0, grace_s - (time.perf_counter() - t0)))
        if not alive:
            return len(others)
    except subprocess.TimeoutExpired:
        pass
    late = [p for p in _tagged(tag) if p.pid != proc.pid and p not in others]   # started meanwhile
    signal_all(signal.SIGKILL, alive + late)
    t1 = time.perf_counter()
    psutil.wait_procs(alive + late, timeout=KILL_WAIT_S)
    try:
        proc.wait(timeout=max(0.0, KILL_WAIT_S - (time.perf_counter() - t1)))
    except subprocess.TimeoutExpired:
        pass
    return len(others) + len(late)


def _affinity(max_cpus: int | None) -> Callable[[], None] | None:
    if not max_cpus or not hasattr(os, "sched_getaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))[:max_cpus]
    return lambda: os.sched_setaffinity(0, cpus)


def run_step(step: Step, echo: Callable[[str], None]) -> StepResult:
    """Run one step, streaming its output to ``echo`` as it comes; kill what it leaves behind.

    The output goes to a file, never a pipe: a process left behind cannot block the caller.
    """
    tag = uuid.uuid4().hex
    env = dict(os.environ, **{k: str(v) for k, v in step.env.items()}, **{TAG_VAR: tag})
    t0 = time.perf_counter()
    chunks: list[str] = []
    with tempfile.TemporaryDirectory(prefix="course_step_") as tmp:
        path = Path(tmp) / "output.txt"
        with open(path, "ab") as sink, open(path, "rb") as source:
            def pump() -> None:
                data = source.read()
                if data:
                    text = data.decode("utf-8", "replace")
                    chunks.append(text)
                    echo(text)

            try:
                proc = subprocess.Popen(list(step.argv), stdout=sink, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, env=env, cwd=step.cwd,
                                        start_new_session=True, preexec_fn=_affinity(step.max_cpus))
            except OSError as exc:
                return StepResult(step.name, "failed", time.perf_counter() - t0, step.timeout_s,
                                  failures=[f"could not start {step.argv[0]!r}: {exc}"],
                                  required=step.required)
            timed_out, left = False, 0
            try:
                while proc.poll() is None:
                    pump()
                    if time.perf_counter() - t0 >= step.timeout_s:
                        timed_out = True
                        left = _stop(proc, tag, step.grace_s)
                        break
                    time.sleep(POLL_S)
            finally:
                if proc.poll() is None and not timed_out:   # interrupted (SIGTERM to gpu-check)
                    left = _stop(proc, tag, 0.5)
                # what a step that ended by itself left behind; after _stop: only what outlived
                # SIGKILL, counted without a second wait
                left = max(left, sweep(tag, wait_s=0.0 if timed_out else KILL_WAIT_S))
                pump()
    seconds = time.perf_counter() - t0
    output = "".join(chunks)
    if output and not output.endswith("\n"):
        echo("\n")
    result = StepResult(step.name, "passed", seconds, step.timeout_s, proc.returncode,
                        left_behind=left, required=step.required)
    if timed_out:
        result.status = "timed out"
        result.failures = failure_lines(output) + [
            f"timed out after {step.timeout_s:g} s; it was at: {_last_line(output, step.where)}"]
        if proc.poll() is None:
            result.failures.append(f"pid {proc.pid} was still there {KILL_WAIT_S:g} s after "
                                   f"SIGKILL (stuck in a kernel call?): the next step runs beside it")
    elif proc.returncode != 0:
        result.status = "failed"
        result.failures = failure_lines(output) + [
            f"exit status {proc.returncode}; its last line: {_last_line(output)}"]
    if left:
        echo(f"[{step.name}] killed {left} process(es) it left behind\n")
    return result


class Stopped(Exception):
    """gpu-check itself was told to stop (SIGTERM)."""


def _raise_stopped(signum: int, frame: object) -> None:
    raise Stopped(f"signal {signum}")


def run_steps(steps: Sequence[Step], echo: Callable[[str], None]) -> list[StepResult]:
    """Run every step in order, each whatever the others did; on SIGTERM the running step is
    stopped (and swept) and the rest are "not run"."""
    results: list[StepResult] = []
    previous = signal.signal(signal.SIGTERM, _raise_stopped)
    try:
        for n, step in enumerate(steps):
            echo(f"\n== {step.name} (up to {step.timeout_s:g} s)\n")
            try:
                result = run_step(step, echo)
            except Stopped as exc:
                results += [StepResult(s.name, "not run", 0.0, s.timeout_s,
                                       failures=[f"gpu-check was stopped ({exc}) before or in it"],
                                       required=s.required) for s in steps[n:]]
                break
            results.append(result)
            echo(f"== {step.name}: {result.status} ({result.seconds:.0f} s)\n")
    finally:
        signal.signal(signal.SIGTERM, previous)
    return results


def _status_word(r: StepResult) -> str:
    word = {"passed": "passed", "failed": "FAILED", "timed out": "TIMED OUT",
            "not run": "NOT RUN"}[r.status]
    return word if r.required or r.status == "passed" else f"{word.lower()} (info)"


def summary_block(results: Sequence[StepResult], *, title: str, extra: Sequence[str] = (),
                  limit: int = SUMMARY_CHARS) -> str:
    """The block that ends gpu-check's output: one line per step (status, seconds, limit), every
    failure's lines again, then ``extra`` lines, then the verdict; failure lines are cut so the
    whole block stays under ``limit`` characters."""
    head = [f"{'=' * 20} summary: {title} {'=' * 20}"]
    head += [f"  {_status_word(r):<18}{r.seconds:6.0f} s of {r.timeout_s:4g} s  {r.name}"
             + (f"  [killed {r.left_behind} left behind]" if r.left_behind else "")
             for r in results]
    bad = [r for r in results if not r.ok]
    tail = list(extra) + [
        f"exit status {1 if bad else 0}: "
        + (f"{len(bad)} of {len(results)} steps did not pass: {', '.join(r.name for r in bad)}"
           if bad else f"all {len(results)} steps passed")
        + f" ({sum(r.seconds for r in results):.0f} s in all)"]
    room = limit - sum(len(line) + 1 for line in head + tail) - 200
    failed = [r for r in results if r.failures and r.status != "passed"]
    body: list[str] = []
    for keep in (MAX_FAILURE_LINES + 1, 3, 1):   # fewer lines per step until every step fits
        body = [line for r in failed for line in
                [f"  [{r.name}]"] + [f"    {text}" for text in r.failures[-keep:]]]
        if sum(len(line) + 1 for line in body) <= room:
            break
    if body:
        body.insert(0, "what failed, in each step's own words:")
        cut = False
        while len(body) > 1 and sum(len(line) + 1 for line in body) > room:
            body.pop()
            cut = True
        if cut:
            body.append("  (cut to fit: the full log has every line)")
    return "\n".join(head + body + tail) + "\n"


def echo_to(log_path: str | os.PathLike | None) -> tuple[Callable[[str], None], Callable[[], None]]:
    """An ``echo`` writing to stdout and, when given, to ``log_path`` (created); and its close."""
    log = open(log_path, "w", encoding="utf-8") if log_path else None

    def echo(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()
        if log is not None:
            log.write(text)
            log.flush()

    return echo, (log.close if log is not None else (lambda: None))
