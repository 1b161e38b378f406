"""``python -m course_utils gpu-check``: measure the GPU lessons on a real CUDA machine.

On a machine with CUDA this runs, in full mode and within a time budget (default 540 s):

1. lesson 04's GPU benchmarks (:func:`course_utils.transfer.run_gpu_benchmarks`): copy
   bandwidth pageable / pinned / device-to-device, naive vs honest timing, copy/compute
   overlap, uint8 vs float32, the prefetcher, pin_memory in a DataLoader, the forked-worker
   error;
2. lesson 05's (``course_utils.augment.run_gpu_benchmarks``): on-device vs per-sample CPU
   augmentation and the training loop's data-wait fraction;
3. the lesson notebooks 04 and 05, executed with nbclient — only when nbclient and ipykernel
   are installed (otherwise skipped, with a message);

and writes the results as reference JSON files (:mod:`course_utils.reference`: lesson 04,
lesson 05 and a summary holding the issue's three targets, each with the value measured and
whether it was met), into ``course_utils/reference_results/`` or ``--out DIR``.

On a machine without CUDA it refuses with a clear message, exits non-zero and writes nothing:
reference results are only ever measured, never made up. ``--plan`` prints what would run,
with each step's share of the budget, and runs nothing.

Importing this module is cheap (torch is imported only when a check runs).
"""
from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from .config import QUICK_ENV
from .reference import LESSON04, LESSON05, REFERENCE_DIR, SUMMARY, describe_machine, save_reference

