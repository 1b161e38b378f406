"""``python -m course_authoring gpu-check``: measure the GPU lessons on a real CUDA machine.

On a machine with CUDA this runs, within a time budget (default 540 s):

1. lesson 04's GPU benchmarks (:func:`course_authoring.gpu_lesson04.run_lesson04`, full mode):
   copy bandwidth pageable / pinned / device-to-device, naive vs honest timing, copy/compute
   overlap, uint8 vs float32, the prefetcher, pin_memory in a DataLoader, the forked-worker
   error;
2. lesson 05's (``course_authoring.gpu_lesson05.run_lesson05``, full mode): on-device vs
   per-sample CPU augmentation and the training loop's data-wait fraction;
3. the code cells of the lesson notebooks 04, 05 and 08 (a profiled CUDA loop), in quick mode, each notebook in a fresh
   Python process of its own that runs the cells in one namespace (:func:`run_notebook_cells`:
   no Jupyter, nbclient or kernel needed, ``MPLBACKEND=Agg``, the hosted-install cell skipped);

and writes the results as reference JSON files (:mod:`course_utils.reference`: lesson 04,
lesson 05 and a summary holding the issue's three targets, each with the value measured and
whether it was met), into ``course_utils/reference_results/`` or ``--out DIR``.

Nothing is hidden: a section of a benchmark that raised, a notebook cell that raised (or a
notebook that ran out of time) is a *failure*: it is printed, listed in the summary's
``failures``, the summary then never says the targets were met, and the command exits 2.
A target a failed or skipped section should have measured is listed as not measured.

On a machine without CUDA it refuses with a clear message, exits non-zero and writes nothing:
reference results are only ever measured, never made up. ``--plan`` prints what would run,
with each step's share of the budget, and runs nothing.

Importing this module is cheap (torch is imported only when a check runs).
"""
from __future__ import annotations

import argparse
import glob
import importlib.util
import os
import shutil
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import psutil

from course_utils.config import QUICK_ENV
from course_utils.reference import (LESSON04, LESSON05, REFERENCE_DIR, REFERENCE_NAMES, SUMMARY,
                                    describe_machine, save_reference)

from .notebook_runner import run_notebook

__all__ = [
    "DEFAULT_BUDGET_S",
    "EXPECTED_TARGETS",
    "GpuCheckRefused",
    "cuda_available",
    "host_memory",
    "memory_notes",
    "plan",
    "run_gpu_check",
    "format_targets",
    "add_arguments",
    "cli",
    "main",
]

#: Total seconds the check may take (the issue asks for under 10 minutes).
DEFAULT_BUDGET_S = 540.0
#: Share of the budget for each step; the notebooks get what the benchmarks leave.
SHARES = {"lesson04": 0.26, "lesson05": 0.36, "notebooks": 0.38}
#: Below this many seconds a step is not started.
MIN_STEP_S = 20.0
#: The lesson notebooks the check executes (globs, relative to the repository root).
NOTEBOOK_GLOBS = ("notebooks/04_*.ipynb", "notebooks/05_*.ipynb", "notebooks/08_*.ipynb")
#: The targets each benchmark step measures: one that is absent is reported as not measured.
EXPECTED_TARGETS = {"lesson04": ("pinned_h2d",),
                    "lesson05": ("augment_speedup", "tuned_data_wait")}
#: About what lesson 05's full-size training loaders (workers x prefetched batches) can hold
#: in /dev/shm at once.
LESSON05_SHM_BYTES = 5 * 1024 ** 3
SHM_PATH = Path("/dev/shm")
ROOT = Path(__file__).resolve().parent.parent
GIB = 1024 ** 3


class GpuCheckRefused(RuntimeError):
    """The check cannot run here (no CUDA); nothing was written."""


def cuda_available() -> bool:
    """True when torch sees a CUDA GPU. (Tests replace this function to simulate one.)"""
    import torch
    return bool(torch.cuda.is_available())


