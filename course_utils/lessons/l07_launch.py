"""Lesson 07's launcher: data loading under DistributedDataParallel, ranks started by torchrun.

:func:`launch` starts ``python -m torch.distributed.run --standalone --nproc-per-node N -m
course_utils.ddp_rank TASK ...`` as a subprocess with a hard timeout (torchrun's process group and every
rank, each in a session of its own, are killed on timeout), collects each rank's result (a JSON file per rank in a temporary folder) and
returns a :class:`DistributedRun`. A crash, a timeout or a busy port raise
:class:`DistributedError` with the tail of the ranks' output; nothing waits for ever. Everything
a rank runs lives in :mod:`course_utils.ddp_rank`. :func:`measure_ddp` times a tiny conv net
under DDP on the course JPEGs. Nothing happens at import time.

Lesson 07 (notebooks/07_scaling_out.ipynb, section 2) writes the mechanism out in full first:
its ``run_torchrun`` starts torchrun in its own session, waits with a timeout, kills torchrun's
group and each rank's when it passes, and reads each rank's output.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import psutil
import torch

from ..checks import check_int, check_seconds
from ..config import pick
from ..measurement import Measurement
from .l07_sharding import budget


__all__ = [
    "TASKS",
    "DistributedError",
    "DistributedRun",
    "pick_backend",
    "launch",
    "DdpMeasurement",
    "measure_ddp",
]


#: Tasks :mod:`course_utils.ddp_rank` knows ("fail" and "sleep" show the error paths).
TASKS = ("sampler", "bench", "learner", "fail", "sleep")
_PACKAGE_PARENT = Path(__file__).resolve().parents[2]
_TAIL_CHARS = 3000


# --------------------------------------------------------------------------------------------
# launching
# --------------------------------------------------------------------------------------------

class DistributedError(RuntimeError):
    """A torchrun launch failed: a rank crashed, the launch timed out, or it could not start.

    ``output`` holds the tail of the ranks' combined output; ``rank_errors`` maps a rank to
    the traceback it wrote (when it got that far).
    """

    def __init__(self, message: str, *, output: str = "", rank_errors: Mapping[int, str] | None = None,
                 timed_out: bool = False) -> None:
        self.output = output
        self.rank_errors = dict(rank_errors or {})
        self.timed_out = timed_out
        super().__init__(message)


@dataclass
class DistributedRun:
    """The result of :func:`launch`: each rank's record (sorted by rank) and the output."""

    task: str
    nproc: int
    backend: str
    config: dict
    ranks: list[dict]
    wall_s: float
    output: str
    command: list[str]

    def records(self, variant: str | None = None) -> list[dict]:
        """Per-rank records for :func:`sharding_report`: the ``sampler`` task's ``variant``
        (its calls become ``"epochs"``), or the records as they are (``variant=None``)."""
        if variant is None:
            return list(self.ranks)
        known = sorted(self.ranks[0].get("variants", {})) if self.ranks else []
        if variant not in known:
            raise KeyError(f"variant {variant!r} was not run; this run has {known}.")
        return [{"rank": r["rank"], "world_size": r["world_size"],
                 "epochs": r["variants"][variant]} for r in self.ranks]

    def __getitem__(self, rank: int) -> dict:
        return self.ranks[rank]

    def __len__(self) -> int:
        return len(self.ranks)

    def __str__(self) -> str:
        return (f"torchrun task {self.task!r}: {self.nproc} rank(s), backend {self.backend}, "
                f"{self.wall_s:.1f} s including start-up")


def pick_backend(nproc: int) -> str:
    """'nccl' when there is a CUDA GPU for every rank and NCCL is built in, else 'gloo'."""
    nproc = check_int("nproc", nproc, 1, "pick_backend")
    try:
        nccl = torch.distributed.is_nccl_available()
    except Exception:  # pragma: no cover - builds without distributed
        nccl = False
    if nccl and torch.cuda.is_available() and torch.cuda.device_count() >= nproc:
        return "nccl"
    return "gloo"


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _tail(text: str, chars: int = _TAIL_CHARS) -> str:
    text = text.strip()
    return text if len(text) <= chars else "...\n" + text[-chars:]


