"""Lesson 07's sharding checks from what the ranks drew, which exercise 07's grader, its solution
and the torchrun ranks (:mod:`course_utils.tools.ddp.rank`) import: :class:`IndexDataset` (item
``i`` is ``i``) and :func:`indices_of`; :func:`sharding_report` (per epoch: every index exactly
once, repeated as ``drop_last=False``'s padding, or dropped; did the order change);
:func:`simulate_ranks` (every rank's loader run here, one after the other, as the ranks record).
"""
from __future__ import annotations

import math
import numbers
import random
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import torch

from ..checks import check_int

__all__ = ["IndexDataset", "indices_of", "EpochShards", "ShardingReport", "sharding_report",
           "simulate_ranks", "shorten"]


class IndexDataset:
    """``n`` items; item ``i`` is the int ``i``: what a rank draws is exactly its indices."""

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
    """What a loader (or sampler) yields as a flat list of ints, in the order drawn (ints,
    tensors/arrays of any shape, and lists/tuples of those)."""
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
        value = tolist()
        if not isinstance(value, list):
            _flatten(value, out)
            return
    if isinstance(value, (list, tuple)):
        for v in value:
            _flatten(v, out)
        return
    raise TypeError(f"a batch held {type(value).__name__} ({value!r:.60}), not indices: the "
                    f"loader should yield batches of the dataset's items (ints).")


@dataclass
class EpochShards:
    """What every rank drew in one loader call. ``per_rank[r]``: rank r's indices in order;
    ``missing``: drawn by no rank; ``repeated``: index -> times, for those drawn more than once;
    ``on_several_ranks``: drawn by more than one rank; ``out_of_range``: not indices 0..n-1."""

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
    def padding(self) -> int:
        """Samples ``DistributedSampler(drop_last=False)`` repeats: ``ceil(n / W) * W - n``."""
        return math.ceil(self.n / self.world_size) * self.world_size - self.n

    @property
    def tail(self) -> int:
        """Samples ``drop_last=True`` drops: ``n % W``."""
        return self.n % self.world_size

    @property
    def extra(self) -> int:
        """Draws beyond one per sample: sum over repeated indices of (times - 1)."""
        return sum(t - 1 for t in self.repeated.values())

    @property
    def equal_counts(self) -> bool:
        return len(set(self.counts)) <= 1

    def verdict(self) -> str:
        """One line: exactly once, once plus padding, drop_last's tail dropped, or what is wrong."""
        clean = not self.out_of_range and self.equal_counts
        if self.out_of_range:
            return f"drew {len(self.out_of_range)} values that are not indices 0..{self.n - 1}"
        if clean and not self.missing and not self.repeated:
            return "every index exactly once"
        if clean and not self.missing and self.extra == self.padding:
            return (f"every index once, plus {self.padding} repeated as padding "
                    f"({sorted(self.repeated)})")
        if clean and not self.repeated and len(self.missing) == self.tail:
            return f"no repeats; the {self.tail} index(es) {self.missing} dropped (drop_last=True)"
        parts = []
        if self.missing:
            parts.append(f"{len(self.missing)} never drawn {shorten(self.missing)}")
        if self.extra:
            parts.append(f"{self.extra} extra draw(s); on several ranks: "
                         f"{shorten(self.on_several_ranks)}")
        if not self.equal_counts:
            parts.append(f"unequal counts {self.counts}")
        return "; ".join(parts) or "ok"


def shorten(xs: list[int], k: int = 8) -> str:
    """The first ``k`` of ``xs`` as "[a, b, ...]"."""
    return "[" + ", ".join(map(str, xs[:k])) + (", ...]" if len(xs) > k else "]")


