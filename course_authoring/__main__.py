"""Authoring commands: ``python -m course_authoring COMMAND``.

Commands:
  make-exercises   write exercises/ from solutions/ (--check: only report differences)
  hosted-cell      write the Colab/Kaggle install cell into every notebook (--check: only report)
  gpu-check        on a CUDA machine: the whole GPU check as steps (--rehearse: on the CPU)
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from . import gpu_check
from .exercises import ExerciseFormatError, make_exercises
from .hosted import REPOSITORY_URL, sync_install_cells


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m course_authoring",
        description="Feed the GPU: the course authors' tools (exercises, hosted cell, GPU check). "
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

    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
