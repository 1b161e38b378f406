"""The graders' command line: ``python -m course_utils grade NOTEBOOK...``, its subparser and the
function that runs it, registered by :func:`add_commands` (``course_utils.__main__`` dispatches)."""
from __future__ import annotations

import argparse
import sys


def _cmd_grade(args: argparse.Namespace) -> int:
    """Grade notebooks; a bad path gives one line on stderr and exit status 2, before any runs."""
    from .grade import grade_notebooks  # only when this subcommand runs
    if args.cell_timeout <= 0:
        print(f"python -m course_utils grade: error: --cell-timeout {args.cell_timeout} must be more "
              f"than 0 seconds per cell; pass e.g. --cell-timeout 600.", file=sys.stderr)
        return 2
    try:
        results = grade_notebooks(args.notebooks, cell_timeout=args.cell_timeout)  # one pytest run
    except (OSError, ValueError) as exc:   # a path that is not a notebook, before anything runs
        print(f"python -m course_utils grade: error: {exc}", file=sys.stderr)
        return 2
    for result in results:
        print(result)
    return 1 if any(not r.passed for r in results) else 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Add ``grade`` (its runner as ``func``) to the command line's subparsers ``sub``."""
    p = sub.add_parser("grade", help="grade exercise notebooks (runs them through nbval)",
                       description="Run each notebook top to bottom in a fresh kernel with "
                                   "pytest --nbval-lax and print pass/fail per exercise. "
                                   "Exit status 0 only when every exercise passes.")
    p.add_argument("notebooks", nargs="+", metavar="NOTEBOOK", help="e.g. exercises/00_measure_first.ipynb")
    p.add_argument("--cell-timeout", type=int, default=600, help="seconds per cell (default 600)")
    p.set_defaults(func=_cmd_grade)
