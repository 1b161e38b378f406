"""Grader for exercise 07: a ``make_epoch_loader(dataset, epoch, rank, world_size)`` that shards
correctly and reshuffles each epoch.

It runs the function for every rank in this process (:func:`simulate_ranks`; fast, and enough to
find most mistakes), then in 2 ranks started by ``torchrun``: the function's source (and what it
uses from the notebook) goes into a temporary module the ranks import. Both times the dataset is
an ``IndexDataset`` of :data:`N_SAMPLES` items (odd: 2 ranks cannot split it evenly) and the
epochs are :data:`EPOCHS` (epoch 1 twice: a restart replays an epoch). From what the ranks drew:
nothing dropped; no sample twice beyond ``DistributedSampler``'s padding; the same count on every
rank (under DDP a rank with an extra batch waits for ever); a new order every epoch; a replayed
epoch identical.
"""
from __future__ import annotations

import builtins
import dis
import importlib
import inspect
import math
import re
import shutil
import tempfile
import textwrap
import types
import uuid
from pathlib import Path
from typing import Any, Callable

from course_utils.lessons.l07_scaling_out import (ShardingReport, sharding_report, shorten,
                                               simulate_ranks)
from course_utils.tools.ddp.launch import DistributedError, launch

from .checker import CheckResult, ExerciseFailed, grader

SHARDING = "07.sharding"
#: samples in the graded dataset: odd, so 2 ranks need one padding sample
N_SAMPLES = 103
WORLD_SIZE = 2
#: the epochs each rank runs, in order; epoch 1 is replayed
EPOCHS = (0, 1, 2, 1)

_SIMPLE = (int, float, str, bytes, bool, type(None))


