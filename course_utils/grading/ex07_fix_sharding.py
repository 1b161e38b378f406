"""Grader for exercise 07: ``make_epoch_loader`` run for every rank in this process, then in 2
torchrun ranks that import it from the exercise's ``%%writefile`` module. From what they drew: nothing
dropped, nothing twice beyond padding, equal counts, a new order every epoch, a replayed epoch identical."""
from __future__ import annotations

import math
import os
import re
import sys
import textwrap
from typing import Any, Callable

from course_utils.lessons.l07_scaling_out import (ShardingReport, sharding_report, shorten, simulate_ranks)
from course_utils.tools.ddp.launch import DistributedError, launch

from .checker import CheckResult, ExerciseFailed, describe, grader, require_signature

SHARDING = "07.sharding"
#: samples in the graded dataset: odd, so 2 ranks need one padding sample
N_SAMPLES = 103
WORLD_SIZE = 2
#: the epochs each rank runs, in order; epoch 1 is replayed
EPOCHS = (0, 1, 2, 1)


def module_of(fn: Callable) -> tuple[str, str]:
    """(module name, folder to import it from) for a function the ranks can import by name."""
    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    path = getattr(module, "__file__", None)
    if module is None or module.__name__ == "__main__" or not path \
            or getattr(module, fn.__name__, None) is not fn:
        raise ExerciseFailed(
            SHARDING, "the ranks cannot import make_epoch_loader: it is not a top-level function "
                      "of a module.",
            expected="make_epoch_loader defined with `def` in the module the %%writefile cell "
                     "writes (exercise07_sharding.py), and imported from it",
            seen=f"{getattr(fn, '__qualname__', fn)!r} in {getattr(fn, '__module__', None)!r}",
            hint="the ranks are fresh processes: they import your function by its module and "
                 "name (lesson 00, deep dive 7: where the code workers run must live). Run the "
                 "%%writefile cell, then the cell that imports the function from it.")
    return module.__name__, os.path.dirname(os.path.abspath(path))


def _run_in_ranks(fn: Callable, *, timeout_s: float) -> tuple[list[dict], str]:
    """What each torchrun rank drew, importing ``fn`` from its module; and the backend."""
    module, folder = module_of(fn)
    try:
        run = launch("learner", {"module": module, "name": fn.__name__, "n": N_SAMPLES,
                                 "epochs": list(EPOCHS)}, nproc=WORLD_SIZE,
                     timeout_s=timeout_s, backend="gloo", pythonpath=[folder])
    except DistributedError as exc:
        err = next(iter(exc.rank_errors.values()), "")
        if "NotImplementedError" in err:
            raise NotImplementedError from exc
        last = [l for l in err.strip().splitlines() if l.strip()][-1:] or ["(no traceback)"]
        raise ExerciseFailed(
            SHARDING, "make_epoch_loader failed in the ranks started by torchrun.",
            expected="the same result as in this process",
            seen=last[0] if not exc.timed_out else "the ranks did not finish in time",
            hint="the ranks are fresh processes that import your module: it must hold "
                 "everything the function uses. The ranks' output:\n"
                 + textwrap.indent(str(exc)[-1500:], "      ")) from exc
    return run.ranks, run.backend