@dataclass
class ShardingReport:
    """:class:`EpochShards` for every loader call, in call order, and order comparisons."""

    n: int
    world_size: int
    epochs: list[EpochShards]

    def firsts(self) -> list[EpochShards]:
        """The first call of each epoch, by epoch number (later calls are replays)."""
        found: dict[int, EpochShards] = {}
        for e in self.epochs:
            found.setdefault(e.epoch, e)
        return [found[k] for k in sorted(found)]

    def same_order(self, a: int | EpochShards, b: int | EpochShards) -> list[bool]:
        """Per rank: the same indices in the same order in ``a`` and ``b``? (An epoch number
        picks that epoch's first call; pass EpochShards to compare replays.)"""
        def pick(x: int | EpochShards) -> EpochShards:
            if isinstance(x, EpochShards):
                return x
            found = [e for e in self.epochs if e.epoch == x]
            if not found:
                raise KeyError(f"epoch {x} was not recorded; recorded: "
                               f"{sorted({e.epoch for e in self.epochs})}.")
            return found[0]
        return [x == y for x, y in zip(pick(a).per_rank, pick(b).per_rank)]

    @property
    def order_changes_every_epoch(self) -> bool:
        """True when, on every rank, each epoch's order differs from the previous epoch's."""
        firsts = self.firsts()
        return all(not any(self.same_order(x, y)) for x, y in zip(firsts, firsts[1:]))

    def __str__(self) -> str:
        lines = [f"{self.world_size} ranks, {self.n} samples, {len(self.epochs)} epoch(s) recorded"]
        previous: dict[int, EpochShards] = {}
        for e in self.epochs:
            note = ""
            if e.epoch in previous:
                same = self.same_order(previous[e.epoch], e)
                note = " | replay: " + ("same order" if all(same) else "DIFFERENT order")
            elif previous:
                last = list(previous.values())[-1]
                same = self.same_order(last, e)
                note = (f" | vs epoch {last.epoch}: "
                        + ("same order on every rank" if all(same) else "order changed"
                           if not any(same) else
                           f"same order on ranks {[r for r, s in enumerate(same) if s]}"))
            head = ", ".join(str(i) for i in e.per_rank[0][:6])
            lines.append(f"  epoch {e.epoch}: counts {e.counts}; {e.verdict()}; rank 0 starts "
                         f"[{head}, ...]{note}")
            previous.setdefault(e.epoch, e)
        return "\n".join(lines)


def sharding_report(records: Sequence[Mapping], n: int) -> ShardingReport:
    """Check what the ranks drew from a dataset of ``n`` samples. ``records``: one dict per rank::

        {"rank": 0, "world_size": 2, "epochs": [{"epoch": 0, "indices": [5, 17, ...]}, ...]}

    Every rank lists the same epochs in the same order (the i-th entry is one loader call).
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
    missing = [r["rank"] for r in by_rank if "epochs" not in r]
    if missing:
        raise ValueError(f"sharding_report: rank {missing[0]} has no 'epochs' entry.")
    calls = [list(r["epochs"]) for r in by_rank]
    if len({len(c) for c in calls}) != 1:
        raise ValueError(f"sharding_report: ranks recorded different numbers of epochs "
                         f"{[len(c) for c in calls]}; a rank stopped early (see its output).")
    epochs = []
    for i, entries in enumerate(zip(*calls)):
        numbers_ = {int(e["epoch"]) for e in entries}
        if len(numbers_) != 1:
            raise ValueError(f"sharding_report: call {i} is epoch {sorted(numbers_)} on "
                             f"different ranks; every rank must run the same epochs.")
        per_rank = [[int(x) for x in e["indices"]] for e in entries]
        counter = Counter(x for idx in per_rank for x in idx)
        owners = Counter(x for idx in per_rank for x in set(idx))
        epochs.append(EpochShards(
            epoch=numbers_.pop(), n=n, per_rank=per_rank,
            missing=[x for x in range(n) if x not in counter],
            repeated={x: c for x, c in sorted(counter.items()) if c > 1},
            on_several_ranks=sorted(x for x, o in owners.items() if o > 1),
            out_of_range=sorted(x for x in counter if not 0 <= x < n)))
    return ShardingReport(n=n, world_size=len(by_rank), epochs=epochs)


def simulate_ranks(make_loader: Callable, n: int, world_size: int = 2,
                   epochs: Sequence[int] = (0, 1, 2), *, seed: int = 0) -> list[dict]:
    """Run ``make_loader(IndexDataset(n), epoch, rank, world_size)`` for every rank here, one
    after the other, one call per epoch in ``epochs``, drawing the whole loader.

    Each simulated rank starts from the same global RNG state (Python, NumPy and torch seeded
    with ``seed``), as fresh rank processes would; the states are restored afterwards. Returns
    records for :func:`sharding_report`. DataLoader workers still run as processes.
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
            calls = [{"epoch": int(epoch),
                      "indices": indices_of(make_loader(dataset, int(epoch), rank, world_size))}
                     for epoch in epochs]
            records.append({"rank": rank, "world_size": world_size, "epochs": calls})
    finally:
        random.setstate(saved[0])
        np.random.set_state(saved[1])
        torch.random.set_rng_state(saved[2])
    return records