def _refusal() -> str:
    try:
        from course_utils.machine import machine_summary
        here = machine_summary()
    except Exception:  # pragma: no cover - the summary is only decoration here
        here = "this machine"
    return (f"gpu-check needs a CUDA GPU, and torch.cuda.is_available() is False on {here}.\n"
            f"Nothing was measured and nothing was written: reference GPU results are only ever "
            f"measured on a real GPU, never made up.\n"
            f"Run it on a machine with an NVIDIA GPU and a CUDA build of torch:\n"
            f"    python -m course_authoring gpu-check            # writes {REFERENCE_DIR}\n"
            f"    python -m course_authoring gpu-check --out DIR  # or into DIR\n"
            f"(Apple MPS is not a substitute: the reference results describe a CUDA GPU.)")


def _check_budget(budget_s: Any) -> float:
    if isinstance(budget_s, bool) or not isinstance(budget_s, (int, float)) or budget_s <= 0:
        raise ValueError(f"budget_s must be a positive number of seconds (default "
                         f"{DEFAULT_BUDGET_S:g}), got {budget_s!r}.")
    return float(budget_s)


def _notebooks() -> list[Path]:
    found: list[Path] = []
    for pattern in NOTEBOOK_GLOBS:
        found += sorted(Path(p) for p in glob.glob(str(ROOT / pattern)))
    return found


def _has_augment() -> bool:
    """True when lesson 05's module (course_utils.augment) is in this copy of the course."""
    return importlib.util.find_spec("course_utils.augment") is not None


def _gib(n: float | None) -> str:
    return "unknown" if n is None else f"{n / GIB:.1f} GiB"


# --------------------------------------------------------------------------------------
# host memory: what the RAM- and /dev/shm-bound parts can use
# --------------------------------------------------------------------------------------

def host_memory(shm_path: Path = SHM_PATH) -> dict:
    """RAM available and free space in ``/dev/shm`` (where DataLoader workers put batches),
    in bytes; ``shm_free_bytes`` is None where there is no such folder."""
    ram = psutil.virtual_memory()
    try:
        shm_free: int | None = int(shutil.disk_usage(shm_path).free)
    except OSError:
        shm_free = None
    return {"ram_available_bytes": int(ram.available), "ram_total_bytes": int(ram.total),
            "shm_free_bytes": shm_free}


def memory_notes(memory: Mapping[str, Any]) -> tuple[list[str], bool]:
    """What the memory found means for this run, as lines for the log, and whether /dev/shm is
    too small for lesson 05's full-size loaders (they are run anyway; a failure then says why)."""
    ram, shm = memory.get("ram_available_bytes"), memory.get("shm_free_bytes")
    notes = [f"RAM available {_gib(ram)}: lesson 04's bandwidth sweep sizes its largest copy from "
             f"it (at most 1 GiB, at most a quarter of the available RAM; the GPU's free memory "
             f"caps it too)"]
    short = shm is not None and shm < LESSON05_SHM_BYTES
    if shm is None:
        notes.append(f"{SHM_PATH} not found: DataLoader workers cannot share batches there")
    elif short:
        notes.append(f"WARNING: {SHM_PATH} has only {_gib(shm)} free; lesson 05's full-size "
                     f"loaders can hold about {_gib(LESSON05_SHM_BYTES)} there, so a worker may "
                     f"die with a bus error (give the machine more, e.g. docker --shm-size=8g)")
    else:
        notes.append(f"{SHM_PATH} has {_gib(shm)} free: enough for lesson 05's full-size loaders "
                     f"(about {_gib(LESSON05_SHM_BYTES)} at most)")
    return notes, short


