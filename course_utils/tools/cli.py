"""The tools' command line: ``python -m course_utils bench | tune | diagnose``, each subparser
and the function that runs it, registered by :func:`add_commands` (``course_utils.__main__``
dispatches); also how diagnose's argv splits from the script's, and its exit status."""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any, Callable

from ..checks import check_folder
from ..image_folder import ImageFolderDataset
from .tune.search import MIN_BUDGET_S, TuningInterrupted, folder_for_tuning, tune_loader


def print_and_save(result: Any, json_path: str | None) -> None:
    """Print a result; with ``--json PATH`` also write its ``to_dict()`` there as strict JSON:
    a NaN or infinite float (a figure that was not measured) is written as null."""
    def finite(value: Any) -> Any:
        if isinstance(value, float):
            return value if math.isfinite(value) else None
        if isinstance(value, dict):
            return {k: finite(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [finite(v) for v in value]
        return value

    print(result)
    if json_path:
        text = json.dumps(finite(result.to_dict()), indent=2, default=str, allow_nan=False)
        with open(json_path, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
        print(f"wrote {json_path}")


def _cmd_bench(args: argparse.Namespace) -> int:
    """Run the benchmark; sizes too small to time give one line on stderr and exit status 2."""
    from .bench.run import benchmark_sizes, run_benchmark  # only when this subcommand runs
    try:
        n, batch_size, repeats = benchmark_sizes(args.images, args.batch_size, args.repeats,
                                                 names=("--images ", "--batch-size "))
    except ValueError as exc:
        print(f"python -m course_utils bench: error: {exc}", file=sys.stderr)
        return 2
    result = run_benchmark(n=n, batch_size=batch_size, repeats=repeats,
                           storage=not args.no_storage, progress=not args.no_progress)
    print_and_save(result, args.json)
    return 0


def _cmd_tune(args: argparse.Namespace) -> int:
    """Tune a loader; bad input gives one line on stderr and exit status 2, never a traceback;
    Ctrl-C gives one line (the best setting measured so far) and exit status 130."""
    def fail(message: str) -> int:
        print(f"python -m course_utils tune: error: {message}", file=sys.stderr)
        return 2

    if args.folder is not None and args.course_data:
        return fail("give a FOLDER or --course-data, not both.")
    if not args.budget >= MIN_BUDGET_S:
        return fail(f"--budget {args.budget:g} is too small to try anything; pass --budget "
                    f"{MIN_BUDGET_S:g} or more, e.g. --budget 60.")
    if not (0 <= args.step_ms < float("inf")):
        return fail(f"--step-ms {args.step_ms:g} must be 0 or more (milliseconds your training "
                    f"step takes per batch); pass e.g. --step-ms 50.")
    try:
        return _tune(args, fail)
    except TuningInterrupted as exc:
        print(f"python -m course_utils tune: {exc}", file=sys.stderr)
    except KeyboardInterrupt:
        print("python -m course_utils tune: interrupted; no result to show.", file=sys.stderr)
    return 130


def _tune(args: argparse.Namespace, fail: Callable[[str], int]) -> int:
    """The body of ``tune`` (Ctrl-C is handled by :func:`_cmd_tune`)."""
    data = None
    if args.folder is not None:
        try:
            folder = check_folder(args.folder, "FOLDER", "pass the folder that holds your images, "
                                  "or --course-data.")
        except OSError as e:
            return fail(str(e))
        try:
            data = ImageFolderDataset(folder, skip_damaged=True)
        except ValueError:
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
        result = tune_loader(data, budget_s=args.budget, batch_size=args.batch_size,
                             size=args.size, n_images=args.images,
                             step_s=args.step_ms / 1e3 if args.step_ms else None,
                             epoch_samples=args.epoch_images,
                             compare_with_baselines=not args.no_compare,
                             progress=not args.no_progress)
    except (ValueError, TypeError, FileNotFoundError) as exc:
        return fail(str(exc).splitlines()[0])
    print_and_save(result, args.json)
    if args.plot:
        result.plot().savefig(args.plot, dpi=100)
        print(f"wrote {args.plot}")
    return 0


def _is_function_target(target: str) -> bool:
    """``MODULE:FUNCTION`` (the older way in), not a script path that happens to hold a colon."""
    module, sep, function = target.rpartition(":")
    return bool(sep and module and function.isidentifier()) and not Path(target).is_file()


def _cmd_diagnose(args: argparse.Namespace) -> int:
    """``diagnose``: one line and exit 2 on bad input, exit 130 on Ctrl-C; a script that fails
    exits with its own status after what was measured."""
    from .diagnose import (DiagnoseError, build_loop, diagnose,  # only when it runs
                                 diagnose_script, load_target, parse_try)

    def fail(message: str, code: int = 2) -> int:
        print(f"python -m course_utils diagnose: error: {message}", file=sys.stderr)
        return code

    if not args.budget > 0:
        return fail(f"--budget {args.budget:g} must be more than 0 seconds; pass e.g. --budget 60.")
    if args.steps < 1:
        return fail(f"--steps {args.steps} must be 1 or more; pass e.g. --steps 200.")
    target = args.module or args.target
    if target is None:
        return fail("name your training script (diagnose train.py [ARGS...]), a module "
                    "(diagnose -m package.train [ARGS...]) or MODULE:FUNCTION.")
    script_args = ([args.target] if args.module and args.target else []) + list(args.args)
    try:
        if args.module or not _is_function_target(target):
            tries = [parse_try(t) for t in args.tries] if args.tries else None
            result = diagnose_script(target, script_args, module=bool(args.module),
                                     budget_s=args.budget, tries=tries,
                                     progress=not args.no_progress)
            print_and_save(result, args.json)
            return script_exit_status(result)
        if args.tries or script_args:
            return fail("--try and script arguments are for a script (diagnose train.py ...), "
                        "not for MODULE:FUNCTION.")
        t0 = time.perf_counter()
        loader, step = build_loop(load_target(target), target.rpartition(":")[2])
        built_s = time.perf_counter() - t0
        result = diagnose(loader, step, budget_s=args.budget, max_steps=args.steps,
                          target=target, progress=not args.no_progress)
        result.notes.append(f"importing the module and {target.rpartition(':')[2]}() took "
                            f"{built_s:.1f} s before the --budget of {args.budget:g} s began; "
                            f"worker start-ups inside the runs may also overrun it a little.")
    except DiagnoseError as exc:
        return fail(str(exc))
    except KeyboardInterrupt:
        return fail("interrupted (Ctrl-C); no workers left running.", 130)
    print_and_save(result, args.json)
    return 0


def script_exit_status(result: Any) -> int:
    """The script's own failure (after its traceback), 130 for Ctrl-C, 2 when nothing was timed
    or it is out of scope, else 0."""
    from .diagnose.probe import OUT_OF_SCOPE   # only when diagnose runs
    run = result.baseline
    if run.end == OUT_OF_SCOPE:
        print(f"python -m course_utils diagnose: {run.error}", file=sys.stderr)
        return 2
    if run.error:
        print(run.error, file=sys.stderr, end="")
    if run.status:
        return run.status
    return 2 if result.verdict is None else 0


def _number_of(unit: str) -> Callable[[str], float]:
    """An argparse type: a float, or an error that names the unit."""
    def parse(text: str) -> float:
        try:
            return float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of {unit}") from None
    return parse


_seconds, _milliseconds = _number_of("seconds"), _number_of("milliseconds")


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
    p = sub.add_parser("bench", help="the recipes learners run vs the tuned pipeline, on JPEG files",
                       description="Measure, on the course JPEGs written as files and side by side "
                                   "with repeats interleaved, the seed recipe, the pytorch/examples "
                                   "ImageNet training recipe, the course's tuned pipeline and a decode-only "
                                   "pass; then storage (RAM, warm and cold page cache, np.memmap). "
                                   "Prints samples/s, CPU-s/sample and the ratios to their targets.")
    p.add_argument("--images", type=_positive_int, default=None,
                   help="dataset size (default: 2000, or 400 in quick mode; more where every "
                        "loader's batches in flight and 10 timed need more)")
    p.add_argument("--batch-size", type=_positive_int, default=None,
                   help="batch size (default: 64, or 16 in quick mode)")
    p.add_argument("--repeats", type=_positive_int, default=None,
                   help="repeats per pipeline (default: 5, or 2 in quick mode)")
    p.add_argument("--no-storage", action="store_true",
                   help="skip the storage rows (RAM, cold cache, packed store)")
    p.add_argument("--json", metavar="PATH", help="also write the result as JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=_cmd_bench)

    p = sub.add_parser("tune", help="find fast DataLoader settings (your images or the course data)",
                       description="Search the DataLoader settings for a folder of your images "
                                   "(or the course data) within --budget seconds, your training "
                                   "step (--step-ms) consuming each batch; compare the best with "
                                   "the common recipe and the defaults, recommend the winner and "
                                   "print its DataLoader call. Ctrl-C stops with the best so far.",
                       epilog="examples: python -m course_utils tune ~/photos --budget 60 --step-ms 50\n"
                              "          python -m course_utils tune --course-data --budget 60",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folder", nargs="?", metavar="FOLDER", default=None,
                   help="folder of images (searched recursively); omit it to tune the course data")
    p.add_argument("--course-data", action="store_true",
                   help="tune the course's JPEG dataset (the same as giving no FOLDER)")
    p.add_argument("--budget", type=_seconds, default=60.0, metavar="SECONDS",
                   help="wall-clock seconds for the search and the comparison (default 60)")
    p.add_argument("--batch-size", type=_positive_int, default=None,
                   help="batch size to start from, also used by the baselines (default 64, or "
                        "32 in quick mode)")
    p.add_argument("--size", type=_positive_int, default=224,
                   help="images are resized to SIZE x SIZE pixels (default 224)")
    p.add_argument("--images", type=_positive_int, default=None,
                   help="course data only: number of images (default 2000, or 200 in quick mode)")
    p.add_argument("--step-ms", type=_milliseconds, default=0.0, metavar="MS",
                   help="your training step's milliseconds per batch, slept after each batch (a "
                        "GPU step that leaves the CPU free; default 0: the loader alone)")
    p.add_argument("--epoch-images", type=_positive_int, default=None, metavar="N",
                   help="images per epoch of your training, for the start-up share of the score "
                        "(default: the dataset's length)")
    p.add_argument("--no-compare", action="store_true",
                   help="skip the side-by-side comparison (the whole budget goes to the search)")
    p.add_argument("--json", metavar="PATH", help="also write the result as JSON")
    p.add_argument("--plot", metavar="PNG", help="also save the plot")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_tune)

    p = sub.add_parser(
        "diagnose", help="is your training waiting for data, and what helps? (train.py [ARGS])",
        description="Runs your training script unchanged, as python would (its own arguments,\n"
                    "its __main__ block), and times every DataLoader batch it makes. It reports\n"
                    "each loader (wait per batch, step, data-wait share, start-up, settings,\n"
                    "workers), says data-bound or compute-bound, and re-runs the script with\n"
                    "fixes (--try, or a default set when data-bound) to measure them.\n"
                    "MODULE:FUNCTION (a function returning (loader, step)) also works.",
        epilog="examples: python -m course_utils diagnose train.py --epochs 1\n"
               "          python -m course_utils diagnose --budget 40 --try num_workers=4 train.py\n"
               "          python -m course_utils diagnose -m mypackage.train --lr 0.1\n"
               "          python -m course_utils diagnose course_utils.tools.examples.data_bound:make_loop\n"
               "options go before the script; everything after it is the script's own.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-m", dest="module", metavar="MODULE", default=None,
                   help="run a module as a script (like python -m MODULE)")
    p.add_argument("target", nargs="?", metavar="SCRIPT",
                   help="your training script (train.py), or MODULE:FUNCTION")
    p.add_argument("args", nargs="*", metavar="ARGS", help="the script's own arguments")
    p.add_argument("--budget", type=float, default=60.0, metavar="SECONDS",
                   help="seconds of measuring (default 60): half runs the script as it is, the "
                        "fixes share the rest; each run's Python start-up comes on top")
    p.add_argument("--try", dest="tries", action="append", metavar="KEY=VALUE[,...]",
                   help="a fix to measure on the script's busiest loader, e.g. num_workers=4 or "
                        "num_workers=4,pin_memory=true (repeat for several; keys: num_workers, "
                        "batch_size, prefetch_factor, pin_memory, persistent_workers)")
    p.add_argument("--steps", type=int, default=200, help="MODULE:FUNCTION only: at most this "
                                                          "many timed steps per run (default 200)")
    p.add_argument("--json", metavar="PATH", help="also write the result as JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress messages")
    p.set_defaults(func=_cmd_diagnose)


#: diagnose's own options that take a value (the script's arguments start after them)
_DIAGNOSE_VALUED = {"--budget", "--try", "--steps", "--json"}


def split_diagnose_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """``diagnose``'s own arguments (up to the script, or ``-m MODULE``) and the script's: after
    the script everything is the script's, even what looks like diagnose's options. After a
    ``MODULE:FUNCTION`` target, options are still diagnose's."""
    k = 1
    while k < len(argv):
        token = argv[k]
        if token == "-m":
            return argv[:k + 2], argv[k + 2:]
        if token in _DIAGNOSE_VALUED:
            k += 2
        elif token.startswith("-") and (token.split("=")[0] in _DIAGNOSE_VALUED
                                        or token in ("--no-progress", "-h", "--help")):
            k += 1
        elif token.startswith("-") or _is_function_target(token):
            return argv, []          # an unknown option (argparse says so), or MODULE:FUNCTION
        else:
            return argv[:k + 1], argv[k + 1:]
    return argv, []
