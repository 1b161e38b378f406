"""Lesson 07's launcher (its ``run_torchrun`` grown up): ``torchrun`` ranks running
:mod:`~course_utils.tools.ddp.rank`, a JSON result per rank, SIGTERM before SIGKILL, DistributedError."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import psutil
import torch

from course_utils.checks import check_int, check_seconds

__all__ = ["TASKS", "DistributedError", "DistributedRun", "pick_backend", "launch"]

#: The tasks :mod:`course_utils.tools.ddp.rank` runs (its header says what each records).
TASKS = ("sampler", "bench", "learner", "fail")
_PACKAGE_PARENT = Path(__file__).resolve().parents[3]


class DistributedError(RuntimeError):
    """A torchrun launch failed: a rank crashed, the launch timed out, or it could not start.
    ``output``: the ranks' combined output; ``rank_errors``: rank -> the traceback it wrote."""

    def __init__(self, message: str, *, output: str = "", rank_errors: Mapping[int, str] | None = None,
                 timed_out: bool = False) -> None:
        super().__init__(message)
        self.output, self.rank_errors, self.timed_out = output, dict(rank_errors or {}), timed_out


@dataclass
class DistributedRun:
    """What :func:`launch` returns: each rank's record (by rank), seconds with start-up, output."""

    task: str
    nproc: int
    backend: str
    ranks: list[dict]
    wall_s: float
    output: str

    def __str__(self) -> str:
        return (f"torchrun task {self.task!r}: {self.nproc} rank(s), backend {self.backend}, "
                f"{self.wall_s:.1f} s including start-up")


def pick_backend(nproc: int) -> str:
    """'nccl' when NCCL is built in and there is a CUDA GPU for each of ``nproc`` ranks, else 'gloo'.
    Runs to be compared pass the largest ``nproc`` of them, so that all use one backend."""
    nccl = torch.distributed.is_available() and torch.distributed.is_nccl_available()
    return "nccl" if nccl and torch.cuda.is_available() and torch.cuda.device_count() >= nproc else "gloo"


def _tail(text: str, chars: int = 3000) -> str:
    return text.strip() if len(text.strip()) <= chars else "...\n" + text.strip()[-chars:]


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if os.name == "posix":
            os.killpg(proc.pid, sig)
        else:  # Windows: no process groups to signal
            proc.terminate() if sig == signal.SIGTERM else proc.kill()


def _kill_group(proc: subprocess.Popen) -> None:
    """End torchrun and every rank/worker it started. torchrun starts each rank in a session of
    its own, so killing torchrun's group does not reach them: their pids are read first."""
    ranks = []
    with contextlib.suppress(psutil.Error):
        ranks = psutil.Process(proc.pid).children(recursive=True) if proc.poll() is None else []
    if proc.poll() is None:
        _signal_group(proc, signal.SIGTERM)  # torchrun stops its ranks itself
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            _signal_group(proc, signal.SIGKILL)
            proc.wait(timeout=10)
    for rank in ranks:  # ranks (and their workers) that outlived the agent
        with contextlib.suppress(psutil.Error):
            rank.kill()
    psutil.wait_procs(ranks, timeout=5)


def launch(task: str, config: Mapping | None = None, *, nproc: int = 2, timeout_s: float = 120,
           backend: str | None = None, pythonpath: Sequence[str] = ()) -> DistributedRun:
    """Run ``task`` (one of :data:`TASKS`) on ``nproc`` ranks with ``torchrun --standalone`` (a free
    port) in its own process group, and wait; each rank reads ``config`` (JSON), writes its record.
    ``backend``: 'gloo' or 'nccl' (default :func:`pick_backend`); ``pythonpath``: the ranks' import
    folders; killed after ``timeout_s``; a timeout, failed rank or missing record: DistributedError."""
    where = "launch"    # every error names the function
    if task not in TASKS:
        raise ValueError(f"{where}: task={task!r} is not known; use one of {', '.join(TASKS)}.")
    nproc = check_int("nproc", nproc, 1, where, " It is the number of ranks (processes) to start.")
    timeout_s = check_seconds("timeout_s", timeout_s, where, positive=True)
    if config is not None and not isinstance(config, Mapping):
        raise TypeError(f"{where}: config must be a dict (sent to every rank as JSON), got "
                        f"{type(config).__name__}.")
    try:
        payload = json.dumps(dict(config or {}))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{where}: config must hold only JSON values (numbers, strings, lists, "
                        f"dicts, None): {exc}") from exc
    backend = backend or pick_backend(nproc)
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"{where}: backend={backend!r}; use 'gloo' (CPU) or 'nccl' (one CUDA GPU "
                         f"per rank), or None to pick.")
    if backend == "nccl" and pick_backend(nproc) != "nccl":
        raise ValueError(f"{where}: backend='nccl' needs NCCL and {nproc} CUDA GPUs; this machine "
                         f"has not got them. Use backend='gloo' (or None).")

    tmp = Path(tempfile.mkdtemp(prefix="course_ddp_"))
    out_dir, log_path = tmp / "out", tmp / "output.log"
    try:
        (tmp / "config.json").write_text(payload)
        out_dir.mkdir()
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", str(nproc), "--max-restarts", "0",
               "-m", "course_utils.tools.ddp.rank", task, "--config", str(tmp / "config.json"),
               "--out", str(out_dir), "--backend", backend, "--timeout-s", str(timeout_s)]
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env["PYTHONPATH"] = os.pathsep.join([*map(str, pythonpath), str(_PACKAGE_PARENT)]
                                            + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        t0 = time.perf_counter()
        with open(log_path, "wb") as log:
            group = {"start_new_session": True} if os.name == "posix" else {
                "creationflags": getattr(subprocess, "CREATE_NEW_PROCESS_GROUP", 0)}
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=env, **group)
            timed_out = False
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                _kill_group(proc)
        wall = time.perf_counter() - t0
        output = log_path.read_text(errors="replace")
        errors = {int(p.name[4:].split(".")[0]): p.read_text(errors="replace")
                  for p in sorted(out_dir.glob("rank*.error.txt"))}
        if timed_out:
            raise DistributedError(
                f"{where}: torchrun task {task!r} on {nproc} rank(s) did not finish within "
                f"timeout_s={timeout_s:g} s, so its process group was killed: a rank waits for "
                f"one that never comes (rendezvous, a collective, a hung worker) or the machine "
                f"is too busy; try a larger timeout_s.\n--- last output ---\n{_tail(output)}",
                output=output, rank_errors=errors, timed_out=True)
        ranks = [json.loads(p.read_text()) for r in range(nproc)
                 for p in [out_dir / f"rank{r}.json"] if p.exists()]
        if proc.returncode != 0 or len(ranks) != nproc:
            first = (f"\n--- rank {min(errors)} error ---\n{_tail(errors[min(errors)], 2000)}"
                     if errors else "")
            raise DistributedError(
                f"{where}: torchrun task {task!r} failed (exit code {proc.returncode}; "
                f"{len(ranks)} of {nproc} rank(s) wrote a result"
                + (f"; rank(s) {sorted(errors)} raised an error" if errors else "")
                + f").{first}\n--- last output ---\n{_tail(output)}",
                output=output, rank_errors=errors)
        return DistributedRun(task=task, nproc=nproc, backend=backend, ranks=ranks, wall_s=wall,
                              output=output)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
