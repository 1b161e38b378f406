"""The tools' command line: ``python -m course_utils bench | tune | diagnose``, each subparser
and the function that runs it, registered by :func:`add_commands` (``course_utils.__main__``
dispatches); also how diagnose's argv splits from the script's, and its exit status."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ..checks import check_folder
from ..image_folder import ImageFolderDataset
from ..measurement import jsonable
from .diagnose import OUT_OF_SCOPE, DiagnoseError, diagnose_script, parse_try
from .diagnose.rules import named_failure
from .diagnose.script import VALUED_OPTIONS
from .tune.search import MIN_BUDGET_S, TuningInterrupted, folder_for_tuning, tune_loader


def print_and_save(result: Any, json_path: str | None) -> None:
    """Print a result; ``--json PATH`` writes its ``to_dict()`` as strict JSON (unmeasured: null)."""
    print(result)
    if json_path:
        text = json.dumps(jsonable(result.to_dict()), indent=2, allow_nan=False)
        Path(json_path).write_text(text + "\n", encoding="utf-8")
        print(f"wrote {json_path}")


def _error(command: str, message: str, code: int = 2) -> int:
    """One line on stderr; the exit status ``code``."""
    print(f"python -m course_utils {command}: error: {message}", file=sys.stderr)
    return code


def _cmd_bench(args: argparse.Namespace) -> int:
    """Run the benchmark; sizes too small to time give one line on stderr and exit status 2."""
    from .bench.run import benchmark_sizes, run_benchmark  # only when this subcommand runs
    try:
        n, batch_size, repeats = benchmark_sizes(args.images, args.batch_size, args.repeats,
                                                 names=("--images ", "--batch-size "))
    except ValueError as exc:
        return _error("bench", str(exc))
    result = run_benchmark(n=n, batch_size=batch_size, repeats=repeats,
                           storage=not args.no_storage, progress=not args.no_progress)
    print_and_save(result, args.json)
    return 0


def _cmd_tune(args: argparse.Namespace) -> int:
    """Tune a loader; bad input gives one line on stderr and exit status 2, never a traceback;
    Ctrl-C gives one line (the best setting measured so far) and exit status 130."""
    if args.folder is not None and args.course_data:
        return _error("tune", "give a FOLDER or --course-data, not both.")
    if not args.budget >= MIN_BUDGET_S:
        return _error("tune", f"--budget {args.budget:g} is too small to try anything; pass --budget "
                    f"{MIN_BUDGET_S:g} or more, e.g. --budget 60.")
    if not (0 <= args.step_ms < float("inf")):
        return _error("tune", f"--step-ms {args.step_ms:g} must be 0 or more (milliseconds your training "
                    f"step takes per batch); pass e.g. --step-ms 50.")
    try:
        data, fail = None, lambda message: _error("tune", message)
        if args.folder is not None:
            try:
                hint = "pass the folder that holds your images, or --course-data."
                data = ImageFolderDataset(check_folder(args.folder, "FOLDER", hint), skip_damaged=True)
            except OSError as e:                               # check_folder's
                return fail(str(e))
            except ValueError:                                 # the dataset's: nothing to read
                return fail(f"FOLDER {args.folder!r} has no images (.jpg, .jpeg, .png, .bmp, .webp, "
                            f"searched in sub-folders too); pass a folder with images.")
            try:
                data = folder_for_tuning(data, f"FOLDER {args.folder!r}")
            except ValueError as exc:
                return fail(str(exc))
            if data.damaged:
                print(f"python -m course_utils tune: warning: FOLDER {args.folder!r}: "
                      f"{data.damaged_summary()}; tuning the {len(data)} others.", file=sys.stderr)
        try:
            result = tune_loader(data, budget_s=args.budget, batch_size=args.batch_size, size=args.size,
                                 n_images=args.images, step_s=args.step_ms / 1e3 if args.step_ms else None,
                                 epoch_samples=args.epoch_images, compare_with_baselines=not args.no_compare,
                                 progress=not args.no_progress)
        except (ValueError, TypeError, FileNotFoundError) as exc:
            return fail(str(exc).splitlines()[0])
        print_and_save(result, args.json)
        if args.plot:
            result.plot().savefig(args.plot, dpi=100)
            print(f"wrote {args.plot}")
        return 0
    except TuningInterrupted as exc:
        print(f"python -m course_utils tune: {exc}", file=sys.stderr)
    except KeyboardInterrupt:
        print("python -m course_utils tune: interrupted; no result to show.", file=sys.stderr)
    return 130


def _cmd_diagnose(args: argparse.Namespace) -> int:
    """``diagnose``: one line and exit 2 on bad input, exit 130 on Ctrl-C; a script that fails
    exits with its own status after what was measured."""
    target = args.module or args.target
    if target is None:
        return _error("diagnose", "name your training script (diagnose train.py [ARGS...]) or a "
                                  "module (diagnose -m package.train [ARGS...]).")
    script_args = ([args.target] if args.module and args.target else []) + list(args.args)
    try:
        tries = [parse_try(t) for t in args.tries] if args.tries else None
        result = diagnose_script(target, script_args, module=bool(args.module),
                                 budget_s=args.budget, tries=tries, progress=not args.no_progress)
    except DiagnoseError as exc:
        return _error("diagnose", str(exc))
    except KeyboardInterrupt:
        return _error("diagnose", "interrupted (Ctrl-C); no workers left running.", 130)
    print_and_save(result, args.json)
    return script_exit_status(result)


def script_exit_status(result: Any) -> int:
    """The script's own failure (after its own traceback; 2 for a usage error), 130 for Ctrl-C,
    2 when no loader was measured or it is out of scope, else 0."""
    run = result.baseline
    if run.end == OUT_OF_SCOPE:
        print(f"python -m course_utils diagnose: {run.error}", file=sys.stderr)
        return 2
    if run.error and not named_failure(run.error):   # a failure of lesson 09's: its line says it
        sys.stdout.flush()                     # the report first, then the script's traceback
        print(run.error, file=sys.stderr, end="")
    return run.status or (2 if result.verdict is None else 0)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be 1 or more")
    return value


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Add ``bench``, ``tune`` and ``diagnose`` to the command line's subparsers ``sub``, each
    with ``func`` (its runner, returning the exit status) as a default."""
    bench = p = sub.add_parser("bench", help="the recipes learners run vs the tuned pipeline, on JPEG files",
                       description="Measure side by side, repeats interleaved, on the course JPEGs as files: "
                       "the seed recipe, pytorch/examples' ImageNet recipe, the course's tuned pipeline, a "
                       "decode-only pass; then storage (RAM, warm and cold page cache, np.memmap). Prints "
                       "samples/s, CPU-s/sample and the ratios to their targets.")
    p.add_argument("--images", type=_positive_int, default=None,
                   help="dataset size (default: 2000, or 400 in quick mode; more where every "
                        "loader's batches in flight and 10 timed need more)")
    p.add_argument("--batch-size", type=_positive_int, default=None,
                   help="batch size (default: 64, or 16 in quick mode)")
    p.add_argument("--repeats", type=_positive_int, default=None,
                   help="repeats per pipeline (default: 5, or 2 in quick mode)")
    p.add_argument("--no-storage", action="store_true",
                   help="skip the storage rows (RAM, cold cache, packed store)")

    tune = p = sub.add_parser("tune", help="find fast DataLoader settings (your images or the course data)",
                       description="Search the DataLoader settings for a folder of your images (or the "
                       "course data) within --budget seconds, your training step (--step-ms) consuming each "
                       "batch; compare the best with the common recipe and the defaults, recommend the "
                       "winner and print its DataLoader call. Ctrl-C stops with the best so far.",
                       epilog="examples: python -m course_utils tune ~/photos --budget 60 --step-ms 50\n"
                              "          python -m course_utils tune --course-data --budget 60",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folder", nargs="?", metavar="FOLDER", default=None,
                   help="folder of images (searched recursively); omit it to tune the course data")
    p.add_argument("--course-data", action="store_true",
                   help="tune the course's JPEG dataset (the same as giving no FOLDER)")
    p.add_argument("--budget", type=float, default=60.0, metavar="SECONDS",
                   help="wall-clock seconds for the search and the comparison (default 60)")
    p.add_argument("--batch-size", type=_positive_int, default=None,
                   help="batch size to start from, also used by the baselines (default 64, or "
                        "32 in quick mode)")
    p.add_argument("--size", type=_positive_int, default=224,
                   help="images are resized to SIZE x SIZE pixels (default 224)")
    p.add_argument("--images", type=_positive_int, default=None,
                   help="course data only: number of images (default 2000, or 200 in quick mode)")
    p.add_argument("--step-ms", type=float, default=0.0, metavar="MS",
                   help="your training step's milliseconds per batch, slept after each batch (a "
                        "GPU step that leaves the CPU free; default 0: the loader alone)")
    p.add_argument("--epoch-images", type=_positive_int, default=None, metavar="N",
                   help="images per epoch of your training, for the start-up share of the score "
                        "(default: the dataset's length)")
    p.add_argument("--no-compare", action="store_true",
                   help="skip the side-by-side comparison (the whole budget goes to the search)")
    p.add_argument("--plot", metavar="PNG", help="also save the plot")

    p = sub.add_parser(
        "diagnose", help="is your training waiting for data, and what helps? (train.py [ARGS])",
        description="Runs your training script unchanged, as python would (its own arguments, its\n"
                    "__main__ block), and times every DataLoader batch. A loader with enough timed\n"
                    "batches gets its figures; the busiest gives the verdict (data-bound or not);\n"
                    "the fixes (--try, or a default set when data-bound) that fit --budget are re-run.",
        epilog="examples: python -m course_utils diagnose train.py --epochs 1\n"
               "          python -m course_utils diagnose --budget 40 --try num_workers=4 train.py\n"
               "          python -m course_utils diagnose -m mypackage.train --lr 0.1\n"
               "options go before the script; everything after it is the script's own.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-m", dest="module", metavar="MODULE", default=None,
                   help="run a module as a script (like python -m MODULE)")
    p.add_argument("target", nargs="?", metavar="SCRIPT", help="your training script (train.py)")
    p.add_argument("args", nargs="*", metavar="ARGS", help="the script's own arguments")
    p.add_argument("--budget", type=float, default=60.0, metavar="SECONDS",
                   help="seconds of measuring (default 60): half runs the script as it is, the "
                        "fixes share the rest; each run's Python start-up comes on top")
    p.add_argument("--try", dest="tries", action="append", metavar="KEY=VALUE[,...]",
                   help="a fix to measure on the script's busiest loader, e.g. num_workers=4 or "
                        "num_workers=4,pin_memory=true (repeat for several; keys: num_workers, "
                        "batch_size, prefetch_factor, pin_memory, persistent_workers)")
    for p, run in ((bench, _cmd_bench), (tune, _cmd_tune), (p, _cmd_diagnose)):
        p.add_argument("--json", metavar="PATH", help="also write the result as JSON")
        p.add_argument("--no-progress", action="store_true", help="no progress output")
        p.set_defaults(func=run)


def split_diagnose_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """``diagnose``'s own arguments (up to the script, or ``-m MODULE``) and the script's: after
    the script everything is the script's, even what looks like diagnose's options."""
    k = 1
    while k < len(argv):
        token = argv[k]
        if token == "-m":
            return argv[:k + 2], argv[k + 2:]
        if token in VALUED_OPTIONS:
            k += 2
        elif token.split("=")[0] in VALUED_OPTIONS or token in ("--no-progress", "-h", "--help"):
            k += 1
        elif token.startswith("-"):
            return argv, []          # an unknown option: argparse says so
        else:
            return argv[:k + 1], argv[k + 1:]
    return argv, []