def _kill_group(proc: subprocess.Popen) -> None:
    """End torchrun and every rank/worker it started.

    torchrun starts each rank in a session of its own, so killing torchrun's process group
    does not reach the ranks: their pids are read first (psutil) and each is killed too."""
    try:
        ranks = psutil.Process(proc.pid).children(recursive=True) if proc.poll() is None else []
    except psutil.Error:
        ranks = []
    if proc.poll() is None:
        try:
            if os.name == "posix":
                os.killpg(proc.pid, signal.SIGTERM)
            else:  # pragma: no cover - Windows
                proc.terminate()
            proc.wait(timeout=5)
        except (ProcessLookupError, subprocess.TimeoutExpired, PermissionError):
            pass
    if proc.poll() is None:
        try:
            if os.name == "posix":
                os.killpg(proc.pid, signal.SIGKILL)
            else:  # pragma: no cover
                proc.kill()
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait(timeout=10)
    for rank in ranks:  # ranks (and their workers) that outlived the agent
        try:
            rank.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(ranks, timeout=5)


def launch(task: str, config: Mapping | None = None, *, nproc: int = 2, timeout_s: float = 120,
           backend: str | None = None, port: int | None = None, env: Mapping | None = None,
           pythonpath: Sequence[str] = (), progress: bool = False) -> DistributedRun:
    """Run ``task`` of :mod:`course_utils.ddp_rank` on ``nproc`` ranks with torchrun; wait.

    Lesson 07 shows this launcher in full (its ``run_torchrun``); this version adds the tasks,
    JSON results per rank, the backend choice, SIGTERM before SIGKILL and :class:`DistributedError`.

    ``python -m torch.distributed.run --standalone --nproc-per-node NPROC -m
    course_utils.ddp_rank TASK --config FILE --out DIR`` runs in its own process group.
    ``--standalone`` lets torchrun pick a free port, so launches may run side by side; with
    ``port`` the rendezvous uses that port on localhost instead (checked free first).
    ``backend``: 'gloo' or 'nccl' (default: :func:`pick_backend`). ``env``: extra environment
    variables for the ranks (they inherit this process's environment, quick mode included).
    ``pythonpath``: folders the ranks must import from (prepended to PYTHONPATH).

    The whole group is killed after ``timeout_s`` seconds. Raises :class:`DistributedError`
    with the ranks' output tail when the launch times out, a rank fails, or a rank wrote no
    result; returns a :class:`DistributedRun` otherwise.
    """
    where = "launch"
    if task not in TASKS:
        raise ValueError(f"{where}: task={task!r} is not known; use one of {', '.join(TASKS)}.")
    nproc = check_int("nproc", nproc, 1, where, " It is the number of ranks (processes) to start.")
    timeout_s = check_seconds("timeout_s", timeout_s, where, positive=True)
    if config is not None and not isinstance(config, Mapping):
        raise TypeError(f"{where}: config must be a dict (sent to every rank as JSON), got "
                        f"{type(config).__name__}.")
    config = dict(config or {})
    try:
        payload = json.dumps(config)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{where}: config must hold only JSON values (numbers, strings, lists, "
                        f"dicts, None): {exc}") from exc
    if backend is None:
        backend = pick_backend(nproc)
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"{where}: backend={backend!r}; use 'gloo' (CPU) or 'nccl' (one CUDA GPU "
                         f"per rank), or None to pick.")
    if backend == "nccl" and pick_backend(nproc) != "nccl":
        raise ValueError(f"{where}: backend='nccl' needs NCCL and {nproc} CUDA GPUs; this machine "
                         f"has not got them. Use backend='gloo' (or None).")
    if port is not None:
        port = check_int("port", port, 1, where)
        if port > 65535:
            raise ValueError(f"{where}: port must be 1..65535, got {port}.")
        if not _port_is_free(port):
            raise DistributedError(
                f"{where}: port {port} on localhost is in use by another program, so the ranks "
                f"cannot meet there. Pass port=None (torchrun --standalone picks a free port) "
                f"or another port.")
    if env is not None and not isinstance(env, Mapping):
        raise TypeError(f"{where}: env must be a dict of variable names to strings.")

    tmp = Path(tempfile.mkdtemp(prefix="course_ddp_"))
    try:
        (tmp / "config.json").write_text(payload)
        out_dir = tmp / "out"
        out_dir.mkdir()
        cmd = [sys.executable, "-m", "torch.distributed.run"]
        if port is None:
            cmd += ["--standalone"]
        else:
            cmd += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"localhost:{port}",
                    "--nnodes", "1"]
        cmd += ["--nproc-per-node", str(nproc), "--max-restarts", "0",
                "-m", "course_utils.ddp_rank", task,
                "--config", str(tmp / "config.json"), "--out", str(out_dir),
                "--backend", backend, "--timeout-s", str(timeout_s)]
        child_env = dict(os.environ)
        child_env.update({str(k): str(v) for k, v in (env or {}).items()})
        paths = [str(p) for p in pythonpath] + [str(_PACKAGE_PARENT)]
        if child_env.get("PYTHONPATH"):
            paths.append(child_env["PYTHONPATH"])
        child_env["PYTHONPATH"] = os.pathsep.join(paths)
        child_env.setdefault("PYTHONUNBUFFERED", "1")
        log_path = tmp / "output.log"
        if progress:
            print(f"torchrun: {task} on {nproc} rank(s) ({backend}) ...", flush=True)
        t0 = time.perf_counter()
        with open(log_path, "wb") as log:
            kwargs: dict = {"start_new_session": True} if os.name == "posix" else {
                "creationflags": getattr(subprocess, "CREATE_NEW_PROCESS_GROUP", 0)}
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=child_env, **kwargs)
            timed_out = False
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                _kill_group(proc)
        wall = time.perf_counter() - t0
        output = log_path.read_text(errors="replace")
        errors = {}
        for path in sorted(out_dir.glob("rank*.error.txt")):
            errors[int(path.name[4:].split(".")[0])] = path.read_text(errors="replace")
        if timed_out:
            raise DistributedError(
                f"{where}: torchrun task {task!r} on {nproc} rank(s) did not finish within "
                f"timeout_s={timeout_s:g} s, so the whole process group was killed. A rank is "
                f"stuck (a rank waiting for another that never arrives: rendezvous, a collective "
                f"or a hung DataLoader worker) or the machine is too busy; try a larger "
                f"timeout_s or fewer ranks.\n--- last output ---\n{_tail(output)}",
                output=output, rank_errors=errors, timed_out=True)
        ranks = []
        for r in range(nproc):
            path = out_dir / f"rank{r}.json"
            if path.exists():
                ranks.append(json.loads(path.read_text()))
        if proc.returncode != 0 or len(ranks) != nproc:
            first = ""
            if errors:
                r0 = min(errors)
                first = f"\n--- rank {r0} error ---\n{_tail(errors[r0], 2000)}"
            raise DistributedError(
                f"{where}: torchrun task {task!r} failed (exit code {proc.returncode}; "
                f"{len(ranks)} of {nproc} rank(s) wrote a result"
                + (f"; rank(s) {sorted(errors)} raised an error" if errors else "")
                + f").{first}\n--- last output ---\n{_tail(output)}",
                output=output, rank_errors=errors)
        if progress:
            print(f"torchrun: {task} on {nproc} rank(s) done in {wall:.1f} s", flush=True)
        return DistributedRun(task=task, nproc=nproc, backend=backend, config=config,
                              ranks=ranks, wall_s=wall, output=output, command=cmd)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# --------------------------------------------------------------------------------------------