def plan(budget_s: float = DEFAULT_BUDGET_S, *, notebooks: bool = True) -> list[dict]:
    """The steps the check would run, each with its budget in seconds; runs nothing.

    Each step: ``{"name", "what", "budget_s", "runs"}`` (``runs`` False, with ``why``, when the
    step would be skipped: its share of the budget is under MIN_STEP_S, lesson 05's module is
    missing, or there are no lesson 04/05/08 notebooks).
    """
    budget_s = _check_budget(budget_s)
    steps = []
    has_augment = _has_augment()
    books = _notebooks()
    for name, what in (("lesson04", "course_authoring.gpu_lesson04.run_lesson04 -> "
                                    f"{LESSON04}.json"),
                       ("lesson05", "course_authoring.gpu_lesson05.run_lesson05 -> "
                                    f"{LESSON05}.json"),
                       ("notebooks", "run the code cells of " + (", ".join(p.name for p in books) or
                                                              "no lesson 04/05/08 notebooks found")
                                     + " (quick mode, a fresh python process each)")):
        step = {"name": name, "what": what, "budget_s": round(SHARES[name] * budget_s, 1),
                "runs": True}
        if step["budget_s"] < MIN_STEP_S:
            step.update(runs=False, why=f"its share of the budget is under {MIN_STEP_S:g} s")
        elif name == "lesson05" and not has_augment:
            step.update(runs=False, why="course_utils.augment is not in this copy of the course")
        elif name == "notebooks" and not notebooks:
            step.update(runs=False, why="notebooks switched off (--no-notebooks)")
        elif name == "notebooks" and not books:
            step.update(runs=False, why="no lesson 04/05/08 notebooks found")
        steps.append(step)
    steps.append({"name": "summary", "what": f"targets met or not -> {SUMMARY}.json",
                  "budget_s": 0.0, "runs": True})
    return steps


def _lesson04(budget_s: float) -> dict:
    from .gpu_lesson04 import run_lesson04    # imports torch: only when the check runs
    return run_lesson04(budget_s)


def _lesson05(budget_s: float) -> dict:
    from .gpu_lesson05 import run_lesson05
    return run_lesson05(budget_s)


def _section_failures(result: Mapping) -> list[str]:
    """The sections of a benchmark result that raised (recorded as ``"failed: ..."`` in its
    ``skipped``, a dict of section -> reason, or a list of reasons)."""
    skipped = result.get("skipped") or {}
    if isinstance(skipped, Mapping):
        return [f"section {k}: {v}" for k, v in skipped.items() if str(v).startswith("failed")]
    return [str(v) for v in skipped if "failed" in str(v).lower()]


def _targets_from(parts: Mapping[str, dict | None], status: Mapping[str, dict]) -> dict:
    """Every target measured, then every expected one that was not (``met: None``, with why)."""
    targets: dict[str, Any] = {}
    for part in parts.values():
        if isinstance(part, dict) and isinstance(part.get("targets"), dict):
            targets.update(part["targets"])
    for step, names in EXPECTED_TARGETS.items():
        for name in names:
            if name not in targets:
                st = status.get(step, {})
                why = f"{step} {st.get('status', 'not run')}"
                if st.get("detail"):
                    why += f": {st['detail']}"
                targets[name] = {"description": "not measured", "value": None, "target": None,
                                 "met": None, "detail": f"(not measured: {why})"}
    return targets


def format_targets(targets: dict) -> str:
    """The issue targets as lines for a person: measured value, threshold, met or not."""
    if not targets:
        return "no targets were measured"
    lines = []
    for name, t in targets.items():
        if not isinstance(t, dict):
            lines.append(f"  {name}: {t}")
            continue
        met = t.get("met")
        mark = "MET    " if met else ("NOT MET" if met is not None else "n/a    ")
        measured = t.get("value", t.get("measured"))
        value = f"{measured:.3g}" if isinstance(measured, (int, float)) else str(measured)
        target = t.get("target", t.get("threshold"))
        lines.append(f"  [{mark}] {name}: measured {value} (target {target}) - "
                     f"{t.get('description', '')} {t.get('detail', '')}".rstrip())
    return "\n".join(lines)


