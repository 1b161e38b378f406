"""Lesson 07's sharding checks, from what the ranks actually drew.

* :func:`sharding_report` reads each rank's indices, epoch by epoch, and says whether every index
  came exactly once, which were repeated (the padding ``drop_last=False`` adds), which were
  dropped (``drop_last=True``), and whether the order changed between epochs.
* :func:`simulate_ranks` runs a ``make_loader(dataset, epoch, rank, world_size)`` function for
  every rank in this process, one rank after the other (no processes), giving records in the
  same format as the ranks write.
* :func:`budget` splits the usable cores between ranks and DataLoader workers.
* :class:`IndexDataset` (item ``i`` is ``i``) is what the ranks load; it lives here so ranks
  and their workers import it under every start method. Nothing happens at import time.
"""
from __future__ import annotations

import math
import numbers
import random
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import torch

from ..checks import check_int
from ..machine import usable_cpus


__all__ = [
    "IndexDataset",
    "indices_of",
    "EpochShards",
    "ShardingReport",
    "sharding_report",
    "simulate_ranks",
    "Budget",
    "budget",
]



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
