"""Data loading under DistributedDataParallel: launch ranks with ``torchrun``, check sharding.

Everything a rank runs lives in :mod:`course_utils.ddp_rank`, so ranks (separate processes
started by ``torchrun``) and their DataLoader workers import it under ``fork``, ``forkserver``
and ``spawn`` alike. This module is the notebook's side:

* :func:`launch` starts ``python -m torch.distributed.run --standalone --nproc-per-node N -m
  course_utils.ddp_rank TASK ...`` as a subprocess with a hard timeout (the whole process group
  is killed on timeout), collects each rank's result (a JSON file per rank in a temporary
  folder) and returns a :class:`DistributedRun`. A crash, a timeout or a busy port raise
  :class:`DistributedError` with the tail of the ranks' output; nothing waits for ever.
* :func:`sharding_report` reads what each rank actually drew, epoch by epoch, and says whether
  every index came exactly once, which were repeated (the padding ``drop_last=False`` adds),
  which were dropped (``drop_last=True``), and whether the order changed between epochs.
* :func:`budget` splits the usable cores between ranks and DataLoader workers.
* :func:`simulate_ranks` runs a ``make_loader(dataset, epoch, rank, world_size)`` function for
  every rank in this process, one rank after the other (no processes), giving records in the
  same format as the ranks write.

Nothing happens at import time.
"""
from __future__ import annotations

import json
import math
import numbers
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from .checks import check_int, check_seconds

__all__ = [
    "DistributedError",
    "DistributedRun",
    "launch",
    "pick_backend",
    "Budget",
    "budget",
    "IndexDataset",
    "EpochShards",
    "ShardingReport",
    "sharding_report",
    "simulate_ranks",
    "indices_of",
    "DdpMeasurement",
    "measure_ddp",
]

#: Tasks :mod:`course_utils.ddp_rank` knows ("fail" and "sleep" show the error paths).
TASKS = ("sampler", "bench", "learner", "fail", "sleep")
_PACKAGE_PARENT = Path(__file__).resolve().parents[1]
_TAIL_CHARS = 3000


# --------------------------------------------------------------------------------------------
# arguments
# --------------------------------------------------------------------------------------------

# --------------------------------------------------------------------------------------------
# the dataset every sharding experiment uses
# --------------------------------------------------------------------------------------------

class IndexDataset:
    """``n`` items; item ``i`` is the int ``i``. What a rank draws is then exactly its indices.

    A map-style dataset (``__len__`` and ``__getitem__``), importable, so DataLoader workers
    can use it under every start method.
    """

    def __init__(self, n: int) -> None:
        self.n = check_int("n", n, 1, "IndexDataset")

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        i = int(i)
        if not 0 <= i < self.n:
            raise IndexError(f"IndexDataset: index {i} out of range 0..{self.n - 1}.")
        return i

    def __repr__(self) -> str:
        return f"IndexDataset(n={self.n})"


def indices_of(batches: Iterable) -> list[int]:
    """Flatten what a loader (or sampler) yields into a list of ints, in the order drawn.

    Accepts ints, tensors/arrays of any shape, lists/tuples of those, and batches that are
    ``(data, label)`` pairs only when the data are the indices themselves (IndexDataset).
    """
    out: list[int] = []
    for batch in batches:
        _flatten(batch, out)
    return out


def _flatten(value: Any, out: list[int]) -> None:
    if isinstance(value, bool):
        raise TypeError(f"a batch held a bool ({value!r}), not an index of the dataset.")
    if isinstance(value, numbers.Integral):
        out.append(int(value))
        return
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        flat = tolist()
        if isinstance(flat, list):
            for v in flat:
                _flatten(v, out)
        else:
            _flatten(flat, out)
        return
    if isinstance(value, (list, tuple)):
        for v in value:
            _flatten(v, out)
        return
    raise TypeError(f"a batch held {type(value).__name__} ({value!r:.60}), not indices: the "
                    f"loader should yield batches of the dataset's items (ints).")


# --------------------------------------------------------------------------------------------
# sharding: what the ranks drew
# --------------------------------------------------------------------------------------------