def _run_benchmark(name: str, fn: Callable[[float], dict], share: float, ref: str, *,
                   machine: dict, out_dir: Any, shm_short: bool,
                   log: Callable[[str], None]) -> tuple[dict, dict | None]:
    """Run one benchmark step; (its status, its results or None)."""
    log(f"[gpu-check] {name}: running ({share:.0f} s budget) ...")
    t0 = time.perf_counter()
    try:
        result = fn(share)
    except Exception as exc:  # record it, keep the other steps
        detail = f"{type(exc).__name__}: {exc}"
        if name == "lesson05" and shm_short:
            detail += f" ({SHM_PATH} was short of space: see the memory lines above)"
        log(f"[gpu-check] {name}: FAILED: {detail}\n{traceback.format_exc()}")
        return {"status": "failed", "seconds": time.perf_counter() - t0, "detail": detail,
                "failures": [detail]}, None
    if not isinstance(result, dict):
        detail = f"returned {type(result).__name__}, not a dict of results"
        log(f"[gpu-check] {name}: FAILED: {detail}")
        return {"status": "failed", "detail": detail, "failures": [detail]}, None
    path = save_reference(ref, result, machine=machine, directory=out_dir)
    failures = _section_failures(result)
    seconds = time.perf_counter() - t0
    st: dict[str, Any] = {"status": "failed" if failures else "done", "seconds": seconds,
                          "file": str(path)}
    if failures:
        st.update(detail=f"{len(failures)} section(s) raised; the rest was saved",
                  failures=failures)
        for failure in failures:
            log(f"[gpu-check] {name}: FAILED {failure}")
    log(f"[gpu-check] {name}: {st['status']} in {seconds:.0f} s -> {path}")
    return st, result


def _run_notebooks(deadline: float, log: Callable[[str], None]) -> dict:
    books = _notebooks()
    runs: dict[str, dict] = {}
    for n, book in enumerate(books):
        left = deadline - time.perf_counter()
        timeout_s = left / (len(books) - n)
        if timeout_s < MIN_STEP_S:
            runs[book.name] = {"status": "not run",
                               "detail": f"only {left:.0f} s of the budget left"}
            log(f"[gpu-check] {book.name}: NOT RUN (only {left:.0f} s of the budget left)")
            continue
        log(f"[gpu-check] running the code cells of {book.name} (quick mode, up to "
            f"{timeout_s:.0f} s) ...")
        runs[book.name] = run_notebook(book, timeout_s)
        log(f"[gpu-check] {book.name}: {runs[book.name]['status']} in "
            f"{runs[book.name]['seconds']:.0f} s ({runs[book.name]['detail']})")
    failures = [f"notebook {name}: {r['status']}: {r.get('detail', '')}"
                for name, r in runs.items() if r["status"] != "passed"]
    return {"status": "failed" if failures else "done", "notebooks": runs, "failures": failures}


