"""Authoring commands: ``python -m course_authoring COMMAND``.

Commands:
  make-exercises   write exercises/ from solutions/ (--check: only report differences)
  hosted-cell      write the Colab/Kaggle install cell into every notebook (--check: only report)
  gpu-check        on a CUDA machine: the whole GPU check as steps (--rehearse: on the CPU)
  core-paths       each lesson's core and deep-dive minutes; --run: run every core path for real
  site             build the course website from the notebooks executed here (build/site)
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from typing import Sequence

from . import gpu_check
from .core_paths import parts, skipped_uses, stated_minutes
from .exercises import ExerciseFormatError, make_exercises
from .hosted import REPOSITORY_URL, sync_install_cells
from .site import SITE_OUT, build


def _cmd_make_exercises(args: argparse.Namespace) -> int:
    """Bad folders or a malformed solution notebook: one line on stderr, exit status 2."""
    def fail(message: str) -> int:
        print(f"python -m course_authoring make-exercises: error: {message}", file=sys.stderr)
        return 2

    if not Path(args.solutions).is_dir():
        return fail(f"--solutions {args.solutions!r} is not a folder; run from the course root or "
                    f"pass the folder that holds the solution notebooks.")
    if Path(args.exercises).exists() and not Path(args.exercises).is_dir():
        return fail(f"--exercises {args.exercises!r} is not a folder; pass the folder the exercise "
                    f"notebooks are written to.")
    try:
        changed = make_exercises(args.solutions, args.exercises, check=args.check)
    except ExerciseFormatError as exc:
        return fail(str(exc))
    if args.check:
        if changed:
            print("exercises/ is out of date with solutions/ for:")
            for path in changed:
                print(f"  {path}")
            print("Run: python -m course_authoring make-exercises")
            return 1
        print("exercises/ is up to date.")
        return 0
    for path in changed:
        print(f"wrote {path}")
    if not changed:
        print("exercises/ was already up to date.")
    return 0


def _cmd_hosted_cell(args: argparse.Namespace) -> int:
    try:
        changed = sync_install_cells(args.folders, check=args.check)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.check and changed:
        print("these notebooks lack the current hosted-install cell:")
        for path in changed:
            print(f"  {path}")
        print("Run: python -m course_authoring hosted-cell")
        return 1
    for path in changed:
        print(f"wrote {path}")
    print(f"hosted-install cells are up to date (repository: {REPOSITORY_URL}).")
    return 0


def _cmd_core_paths(args: argparse.Namespace) -> int:
    """Report each lesson's minutes and where skipping its deep dives would break it; with --run,
    run each core path in a kernel. Exit 1 when any is broken, 2 on a bad path."""
    paths = [Path(p) for p in args.notebooks] or sorted(Path("notebooks").glob("[0-9][0-9]_*.ipynb"))
    missing = [str(p) for p in paths if not p.is_file()]
    if missing or not paths:
        print(f"python -m course_authoring core-paths: error: no such notebook: "
              f"{', '.join(missing) or 'notebooks/NN_*.ipynb'}; run from the course root or name "
              f"the notebooks.", file=sys.stderr)
        return 2
    if args.run:
        # nbclient is imported only here: the bare GPU machine that runs gpu-check has no Jupyter
        from .core_path_runner import run_core_path
    broken = 0
    for path in paths:
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        try:
            core, deep, exercise = stated_minutes(cells)
        except ValueError as exc:
            print(f"{path.name}: {exc}")
            broken += 1
            continue
        dives = sum(part.deep for part in parts(cells))
        problems = skipped_uses(cells)
        line = f"{path.name}: core {core} min, {dives} deep dive(s) {deep} min, exercise {exercise} min"
        if args.run and not problems:
            run = run_core_path(path)
            kept = ""
            if args.keep:                  # executed notebooks carry outputs: only where asked
                out = Path(args.keep) / path.name
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_text(json.dumps(run.executed, indent=1, ensure_ascii=False) + "\n",
                               encoding="utf-8")
                kept = f" -> {out}"
            line += (f"; core path ran ({run.cells_run} code cells, {run.seconds:.0f} s)" if run.ok
                     else f"; core path FAILED after {run.cells_run} code cells: {run.error}") + kept
            broken += not run.ok
        print(line)
        for problem in problems:
            print(f"  {problem}")
        broken += bool(problems)
    return 1 if broken else 0


def _cmd_site(args: argparse.Namespace) -> int:
    """Build the website; exit with sphinx-build's status (2: Sphinx or MyST-NB missing)."""
    if importlib.util.find_spec("myst_nb") is None:         # the site extra: pip install -e .[site]
        print("python -m course_authoring site: error: Sphinx and MyST-NB are not installed; run "
              "make site (it installs them) or pip install -e .[site].", file=sys.stderr)
        return 2
    try:
        status = build(Path(args.out) if args.out else SITE_OUT, full=args.full, lessons=args.lessons)
    except ValueError as exc:
        print(f"python -m course_authoring site: error: {exc}", file=sys.stderr)
        return 2
    if status == 0:
        print(f"built {args.out or SITE_OUT}/index.html; serve it with: python -m http.server -d "
              f"{args.out or SITE_OUT}")
    return status


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m course_authoring",
        description="Feed the GPU: the course authors' commands (exercises, hosted cell, GPU check). "
                    "Learners use python -m course_utils.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("make-exercises", help="write exercises/ from solutions/",
                       description="Replace every ### BEGIN SOLUTION ... ### END SOLUTION region "
                                   "of solutions/*.ipynb with a NotImplementedError stub and "
                                   "write the result to exercises/.")
    p.add_argument("--solutions", default="solutions", help="source folder (default: solutions)")
    p.add_argument("--exercises", default="exercises", help="target folder (default: exercises)")
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 when exercises/ differs from what would be written")
    p.set_defaults(func=_cmd_make_exercises)

    p = sub.add_parser("hosted-cell", help="write the Colab/Kaggle install cell into every notebook",
                       description="Make the first code cell of every notebook the cell that "
                                   "installs the course on hosted services (Google Colab, Kaggle) "
                                   "and does nothing elsewhere. The repository URL is set in "
                                   "course_authoring/hosted.py.")
    p.add_argument("folders", nargs="*", default=["notebooks", "solutions", "exercises"],
                   metavar="FOLDER", help="folders of notebooks (default: notebooks solutions "
                                          "exercises)")
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 when a notebook lacks the current cell")
    p.set_defaults(func=_cmd_hosted_cell)
    p = sub.add_parser("gpu-check", help="on a CUDA machine: the whole GPU check -> reference results",
                       description="On a CUDA machine: the whole GPU check as independent steps, "
                                   "each with its own timeout (at most 420 s in all): doctor, "
                                   "lessons 04-05's GPU benchmarks in full mode (the reference "
                                   "results), notebooks 04, 05, 08 in quick mode without Jupyter, "
                                   "the CUDA unit tests, tune, one torchrun rank and diagnose. "
                                   "Ends with a summary; exits 1 when any step failed. Refuses "
                                   "without CUDA, except with --rehearse (every step on the CPU).")
    gpu_check.add_arguments(p)
    p.set_defaults(func=gpu_check.cli)

    p = sub.add_parser("core-paths", help="each lesson's core path and deep dives; --run runs them",
                       description="For each lesson: its core-path, deep-dive and exercise minutes, "
                                   "and any cell of the core path that would break with the deep "
                                   "dives skipped. --run also runs each core path (the notebook "
                                   "without its deep dives) in a Jupyter kernel, in quick mode.")
    p.add_argument("notebooks", nargs="*", metavar="NOTEBOOK",
                   help="lesson notebooks (default: notebooks/NN_*.ipynb)")
    p.add_argument("--run", action="store_true", help="run each core path in a kernel (minutes)")
    p.add_argument("--keep", metavar="DIR", help="with --run: write each executed core path, with "
                                                 "its outputs, into DIR (outside the repository)")
    p.set_defaults(func=_cmd_core_paths)

    p = sub.add_parser("site", help="build the course website from the notebooks executed here",
                       description="Execute the lessons on this machine (quick mode unless --full; "
                                   "only notebooks whose code changed run again) and build a static "
                                   "website: the README as home page, every lesson with its outputs, "
                                   "the exercises (never the solutions), the instructor guide.")
    p.add_argument("--full", action="store_true", help="execute in full mode (slow)")
    p.add_argument("--lessons", nargs="+", metavar="NN", help="only these lessons (e.g. 00 06)")
    p.add_argument("--out", help="output folder (default: build/site)")
    p.set_defaults(func=_cmd_site)

    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