@dataclass
class EpochShards:
    """What every rank drew in one epoch (one call of the loader per rank).

    ``per_rank[r]``: rank r's indices in the order drawn; ``missing``: indices no rank drew;
    ``repeated``: index -> times drawn, for those drawn more than once (by any ranks);
    ``on_several_ranks``: indices drawn by more than one rank; ``padding``: the samples
    ``DistributedSampler(drop_last=False)`` repeats so every rank gets the same number
    (``ceil(n / W) * W - n``); ``tail``: the samples ``drop_last=True`` drops (``n % W``).
    """

    epoch: int
    n: int
    per_rank: list[list[int]]
    missing: list[int]
    repeated: dict[int, int]
    on_several_ranks: list[int]
    out_of_range: list[int]

    @property
    def world_size(self) -> int:
        return len(self.per_rank)

    @property
    def counts(self) -> list[int]:
        return [len(x) for x in self.per_rank]

    @property
    def total(self) -> int:
        return sum(self.counts)

    @property
    def padding(self) -> int:
        return math.ceil(self.n / self.world_size) * self.world_size - self.n

    @property
    def tail(self) -> int:
        return self.n % self.world_size

    @property
    def extra(self) -> int:
        """Draws beyond one per sample: sum over repeated indices of (times - 1)."""
        return sum(t - 1 for t in self.repeated.values())

    @property
    def equal_counts(self) -> bool:
        return len(set(self.counts)) <= 1

    @property
    def exactly_once(self) -> bool:
        """Every index drawn exactly once across ranks (only possible when W divides n)."""
        return not self.missing and not self.repeated and not self.out_of_range

    @property
    def once_with_padding(self) -> bool:
        """Every index at least once, equal counts, and only ``padding`` extra draws: what
        ``DistributedSampler(drop_last=False)`` gives."""
        return (not self.missing and not self.out_of_range and self.equal_counts
                and self.extra == self.padding)

    @property
    def once_without_tail(self) -> bool:
        """No repeats, equal counts, exactly ``tail`` indices dropped: ``drop_last=True``."""
        return (not self.repeated and not self.out_of_range and self.equal_counts
                and len(self.missing) == self.tail)

    def verdict(self) -> str:
        if self.out_of_range:
            return f"drew {len(self.out_of_range)} values that are not indices 0..{self.n - 1}"
        if self.exactly_once and self.equal_counts:
            return "every index exactly once"
        if self.once_with_padding:
            return (f"every index once, plus {self.padding} repeated as padding "
                    f"({sorted(self.repeated)})")
        if self.once_without_tail:
            return (f"no repeats; the {self.tail} index(es) {self.missing} dropped "
                    f"(drop_last=True)")
        parts = []
        if self.missing:
            shown = ", ".join(map(str, self.missing[:8])) + (", ..." if len(self.missing) > 8 else "")
            parts.append(f"{len(self.missing)} never drawn [{shown}]")
        if self.extra:
            several = self.on_several_ranks
            shown = ", ".join(map(str, several[:8])) + (", ..." if len(several) > 8 else "")
            parts.append(f"{self.extra} extra draw(s); on several ranks: [{shown}]")
        if not self.equal_counts:
            parts.append(f"unequal counts {self.counts}")
        return "; ".join(parts) or "ok"

    def to_dict(self) -> dict:
        out = asdict(self)
        out["repeated"] = {str(k): v for k, v in self.repeated.items()}
        return out


@dataclass
class ShardingReport:
    """:class:`EpochShards` for every loader call, in call order, and order comparisons."""

    n: int
    world_size: int
    epochs: list[EpochShards]

    def calls(self, epoch: int) -> list[EpochShards]:
        """Every call made for ``epoch`` (an epoch may be replayed, e.g. after a restart)."""
        found = [e for e in self.epochs if e.epoch == epoch]
        if not found:
            raise KeyError(f"epoch {epoch} was not recorded; recorded: "
                           f"{sorted({e.epoch for e in self.epochs})}.")
        return found

    def same_order(self, a: int | EpochShards, b: int | EpochShards) -> list[bool]:
        """Per rank: did rank r draw the same indices in the same order in ``a`` and ``b``?
        (Epoch numbers pick their first call; pass EpochShards to compare replays.)"""
        ea = a if isinstance(a, EpochShards) else self.calls(a)[0]
        eb = b if isinstance(b, EpochShards) else self.calls(b)[0]
        return [x == y for x, y in zip(ea.per_rank, eb.per_rank)]

    @property
    def order_changes_every_epoch(self) -> bool:
        """True when, for every rank, each epoch's order differs from the previous epoch's."""
        firsts: dict[int, EpochShards] = {}
        for e in self.epochs:
            firsts.setdefault(e.epoch, e)
        ordered = [firsts[k] for k in sorted(firsts)]
        return all(not any(self.same_order(x, y)) for x, y in zip(ordered, ordered[1:]))

    def __str__(self) -> str:
        lines = [f"{self.world_size} ranks, {self.n} samples, {len(self.epochs)} epoch(s) recorded"]
        previous: dict[int, EpochShards] = {}
        for e in self.epochs:
            head = ", ".join(str(i) for i in e.per_rank[0][:6]) if e.per_rank else ""
            note = ""
            if e.epoch in previous:
                same = self.same_order(previous[e.epoch], e)
                note = " | replay: " + ("same order" if all(same) else "DIFFERENT order")
            elif previous:
                last = list(previous.values())[-1]
                same = self.same_order(last, e)
                note = (f" | vs epoch {last.epoch}: "
                        + ("same order on every rank" if all(same) else
                           "order changed" if not any(same) else f"same order on ranks "
                           f"{[r for r, s in enumerate(same) if s]}"))
            lines.append(f"  epoch {e.epoch}: counts {e.counts}; {e.verdict()}; rank 0 starts "
                         f"[{head}, ...]{note}")
            previous.setdefault(e.epoch, e)
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"n": self.n, "world_size": self.world_size,
                "epochs": [e.to_dict() for e in self.epochs]}


