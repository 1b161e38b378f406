"""``python -m course_utils doctor | grade | bench | tune | diagnose`` (``--help`` says what each
does): the dispatcher and ``doctor``; each layer's commands are in its own ``cli``
(``grading.cli``: grade; ``tools.cli``: bench, tune, diagnose)."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from .config import QUICK_ENV
from .grading import cli as grading_cli
from .machine import doctor
from .tools import cli as tools_cli


def _cmd_doctor(args: argparse.Namespace) -> int:
    report = doctor()
    print(json.dumps(report.to_dict(), indent=2, default=str) if args.json else report.render())
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m course_utils",
        description="Feed the GPU: helpers for the PyTorch data-loading course.",
        epilog=f"Set {QUICK_ENV}=1 to shrink every experiment (quick mode). Authors: "
               f"python -m course_authoring --help (make-exercises, hosted-cell, gpu-check).")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("doctor", help="describe this machine for data loading, with advice",
                       description="Usable CPUs, every thread pool, torch build, accelerator, "
                                   "start method, and advice derived from them.")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=_cmd_doctor)
    grading_cli.add_commands(sub)      # grade
    tools_cli.add_commands(sub)        # bench, tune, diagnose (in this order in --help)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    script_args: list[str] = []
    if argv[:1] == ["diagnose"]:
        argv, script_args = tools_cli.split_diagnose_argv(argv)
    args = build_parser().parse_args(argv)
    if script_args:
        args.args = list(getattr(args, "args", []) or []) + script_args
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