# measuring data loading + a tiny DDP step on N ranks
# --------------------------------------------------------------------------------------------

@dataclass
class DdpMeasurement:
    """What :func:`measure_ddp` measured on ``nproc`` ranks.

    ``measurement``: a :class:`~course_utils.measurement.Measurement` over all ranks (the timed
    steps split into ``repeats`` chunks; a chunk's time is the slowest rank's; samples are summed
    over ranks), so ``samples_per_s`` is the whole job's rate and ``cpu_s_per_sample`` the CPU of
    every rank and its workers per sample. ``wait_fraction``: per rank, the share of its step
    time spent waiting for the next batch. ``pools``: each rank's thread pools during the run;
    ``pools_at_start``: before the rank changed anything (what torchrun gave it).
    """

    nproc: int
    num_workers: int
    rank_threads: int | None
    backend: str
    measurement: Any
    wait_fraction: list[float]
    pools: list[dict]
    pools_at_start: list[dict]
    omp_env: list[str | None]
    wall_s: float
    ranks: list[dict] = field(repr=False, default_factory=list)

    @property
    def samples_per_s(self) -> float:
        return self.measurement.samples_per_s

    @property
    def cpu_s_per_sample(self) -> float | None:
        return self.measurement.cpu_s_per_sample

    @property
    def label(self) -> str:
        return self.measurement.label

    def __str__(self) -> str:
        waits = ", ".join(f"{w:.0%}" for w in self.wait_fraction)
        cpu = self.cpu_s_per_sample
        return (f"{self.label}: {self.samples_per_s:,.0f} samples/s, "
                f"{'n/a' if cpu is None else f'{cpu * 1e3:.2f} ms'} CPU/sample, data wait per "
                f"rank {waits}; torch threads per rank {[p['torch_intra'] for p in self.pools]} "
                f"(at start {[p['torch_intra'] for p in self.pools_at_start]}, OMP_NUM_THREADS "
                f"{self.omp_env})")