def judge(report: ShardingReport, where: str) -> str:
    """Raise ExerciseFailed for the first rule the ranks' draws break; else a summary."""
    n, world = report.n, report.world_size
    pad = math.ceil(n / world) * world - n

    def fail(problem: str, **kw: str) -> ExerciseFailed:
        return ExerciseFailed(SHARDING, f"{where}: {problem}", **kw)

    for e in report.epochs:
        if e.out_of_range:
            raise fail(f"epoch {e.epoch} drew values that are not indices of the dataset "
                       f"(0..{n - 1}).", expected="the dataset's items (IndexDataset: item i is i)",
                       seen=shorten(e.out_of_range), hint="iterate the dataset through a "
                       "DataLoader; do not return the sampler's positions shifted or batch numbers.")
        if e.missing:
            if not e.repeated and len(e.missing) == e.tail and e.equal_counts:
                hint = (f"each rank took {n // world} = len(dataset) // world_size samples, so "
                        f"the {e.tail} that do not divide evenly between {world} ranks are lost, "
                        f"different ones every epoch. That is what drop_last=True (or slicing "
                        f"with len(dataset) // world_size) does; keep drop_last=False - "
                        f"DistributedSampler then repeats {pad} sample(s) instead.")
            elif all(c == n // world for c in e.counts) or sum(e.counts) < n:
                hint = (f"{n} samples over {world} ranks is {n / world:g} each: a rank that takes "
                        f"len(dataset) // world_size loses the rest. Round up instead, and pad "
                        f"with repeated samples, as DistributedSampler does.")
            else:
                hint = ("every rank must shuffle with the same seed and take its own slice of "
                        "the same permutation, as DistributedSampler does with one seed.")
            raise fail(f"in epoch {e.epoch}, {len(e.missing)} of {n} samples were never drawn "
                       f"by any rank.", hint=hint,
                       expected=f"every sample at least once per epoch across the {world} ranks",
                       seen=f"never drawn: {shorten(e.missing)}; samples per rank {e.counts}")
        if e.extra > pad:
            raise fail(f"in epoch {e.epoch} the shards overlap: {e.extra} draws beyond one per "
                       f"sample, {len(e.on_several_ranks)} sample(s) on more than one rank.",
                       expected=f"disjoint shards; at most {pad} sample(s) repeated as padding "
                                f"({n} samples, {world} ranks)",
                       seen=f"drawn by several ranks: {shorten(e.on_several_ranks)}; samples "
                            f"per rank {e.counts}",
                       hint="every rank iterates the whole dataset: a DataLoader(shuffle=True) "
                            "per rank is not sharded. Each rank needs its own shard: a sampler "
                            "that knows how many ranks there are and which one this is."
                       if all(len(set(x)) >= n for x in e.per_rank) else
                       "the shards overlap: check the slice bounds (one past the end takes the "
                       "next rank's first sample), and that all ranks use the same permutation "
                       "(same seed). DistributedSampler takes every world_size-th index from rank.")
        if not e.equal_counts:
            raise fail(f"in epoch {e.epoch} the ranks drew different numbers of samples.",
                       expected=f"the same number on every rank ({math.ceil(n / world)})",
                       seen=f"samples per rank {e.counts}" + (
                           f"; drawn more than once: {shorten(sorted(e.repeated))}" if e.repeated else ""),
                       hint="under DDP every step all-reduces gradients: a rank with one more "
                            "batch makes an all-reduce the others do not; it waits for them at most "
                            "the process group's timeout, then fails (or meets their next one). "
                            "Round up and pad with repeats, as DistributedSampler(drop_last=False).")
    order = report.firsts()
    for a, b in zip(order, order[1:]):
        ranks = [r for r, same in enumerate(report.same_order(a, b)) if same]
        if ranks:
            r = ranks[0]
            raise fail(f"epochs {a.epoch} and {b.epoch} drew the same samples in the same order "
                       f"on rank(s) {ranks}.",
                       expected="a new order every epoch (the same seed, a different epoch)",
                       seen=f"rank {r} in epoch {a.epoch}: {shorten(a.per_rank[r])}; in epoch "
                            f"{b.epoch}: {shorten(b.per_rank[r])}",
                       # in index order (DistributedSampler's padding, if any, comes last)
                       hint="the samples come in index order: shuffle=False. DistributedSampler "
                            "shuffles by default, with its seed and the epoch you give it "
                            "(set_epoch)." if all(x[:-1] == sorted(x[:-1]) for x in a.per_rank)
                       else "DistributedSampler shuffles with seed + epoch, and the epoch is 0 "
                            "until you call sampler.set_epoch(epoch); without it every epoch "
                            "repeats the first one's order.")
    firsts = {e.epoch: e for e in order}
    for e in report.epochs:
        first, same = firsts[e.epoch], report.same_order(firsts[e.epoch], e)
        if e is not first and not all(same):
            r = same.index(False)
            raise fail(f"epoch {e.epoch}, asked for a second time, gave a different order on "
                       f"rank {r}.", expected="the same order whenever the same epoch is asked "
                                              "for (a run resumed from a checkpoint replays it)",
                       seen=f"first time {shorten(first.per_rank[r])}; second time {shorten(e.per_rank[r])}",
                       hint="derive the shuffle from a fixed seed and the epoch, not from the "
                            "global RNG or a call counter.")
    return (f"{n} samples over {world} ranks: every sample once per epoch ({pad} repeated as "
            f"padding), disjoint shards of {report.epochs[0].counts[0]}, a new order every epoch, "
            f"a replayed epoch identical")


@grader(SHARDING)
def grade_sharding(make_epoch_loader: Any, *, torchrun: bool = True, timeout_s: float = 180) -> CheckResult:
    """Grade ``make_epoch_loader``; ``torchrun=False``: the in-process simulation only."""
    expected = "make_epoch_loader(dataset, epoch, rank, world_size) -> loader"
    if isinstance(make_epoch_loader, type):        # a class such as DataLoader is callable too
        raise ExerciseFailed(SHARDING, "the answer is not a function.", expected=expected,
                             seen=describe(make_epoch_loader))
    require_signature(SHARDING, make_epoch_loader, "make_epoch_loader does not take 4 arguments.",
                      expected, 0, 0, 0, 2)
    records = summary = None
    try:
        records = simulate_ranks(make_epoch_loader, N_SAMPLES, WORLD_SIZE, EPOCHS)
    except NotImplementedError:
        raise
    except Exception as exc:
        if isinstance(exc, TypeError) and re.search(
                r"not indices|held a bool|is not iterable|object is not", str(exc)):
            raise ExerciseFailed(
                SHARDING, "what make_epoch_loader returned is not a loader of the dataset's items.",
                expected="an iterable of batches of indices, e.g. a DataLoader over the dataset",
                seen=str(exc), hint="return the DataLoader (do not iterate it yourself).") from exc
        # e.g. DistributedSampler(dataset) reading the rank from the process group: only real
        # ranks can run it, so the real run below decides
        if not (torchrun and isinstance(exc, (RuntimeError, ValueError)) and "process group" in str(exc)):
            raise ExerciseFailed(SHARDING, f"make_epoch_loader raised {type(exc).__name__}: {exc}",
                                 expected="a loader for (dataset, epoch, rank, world_size=2)",
                                 hint="call it yourself with rank=0 and rank=1 and read the error.") from exc
    details, where = {"simulated": records}, "in this process"
    if records is not None:
        summary = judge(sharding_report(records, N_SAMPLES),
                        "simulated ranks (called one after the other in this process)")
    if torchrun:
        details["ranks"], backend = _run_in_ranks(make_epoch_loader, timeout_s=timeout_s)
        summary = judge(sharding_report(details["ranks"], N_SAMPLES),
                        f"{WORLD_SIZE} ranks started by torchrun")
        where = f"in {WORLD_SIZE} ranks under torchrun ({backend})"
    return CheckResult(SHARDING, f"{summary} - {where}.", details)