def _global_names(code: types.CodeType) -> set[str]:
    """Names the code reads as globals (not attribute names, which share co_names)."""
    names = {ins.argval for ins in dis.get_instructions(code)
             if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME")}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


def _importable(obj: Any) -> tuple[str, str] | None:
    """(module, qualname) when ``obj`` can be imported by name from a real module."""
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    if not module or not qualname or module == "__main__" or "." in qualname or "<" in qualname:
        return None
    try:
        found = getattr(importlib.import_module(module), qualname)
    except Exception:
        return None
    return (module, qualname) if found is obj else None


def function_module_source(fn: Callable, *, exercise: str = SHARDING) -> str:
    """Python source of a module defining ``fn`` as the notebook did: its source, the source of
    the notebook functions it calls, imports for what it uses from installed packages, and the
    numbers/strings it reads. Anything else raises :class:`ExerciseFailed` naming the variable."""
    lines: list[str] = ["# written by the course grader: the learner's function, for the ranks"]
    bodies: list[str] = []
    done: set[int] = set()

    def source_of(f: Callable) -> str:
        try:
            src = inspect.getsource(f)
        except (OSError, TypeError) as exc:
            raise ExerciseFailed(
                exercise, f"the source of {getattr(f, '__name__', f)!r} cannot be found, so it "
                f"cannot be sent to the ranks ({exc}).",
                expected="a function defined with `def` in a notebook cell or a .py file",
                seen=repr(f),
                hint="define it with `def make_epoch_loader(...):` in a cell and run that cell; "
                     "functions made with exec() or typed at a console have no source.") from exc
        return textwrap.dedent(src)

    def add(f: Callable) -> None:
        if id(f) in done:
            return
        done.add(id(f))
        if getattr(f, "__closure__", None):
            raise ExerciseFailed(
                exercise, f"{f.__name__!r} is defined inside another function (it uses "
                f"variables of the enclosing function), so it cannot be sent to the ranks.",
                hint="define it at the top level of a cell; pass what it needs as constants.")
        if f.__name__ == "<lambda>":
            raise ExerciseFailed(exercise, "a lambda cannot be sent to the ranks.",
                                 hint="define the function with `def`.")
        glob = getattr(f, "__globals__", {})
        for name in sorted(_global_names(f.__code__)):
            if name not in glob or name == f.__name__:
                continue
            value = glob[name]
            if isinstance(value, types.ModuleType):
                lines.append(f"import {value.__name__}" if value.__name__ == name
                             else f"import {value.__name__} as {name}")
                continue
            where = _importable(value)
            if where is not None:
                module, qualname = where
                lines.append(f"from {module} import {qualname}" if qualname == name
                             else f"from {module} import {qualname} as {name}")
                continue
            if isinstance(value, types.FunctionType):
                add(value)
                continue
            if isinstance(value, _SIMPLE) or (isinstance(value, tuple)
                                              and all(isinstance(v, _SIMPLE) for v in value)):
                if isinstance(value, float) and not math.isfinite(value):
                    lines.append(f"{name} = float({str(value)!r})")
                else:
                    lines.append(f"{name} = {value!r}")
                continue
            if hasattr(builtins, name):
                continue
            raise ExerciseFailed(
                exercise, f"{f.__name__!r} uses the notebook variable {name!r} "
                f"({type(value).__name__}), which cannot be sent to the ranks.",
                expected="a function that uses only its arguments, imports, numbers/strings "
                         "and other functions of the notebook",
                seen=f"{name} = {value!r:.80}",
                hint=f"build what {name!r} holds inside the function, from its arguments.")
        bodies.append(source_of(f))

    add(fn)
    return "\n".join(dict.fromkeys(lines)) + "\n\n\n" + "\n\n".join(bodies)


def _run_in_ranks(fn: Callable, *, timeout_s: float) -> tuple[list[dict], str]:
    source = function_module_source(fn)
    folder = Path(tempfile.mkdtemp(prefix="course_answer07_"))
    module = f"course_answer07_{uuid.uuid4().hex[:8]}"
    try:
        (folder / f"{module}.py").write_text(source, encoding="utf-8")
        try:
            run = launch("learner", {"module": module, "name": fn.__name__, "n": N_SAMPLES,
                                     "epochs": list(EPOCHS)}, nproc=WORLD_SIZE,
                         timeout_s=timeout_s, backend="gloo", pythonpath=[str(folder)])
        except DistributedError as exc:
            err = next(iter(exc.rank_errors.values()), "")
            if "NotImplementedError" in err:
                raise NotImplementedError from exc
            last = [l for l in err.strip().splitlines() if l.strip()][-1:] or ["(no traceback)"]
            raise ExerciseFailed(
                SHARDING, "make_epoch_loader failed in the ranks started by torchrun.",
                expected="the same result as in this process",
                seen=last[0] if not exc.timed_out else "the ranks did not finish in time",
                hint="the ranks are fresh processes: the function may use only its arguments, "
                     "imports and constants. The ranks' output:\n"
                     + textwrap.indent(str(exc)[-1500:], "      ")) from exc
        return run.ranks, run.backend
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def judge(report: ShardingReport, where: str) -> str:
    """Raise ExerciseFailed for the first rule the ranks' draws break; else a summary."""
    n, world = report.n, report.world_size
    pad = math.ceil(n / world) * world - n
    for e in report.epochs:
        if e.out_of_range:
            raise ExerciseFailed(
                SHARDING, f"{where}: epoch {e.epoch} drew values that are not indices of the "
                f"dataset (0..{n - 1}).", expected="the dataset's items (IndexDataset: item i is i)",
                seen=shorten(e.out_of_range), hint="iterate the dataset through a DataLoader; "
                "do not return the sampler's positions shifted or the batch numbers.")
        if e.missing:
            counts = e.counts
            if not e.repeated and len(e.missing) == e.tail and e.equal_counts:
                hint = (f"each rank took {n // world} = len(dataset) // world_size samples, so "
                        f"the {e.tail} that do not divide evenly between {world} ranks are lost, "
                        f"different ones every epoch. That is what drop_last=True (or slicing "
                        f"with len(dataset) // world_size) does; keep drop_last=False - "
                        f"DistributedSampler then repeats {pad} sample(s) instead.")
            elif all(c == n // world for c in counts) or sum(counts) < n:
                hint = (f"{n} samples over {world} ranks is {n / world:g} each: a rank that takes "
                        f"len(dataset) // world_size loses the rest. Round up instead, and pad "
                        f"with repeated samples, as DistributedSampler does.")
            else:
                hint = ("every rank must shuffle with the same seed and take its own slice of "
                        "the same permutation; DistributedSampler does exactly that when every "
                        "rank gives it the same seed.")
            raise ExerciseFailed(
                SHARDING, f"{where}: in epoch {e.epoch}, {len(e.missing)} of {n} samples were "
                f"never drawn by any rank.",
                expected=f"every sample at least once per epoch across the {world} ranks",
                seen=f"never drawn: {shorten(e.missing)}; samples per rank {counts}", hint=hint)
        if e.extra > pad:
            if all(len(set(x)) >= n for x in e.per_rank):
                hint = ("every rank iterates the whole dataset: a DataLoader(shuffle=True) per "
                        "rank is not sharded. Each rank needs its own shard: a sampler that "
                        "knows how many ranks there are and which one this is.")
            else:
                hint = ("the shards overlap: check the slice bounds (one past the end takes "
                        "the next rank's first sample), and that all ranks use the same "
                        "permutation (same seed). DistributedSampler takes every world_size-th "
                        "index starting at rank.")
            raise ExerciseFailed(
                SHARDING, f"{where}: in epoch {e.epoch} the shards overlap: {e.extra} draws "
                f"beyond one per sample, {len(e.on_several_ranks)} sample(s) on more than one rank.",
                expected=f"disjoint shards; at most {pad} sample(s) repeated as padding "
                         f"({n} samples, {world} ranks)",
                seen=f"drawn by several ranks: {shorten(e.on_several_ranks)}; samples per rank "
                     f"{e.counts}", hint=hint)
        if not e.equal_counts:
            raise ExerciseFailed(
                SHARDING, f"{where}: in epoch {e.epoch} the ranks drew different numbers of "
                f"samples.", expected=f"the same number on every rank ({math.ceil(n / world)})",
                seen=f"samples per rank {e.counts}"
                     + (f"; drawn more than once: {shorten(sorted(e.repeated))}" if e.repeated else ""),
                hint="under DDP every step all-reduces gradients across ranks: a rank with one "
                     "more batch waits for ever for the others. Split by rounding up and pad "
                     "with repeated samples, as DistributedSampler(drop_last=False) does.")
    order = report.firsts()
    for a, b in zip(order, order[1:]):
        same = report.same_order(a, b)
        if any(same):
            ranks = [r for r, s in enumerate(same) if s]
            # in index order (DistributedSampler's padding, if any, comes last)
            sorted_ = all(x[:-1] == sorted(x[:-1]) for x in a.per_rank)
            if sorted_:
                hint = ("the samples come in index order: shuffle=False. DistributedSampler "
                        "shuffles by default, with its seed and the epoch you give it "
                        "(set_epoch).")
            else:
                hint = ("DistributedSampler shuffles with seed + epoch, and the epoch is 0 until "
                        "you call sampler.set_epoch(epoch); without it every epoch repeats the "
                        "first one's order.")
            raise ExerciseFailed(
                SHARDING, f"{where}: epochs {a.epoch} and {b.epoch} drew the same samples in the "
                f"same order on rank(s) {ranks}.",
                expected="a new order every epoch (the same seed, a different epoch)",
                seen=f"rank {ranks[0]} in epoch {a.epoch}: {shorten(a.per_rank[ranks[0]])}; in "
                     f"epoch {b.epoch}: {shorten(b.per_rank[ranks[0]])}", hint=hint)
    firsts = {e.epoch: e for e in order}
    for e in report.epochs:
        first = firsts[e.epoch]
        if e is first:
            continue
        same = report.same_order(first, e)
        if not all(same):
            r = same.index(False)
            raise ExerciseFailed(
                SHARDING, f"{where}: epoch {e.epoch}, asked for a second time, gave a different "
                f"order on rank {r}.",
                expected="the same order whenever the same epoch is asked for (a run resumed "
                         "from a checkpoint replays it)",
                seen=f"first time {shorten(first.per_rank[r])}; second time {shorten(e.per_rank[r])}",
                hint="derive the shuffle from a fixed seed and the epoch, not from the global RNG "
                     "or a call counter.")
    e0 = report.epochs[0]
    return (f"{n} samples over {world} ranks: every sample once per epoch ({pad} repeated as "
            f"padding), disjoint shards of {e0.counts[0]}, a new order every epoch, a replayed "
            f"epoch identical")


@grader(SHARDING)
def grade_sharding(make_epoch_loader: Any, *, torchrun: bool = True,
                   timeout_s: float = 180) -> CheckResult:
    """Grade ``make_epoch_loader(dataset, epoch, rank, world_size)`` (see the module docstring).
    ``torchrun=False`` skips the real run (the in-process simulation only; used in tests)."""
    if not callable(make_epoch_loader) or isinstance(make_epoch_loader, type):
        raise ExerciseFailed(
            SHARDING, "the answer is not a function.",
            expected="make_epoch_loader, a function (dataset, epoch, rank, world_size) -> loader",
            seen=f"{type(make_epoch_loader).__name__}: {make_epoch_loader!r:.80}",
            hint="pass the function itself: check('07.sharding', make_epoch_loader) - no "
                 "parentheses after its name.")
    try:
        params = list(inspect.signature(make_epoch_loader).parameters.values())
    except (TypeError, ValueError):
        params = None
    if params is not None and len(params) < 4 and not any(p.kind == p.VAR_POSITIONAL for p in params):
        names = [p.name for p in params]
        raise ExerciseFailed(
            SHARDING, f"make_epoch_loader takes {len(names)} argument(s) {names}.",
            expected="4 arguments: (dataset, epoch, rank, world_size)", seen=str(names),
            hint="the grader calls make_epoch_loader(dataset, epoch, rank, world_size).")
    records = None
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
        if not (torchrun and isinstance(exc, (RuntimeError, ValueError))
                and "process group" in str(exc)):
            raise ExerciseFailed(SHARDING, f"make_epoch_loader raised {type(exc).__name__}: {exc}",
                                 expected="a loader for (dataset, epoch, rank, world_size=2)",
                                 hint="call it yourself with rank=0 and rank=1 and read the "
                                      "error.") from exc
    details: dict = {"simulated": records}
    where = "in this process"
    if records is not None:
        summary = judge(sharding_report(records, N_SAMPLES),
                        "simulated ranks (called one after the other in this process)")
    if torchrun:
        ranks, backend = _run_in_ranks(make_epoch_loader, timeout_s=timeout_s)
        summary = judge(sharding_report(ranks, N_SAMPLES), f"{WORLD_SIZE} ranks started by torchrun")
        details["ranks"] = ranks
        where = f"in {WORLD_SIZE} ranks under torchrun ({backend})"
    return CheckResult(SHARDING, f"{summary} - {where}.", details)