def sharding_report(records: Sequence[Mapping], n: int, *, key: str = "epochs") -> ShardingReport:
    """Check what the ranks drew. ``records``: one dict per rank, as the ranks write them::

        {"rank": 0, "world_size": 2, "epochs": [{"epoch": 0, "indices": [5, 17, ...]}, ...]}

    Every rank must list the same epochs in the same order (the i-th entry of each rank is
    one loader call). ``key`` names the list (a rank may record several variants).
    """
    n = check_int("n", n, 1, "sharding_report", " Pass the length of the dataset the ranks drew from.")
    if isinstance(records, Mapping) or not isinstance(records, Sequence) or not records:
        raise ValueError("sharding_report: records must be a non-empty list with one dict per "
                         "rank (e.g. DistributedRun.ranks).")
    by_rank = sorted(records, key=lambda r: int(r.get("rank", 0)))
    ranks = [int(r.get("rank", -1)) for r in by_rank]
    if ranks != list(range(len(by_rank))):
        raise ValueError(f"sharding_report: records must come from ranks 0..{len(by_rank) - 1}, "
                         f"one each; got ranks {ranks}.")
    calls = []
    for r in by_rank:
        if key not in r:
            raise ValueError(f"sharding_report: rank {r.get('rank')} has no {key!r} entry; "
                             f"its keys are {sorted(r)}.")
        calls.append(list(r[key]))
    lengths = {len(c) for c in calls}
    if len(lengths) != 1:
        raise ValueError(f"sharding_report: ranks recorded different numbers of epochs "
                         f"{[len(c) for c in calls]}; a rank stopped early (see its output).")
    world = len(by_rank)
    epochs = []
    for i in range(lengths.pop()):
        entries = [c[i] for c in calls]
        numbers_ = {int(e["epoch"]) for e in entries}
        if len(numbers_) != 1:
            raise ValueError(f"sharding_report: call {i} is epoch {sorted(numbers_)} on "
                             f"different ranks; every rank must run the same epochs.")
        per_rank = [[int(x) for x in e["indices"]] for e in entries]
        counter: Counter = Counter()
        owners: dict[int, set] = {}
        for rank, idx in enumerate(per_rank):
            counter.update(idx)
            for x in idx:
                owners.setdefault(x, set()).add(rank)
        out_of_range = sorted(x for x in counter if not 0 <= x < n)
        epochs.append(EpochShards(
            epoch=numbers_.pop(), n=n, per_rank=per_rank,
            missing=[x for x in range(n) if x not in counter],
            repeated={x: c for x, c in sorted(counter.items()) if c > 1},
            on_several_ranks=sorted(x for x, o in owners.items() if len(o) > 1),
            out_of_range=out_of_range))
    return ShardingReport(n=n, world_size=world, epochs=epochs)


def simulate_ranks(make_loader: Callable, n: int, world_size: int = 2,
                   epochs: Sequence[int] = (0, 1, 2), *, seed: int = 0) -> list[dict]:
    """Run ``make_loader(dataset, epoch, rank, world_size)`` for every rank here, no processes.

    Each simulated rank starts from the same global RNG state (Python, NumPy and torch seeded
    with ``seed``), as fresh rank processes would, and makes one call per epoch in ``epochs``
    (in that order), drawing the whole loader. The global RNG states are restored afterwards.
    Returns records in the format of :func:`sharding_report`. DataLoader workers the loader
    starts do run (as processes) — this only replaces the ranks.
    """
    import numpy as np
    import torch

    if not callable(make_loader):
        raise TypeError(f"simulate_ranks: make_loader must be a function (dataset, epoch, rank, "
                        f"world_size) -> loader, got {type(make_loader).__name__}.")
    world_size = check_int("world_size", world_size, 1, "simulate_ranks")
    dataset = IndexDataset(n)
    saved = (random.getstate(), np.random.get_state(), torch.random.get_rng_state())
    records = []
    try:
        for rank in range(world_size):
            random.seed(seed)
            np.random.seed(seed)
            torch.manual_seed(seed)
            calls = []
            for epoch in epochs:
                loader = make_loader(dataset, int(epoch), rank, world_size)
                calls.append({"epoch": int(epoch), "indices": indices_of(loader)})
            records.append({"rank": rank, "world_size": world_size, "epochs": calls})
    finally:
        random.setstate(saved[0])
        np.random.set_state(saved[1])
        torch.random.set_rng_state(saved[2])
    return records