__all__ = [
    "DEFAULT_BUDGET_S",
    "GpuCheckRefused",
    "cuda_available",
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
SHARES = {"lesson04": 0.30, "lesson05": 0.45, "notebooks": 0.25}
#: Below this many seconds a step is not started.
MIN_STEP_S = 20.0
#: The lesson notebooks the check executes (globs, relative to the repository root).
NOTEBOOK_GLOBS = ("notebooks/04_*.ipynb", "notebooks/05_*.ipynb")
ROOT = Path(__file__).resolve().parent.parent


class GpuCheckRefused(RuntimeError):
    """The check cannot run here (no CUDA); nothing was written."""


def cuda_available() -> bool:
    """True when torch sees a CUDA GPU. (Tests replace this function to simulate one.)"""
    import torch
    return bool(torch.cuda.is_available())


def _refusal() -> str:
    try:
        from .machine import machine_summary
        here = machine_summary()
    except Exception:  # pragma: no cover - the summary is only decoration here
        here = "this machine"
    return (f"gpu-check needs a CUDA GPU, and torch.cuda.is_available() is False on {here}.\n"
            f"Nothing was measured and nothing was written: reference GPU results are only ever "
            f"measured on a real GPU, never made up.\n"
            f"Run it on a machine with an NVIDIA GPU and a CUDA build of torch:\n"
            f"    python -m course_utils gpu-check            # writes {REFERENCE_DIR}\n"
            f"    python -m course_utils gpu-check --out DIR  # or into DIR\n"
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


def _can_execute_notebooks() -> tuple[bool, str]:
    missing = [m for m in ("nbclient", "nbformat", "ipykernel") if importlib.util.find_spec(m) is None]
    if missing:
        return False, (f"{', '.join(missing)} not installed: notebooks not executed "
                       f"(pip install nbclient ipykernel to include them)")
    return True, ""


def _has_augment() -> bool:
    """True when lesson 05's module (course_utils.augment) is in this copy of the course."""
    return importlib.util.find_spec("course_utils.augment") is not None


def plan(budget_s: float = DEFAULT_BUDGET_S, *, notebooks: bool = True) -> list[dict]:
    """The steps the check would run, each with its budget in seconds; runs nothing.

    Each step: ``{"name", "what", "budget_s", "runs"}`` (``runs`` False, with ``why``, when the
    step would be skipped: its share of the budget is under MIN_STEP_S, lesson 05's module is
    missing, or nbclient/ipykernel are not installed).
    """
    budget_s = _check_budget(budget_s)
    steps = []
    has_augment = _has_augment()
    can_nb, why_nb = _can_execute_notebooks()
    books = _notebooks()
    for name, what in (("lesson04", "course_utils.transfer.run_gpu_benchmarks -> "
                                    f"{LESSON04}.json"),
                       ("lesson05", "course_utils.augment.run_gpu_benchmarks -> "
                                    f"{LESSON05}.json"),
                       ("notebooks", "execute " + (", ".join(p.name for p in books) or
                                                  "no lesson 04/05 notebooks found"))):
        step = {"name": name, "what": what, "budget_s": round(SHARES[name] * budget_s, 1),
                "runs": True}
        if step["budget_s"] < MIN_STEP_S:
            step.update(runs=False, why=f"its share of the budget is under {MIN_STEP_S:g} s")
        elif name == "lesson05" and not has_augment:
            step.update(runs=False, why="course_utils.augment is not in this copy of the course")
        elif name == "notebooks" and not notebooks:
            step.update(runs=False, why="notebooks switched off (--no-notebooks)")
        elif name == "notebooks" and not can_nb:
            step.update(runs=False, why=why_nb)
        elif name == "notebooks" and not books:
            step.update(runs=False, why="no lesson 04/05 notebooks found")
        steps.append(step)
    steps.append({"name": "summary", "what": f"targets met or not -> {SUMMARY}.json",
                  "budget_s": 0.0, "runs": True})
    return steps


# the benchmark steps (module attributes so that tests can replace them)

def _lesson04(budget_s: float) -> dict:
    from .transfer import run_gpu_benchmarks
    return run_gpu_benchmarks(budget_s)


def _lesson05(budget_s: float) -> dict:
    from .augment import run_gpu_benchmarks  # written by the lesson-05 module
    return run_gpu_benchmarks(budget_s)


_EXECUTE = r'''
import sys, nbformat
from nbclient import NotebookClient
from course_utils.kernels import kernel_manager_class
path, out, timeout = sys.argv[1], sys.argv[2], int(sys.argv[3])
nb = nbformat.read(path, as_version=4)
client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                        resources={"metadata": {"path": sys.argv[4]}},
                        kernel_manager_class=kernel_manager_class())
try:
    client.execute()
finally:
    if out != "-":
        nbformat.write(nb, out)
'''


def _execute_notebook(path: Path, out: Path | None, timeout_s: float) -> dict:
    """Execute one notebook in a subprocess (killed after ``timeout_s``); return its status."""
    env = dict(os.environ)
    env[QUICK_ENV] = "0"
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _EXECUTE, str(path), str(out) if out else "-",
             str(int(max(30, timeout_s))), str(path.parent)],
            capture_output=True, text=True, timeout=timeout_s, env=env, cwd=str(ROOT))
    except subprocess.TimeoutExpired:
        return {"status": "timed out", "seconds": time.perf_counter() - t0,
                "detail": f"stopped after {timeout_s:.0f} s (the check's budget)"}
    detail = ""
    if proc.returncode:
        lines = proc.stderr.strip().splitlines()
        detail = lines[-1] if lines else f"exit status {proc.returncode}"
    return {"status": "passed" if proc.returncode == 0 else "failed",
            "seconds": time.perf_counter() - t0, "detail": detail,
            "executed": str(out) if out is not None and proc.returncode == 0 else None}


def _targets_from(lesson04: dict | None, lesson05: dict | None) -> dict:
    targets: dict[str, Any] = {}
    for part in (lesson04, lesson05):
        if isinstance(part, dict) and isinstance(part.get("targets"), dict):
            targets.update(part["targets"])
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