def measure_ddp(nproc: int, num_workers: int | None = None, *, rank_threads: int | str | None = "budget",
                n_images: int | None = None, image_size: int = 64, batch_size: int = 16,
                start_method: str | None = None, repeats: int = 3, timeout_s: float = 300,
                progress: bool = True) -> DdpMeasurement:
    """Train a tiny DDP model for one epoch of JPEGs on ``nproc`` ranks and measure it.

    Each rank decodes its shard (``DistributedSampler``) in ``num_workers`` DataLoader workers
    (default: :func:`budget`'s ``workers_per_rank``; one thread each, ``make_worker_init(1)``)
    and runs a small conv net under ``DistributedDataParallel`` (gloo on CPU, nccl on GPUs).
    ``rank_threads``: torch threads in each rank's main process; ``"budget"`` (default) takes
    :func:`budget`'s ``threads_per_rank``; ``None`` leaves what torchrun gave the rank.
    ``n_images``: the dataset (all ranks together; default 3072, 768 in quick mode).

    The clock starts after ``max(2, 2 * num_workers)`` warm-up steps and stops while the
    workers still hold ``2 * num_workers`` batches ahead (prefetch_factor 2), so batches made
    before the window do not count as free. Each rank's data wait is the time blocked in
    ``next(iterator)`` over its step time, as in :func:`~course_utils.bench.measure_data_wait`.
    """

    where = "measure_ddp"
    nproc = check_int("nproc", nproc, 1, where)
    plan = budget(nproc)
    if num_workers is None:
        num_workers = plan.workers_per_rank
    num_workers = check_int("num_workers", num_workers, 0, where)
    if rank_threads == "budget":
        rank_threads = plan.threads_per_rank
    elif rank_threads is not None:
        rank_threads = check_int("rank_threads", rank_threads, 1, where,
                                " Or pass 'budget', or None to keep what torchrun set.")
    n_images = pick(full=3072, quick=768) if n_images is None else check_int("n_images", n_images, 1, where)
    repeats = check_int("repeats", repeats, 1, where)
    batch_size = check_int("batch_size", batch_size, 1, where)
    image_size = check_int("image_size", image_size, 8, where)
    per_rank_batches = math.ceil(n_images / nproc) // batch_size
    warm = max(2, 2 * num_workers)
    if per_rank_batches - min(warm, per_rank_batches // 2) - 2 * num_workers < 2 * repeats:
        raise ValueError(f"{where}: n_images={n_images} gives each of {nproc} ranks only "
                         f"{per_rank_batches} batches of {batch_size}; pass more n_images.")
    cfg = {"n_images": n_images, "image_size": image_size, "batch_size": batch_size,
           "num_workers": num_workers, "start_method": start_method, "rank_threads": rank_threads,
           "min_side": pick(full=256, quick=192), "max_side": pick(full=512, quick=384),
           "warmup_steps": warm}
    run = launch("bench", cfg, nproc=nproc, timeout_s=timeout_s, progress=progress)
    steps = min(len(r["step_times"]) for r in run.ranks)
    bounds = [round(i * steps / repeats) for i in range(repeats + 1)]
    times, items = [], []
    for a, b in zip(bounds, bounds[1:]):
        times.append(max(sum(r["step_times"][a:b]) for r in run.ranks))
        items.append(sum(sum(r["step_samples"][a:b]) for r in run.ranks))
    # every chunk normalised to the first chunk's sample count
    times = [t * items[0] / n for t, n in zip(times, items)]
    total = sum(r["samples"] for r in run.ranks)
    cpu = sum(r["cpu_s"] for r in run.ranks) / total if total else None
    label = f"{nproc} rank(s) x {num_workers} worker(s)"
    settings = {"ranks": nproc, "num_workers": num_workers, "rank_threads": rank_threads,
                "batch_size": batch_size, "image_size": image_size, "backend": run.backend}
    m = Measurement.from_times(label, times, items[0], cpu_s_per_sample=cpu, settings=settings)
    return DdpMeasurement(
        nproc=nproc, num_workers=num_workers, rank_threads=rank_threads, backend=run.backend,
        measurement=m, wait_fraction=[r["wait_fraction"] for r in run.ranks],
        pools=[r["pools"] for r in run.ranks], pools_at_start=[r["pools_at_start"] for r in run.ranks],
        omp_env=[r["omp_num_threads_env"] for r in run.ranks], wall_s=run.wall_s, ranks=run.ranks)