# --------------------------------------------------------------------------------------------
# the budget: cores / ranks / workers
# --------------------------------------------------------------------------------------------

@dataclass
class Budget:
    """How ``cores`` CPUs are shared by ``ranks`` training processes and their workers.

    Each rank gets ``cores_per_rank = cores // ranks``. One of those runs the rank's main
    process (training loop, collating received batches, DDP communication); the rest run
    DataLoader workers of one thread each: ``workers_per_rank = cores_per_rank - 1``. When a
    rank has a single core it loads data itself (``workers_per_rank = 0``) and
    ``threads_per_rank`` is its one core. ``processes`` counts every busy process
    (ranks × (1 + workers)).
    """

    cores: int
    ranks: int
    cores_per_rank: int
    workers_per_rank: int
    threads_per_rank: int
    threads_per_worker: int = 1
    notes: list[str] = field(default_factory=list)

    @property
    def processes(self) -> int:
        return self.ranks * (1 + self.workers_per_rank)

    def load(self, workers_per_rank: int | None = None) -> float:
        """Busy processes per core for ``workers_per_rank`` (default: the budget's own)."""
        w = self.workers_per_rank if workers_per_rank is None else check_int(
            "workers_per_rank", workers_per_rank, 0, "Budget.load")
        return self.ranks * (1 + w) / self.cores

    def to_dict(self) -> dict:
        out = asdict(self)
        out["processes"] = self.processes
        return out

    def __str__(self) -> str:
        head = (f"{self.cores} cores / {self.ranks} rank(s) = {self.cores_per_rank} core(s) per "
                f"rank: ")
        if self.workers_per_rank:
            body = (f"1 for the rank's main process ({self.threads_per_rank} torch thread) + "
                    f"{self.workers_per_rank} DataLoader worker(s) of {self.threads_per_worker} "
                    f"thread each; {self.processes} busy processes on {self.cores} cores")
        else:
            body = (f"no room for workers: each rank loads its own data (num_workers=0) with "
                    f"{self.threads_per_rank} torch thread(s)")
        return head + body + "".join(f"\n  note: {n}" for n in self.notes)


def budget(ranks: int, cores: int | None = None) -> Budget:
    """Split ``cores`` (default: the usable CPUs here) between ``ranks`` ranks and their workers.

    ``budget(2)`` on this machine; ``budget(8, cores=96)`` for an 8-GPU node with 96 cores.
    """
    ranks = check_int("ranks", ranks, 1, "budget", " One rank per GPU (or per process on CPU).")
    if cores is None:
        from .machine import usable_cpus

        cores = usable_cpus()
    cores = check_int("cores", cores, 1, "budget", " Pass the usable CPUs of the node.")
    notes = []
    per_rank = cores // ranks
    if per_rank == 0:
        notes.append(f"more ranks ({ranks}) than cores ({cores}): the ranks share cores; "
                     f"expect every rank to run slower than alone.")
        per_rank = 1
    workers = per_rank - 1
    threads = 1 if workers else per_rank
    left = cores - ranks * per_rank
    if left > 0 and cores >= ranks:
        notes.append(f"{left} core(s) left over ({cores} is not a multiple of {ranks}); they "
                     f"absorb the system and the torchrun agent.")
    return Budget(cores=cores, ranks=ranks, cores_per_rank=per_rank, workers_per_rank=workers,
                  threads_per_rank=threads, notes=notes)


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
    import torch

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
    """End torchrun and every rank/worker it started (its own process group/session)."""
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
    if os.name == "posix":  # ranks that outlived the agent
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def launch(task: str, config: Mapping | None = None, *, nproc: int = 2, timeout_s: float = 120,
           backend: str | None = None, port: int | None = None, env: Mapping | None = None,
           pythonpath: Sequence[str] = (), progress: bool = False) -> DistributedRun:
    """Run ``task`` of :mod:`course_utils.ddp_rank` on ``nproc`` ranks with torchrun; wait.

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

    ``measurement``: a :class:`~course_utils.bench.Measurement` over all ranks (the timed steps
    split into ``repeats`` chunks; a chunk's time is the slowest rank's; samples are summed over
    ranks), so ``samples_per_s`` is the whole job's rate and ``cpu_s_per_sample`` the CPU of
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
    from .bench import Measurement
    from .config import pick

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