def run_gpu_check(out_dir: str | os.PathLike | None = None, *, budget_s: float = DEFAULT_BUDGET_S,
                  notebooks: bool = True, log: Callable[[str], None] = print) -> dict:
    """Run the GPU benchmarks of lessons 04 and 05 (and their notebooks) on CUDA, in full mode,
    and write the reference results; return the summary dict.

    ``out_dir``: where the JSON files go (default :data:`course_utils.reference.REFERENCE_DIR`;
    executed notebooks go to ``out_dir/executed/`` only when ``out_dir`` is given).
    ``budget_s``: total seconds, split by :data:`SHARES` (see :func:`plan`).
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
    log(f"[gpu-check] {machine.get('summary')}; GPU {machine.get('gpu_name')}; budget {budget_s:.0f} s")
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
            log(f"[gpu-check] {name}: running ({share:.0f} s budget) ...")
            t0 = time.perf_counter()
            try:
                result = fn(share)
            except Exception as exc:  # record it, keep the other steps
                status[name] = {"status": "failed", "seconds": time.perf_counter() - t0,
                                "detail": f"{type(exc).__name__}: {exc}"}
                log(f"[gpu-check] {name}: FAILED: {type(exc).__name__}: {exc}")
                continue
            if not isinstance(result, dict):
                status[name] = {"status": "failed", "detail": f"returned {type(result).__name__}, "
                                                               f"not a dict of results"}
                continue
            parts[name] = result
            path = save_reference(ref, result, machine=machine, directory=out_dir)
            status[name] = {"status": "done", "seconds": time.perf_counter() - t0, "file": str(path)}
            log(f"[gpu-check] {name}: done in {status[name]['seconds']:.0f} s -> {path}")

        nb_step = steps["notebooks"]
        executed: dict[str, dict] = {}
        if not nb_step["runs"]:
            status["notebooks"] = {"status": "skipped", "detail": nb_step.get("why", "")}
            log(f"[gpu-check] notebooks: skipped ({nb_step.get('why', '')})")
        else:
            out_nb = Path(out_dir) / "executed" if out_dir is not None else None
            if out_nb is not None:
                out_nb.mkdir(parents=True, exist_ok=True)
            for book in _notebooks():
                left = budget_s - (time.perf_counter() - start) - 5.0
                if left < MIN_STEP_S:
                    executed[book.name] = {"status": "skipped",
                                           "detail": f"only {left:.0f} s of the budget left"}
                    continue
                log(f"[gpu-check] executing {book.name} (full mode, up to {left:.0f} s) ...")
                executed[book.name] = _execute_notebook(
                    book, out_nb / book.name if out_nb is not None else None, left)
                log(f"[gpu-check] {book.name}: {executed[book.name]['status']} "
                    f"in {executed[book.name]['seconds']:.0f} s")
            status["notebooks"] = {"status": "done", "notebooks": executed}
    finally:
        if saved_mode is None:
            os.environ.pop(QUICK_ENV, None)
        else:
            os.environ[QUICK_ENV] = saved_mode

    targets = _targets_from(parts["lesson04"], parts["lesson05"])
    summary = {"budget_s": budget_s, "total_s": time.perf_counter() - start,
               "steps": status, "targets": targets,
               "all_targets_met": bool(targets) and all(
                   isinstance(t, dict) and t.get("met") is True for t in targets.values())}
    path = save_reference(SUMMARY, summary, machine=machine, directory=out_dir)
    summary["file"] = str(path)
    log("[gpu-check] targets:\n" + format_targets(targets))
    log(f"[gpu-check] finished in {summary['total_s']:.0f} s; summary -> {path}")
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
                        help="do not execute the lesson notebooks")
    parser.add_argument("--plan", action="store_true",
                        help="print the steps and their budgets; run and write nothing")
    return parser


def cli(args: argparse.Namespace) -> int:
    """Run gpu-check from parsed arguments; the exit status (0 done, 1 refused/bad input,
    2 a step failed)."""
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
    failed = [n for n, s in summary["steps"].items() if s.get("status") == "failed"]
    return 2 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = add_arguments(argparse.ArgumentParser(
        prog="python -m course_utils gpu-check",
        description="On a CUDA machine: run lessons 04-05's GPU benchmarks (and notebooks) in "
                    "full mode within a time budget and write reference results as JSON."))
    return cli(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