def run_gpu_check(out_dir: str | os.PathLike | None = None, *, budget_s: float = DEFAULT_BUDGET_S,
                  notebooks: bool = True, log: Callable[[str], None] = print) -> dict:
    """Run the GPU benchmarks of lessons 04 and 05 on CUDA in full mode, then the code cells
    of their notebooks in quick mode, and write the reference results; return the summary.

    ``out_dir``: where the JSON files go (default :data:`course_utils.reference.REFERENCE_DIR`).
    ``budget_s``: total seconds, split by :data:`SHARES` (see :func:`plan`).
    The summary's ``failures`` lists every section, step and notebook that failed (a notebook
    not run for lack of time counts); ``all_targets_met`` is True only when there is none and
    every target of :data:`EXPECTED_TARGETS` was measured and met.
    Raises :class:`GpuCheckRefused` before writing anything when CUDA is not available.
    """
    budget_s = _check_budget(budget_s)
    if not cuda_available():
        raise GpuCheckRefused(_refusal())
    start = time.perf_counter()
    steps = {s["name"]: s for s in plan(budget_s, notebooks=notebooks)}
    saved_mode = os.environ.get(QUICK_ENV)
    os.environ[QUICK_ENV] = "0"  # full mode for every measurement of this run
    machine = describe_machine()
    memory = host_memory()
    notes, shm_short = memory_notes(memory)
    log(f"[gpu-check] {machine.get('summary')}; GPU {machine.get('gpu_name')}; budget {budget_s:.0f} s")
    for note in notes:
        log(f"[gpu-check] memory: {note}")
    status: dict[str, dict] = {}
    parts: dict[str, dict | None] = {"lesson04": None, "lesson05": None}
    try:
        for name, fn, ref in (("lesson04", _lesson04, LESSON04), ("lesson05", _lesson05, LESSON05)):
            step = steps[name]
            left = budget_s - (time.perf_counter() - start)
            share = min(step["budget_s"], max(0.0, left - MIN_STEP_S))
            if not step["runs"] or share < MIN_STEP_S:
                why = step.get("why") or f"only {left:.0f} s of the budget left"
                status[name] = {"status": "skipped", "detail": why}
                log(f"[gpu-check] {name}: skipped ({why})")
                continue
            status[name], parts[name] = _run_benchmark(name, fn, share, ref, machine=machine,
                                                       out_dir=out_dir, shm_short=shm_short, log=log)
    finally:
        if saved_mode is None:
            os.environ.pop(QUICK_ENV, None)
        else:
            os.environ[QUICK_ENV] = saved_mode

    nb_step = steps["notebooks"]
    if not nb_step["runs"]:
        status["notebooks"] = {"status": "skipped", "detail": nb_step.get("why", "")}
        log(f"[gpu-check] notebooks: skipped ({nb_step.get('why', '')})")
    else:
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            torch.cuda.empty_cache()          # the notebook processes need the GPU's memory
        status["notebooks"] = _run_notebooks(start + budget_s - 5.0, log)

    failures = [f"{name}: {f}" for name, st in status.items() for f in st.get("failures", [])]
    targets = _targets_from(parts, status)
    summary = {"budget_s": budget_s, "total_s": time.perf_counter() - start,
               "memory": memory, "steps": status, "failures": failures, "targets": targets,
               "all_targets_met": not failures and all(
                   isinstance(t, dict) and t.get("met") is True for t in targets.values())}
    path = save_reference(SUMMARY, summary, machine=machine, directory=out_dir)
    summary["file"] = str(path)
    log("[gpu-check] targets:\n" + format_targets(targets))
    if failures:
        log(f"[gpu-check] FAILED: {len(failures)} failure(s); the targets cannot be called met:\n"
            + "\n".join(f"  - {f}" for f in failures))
    else:
        log(f"[gpu-check] no failures; all targets met: {summary['all_targets_met']}")
    log(f"[gpu-check] finished in {summary['total_s']:.0f} s; summary -> {path}")
    if out_dir is not None:
        written = [f"{n}.json" for n in REFERENCE_NAMES if (Path(out_dir) / f"{n}.json").is_file()]
        log(f"[gpu-check] reference files in {out_dir}: {' '.join(written)} (these, and only "
            f"these, go into course_utils/reference_results/)")
    return summary


# --------------------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add gpu-check's options to ``parser`` (used by ``python -m course_utils``)."""
    parser.add_argument("--out", metavar="DIR", default=None,
                        help=f"write the JSON files to DIR (default: {REFERENCE_DIR})")
    parser.add_argument("--budget", type=float, default=DEFAULT_BUDGET_S, metavar="SECONDS",
                        help=f"total time budget (default {DEFAULT_BUDGET_S:g})")
    parser.add_argument("--no-notebooks", action="store_true",
                        help="do not run the code cells of the lesson notebooks")
    parser.add_argument("--plan", action="store_true",
                        help="print the steps and their budgets; run and write nothing")
    return parser


def cli(args: argparse.Namespace) -> int:
    """Run gpu-check from parsed arguments; the exit status (0 done, 1 refused/bad input,
    2 a section, step or notebook failed)."""
    try:
        if args.plan:
            for step in plan(args.budget, notebooks=not args.no_notebooks):
                state = "runs" if step["runs"] else f"skipped: {step['why']}"
                print(f"{step['name']:<10} {step['budget_s']:>6.0f} s  {step['what']}  [{state}]")
            print(f"CUDA available here: {cuda_available()}")
            return 0
        summary = run_gpu_check(args.out, budget_s=args.budget, notebooks=not args.no_notebooks)
    except GpuCheckRefused as exc:
        print(exc, file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"gpu-check: {exc}", file=sys.stderr)
        return 1
    return 2 if summary["failures"] else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = add_arguments(argparse.ArgumentParser(
        prog="python -m course_authoring gpu-check",
        description="On a CUDA machine: run lessons 04-05's GPU benchmarks in full mode and the "
                    "code cells of their notebooks in quick mode, within a time budget, and "
                    "write reference results as JSON."))
    return cli(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
