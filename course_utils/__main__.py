"""Command line for the course: ``python -m course_utils COMMAND``.

Commands: doctor, grade NOTEBOOK, bench, tune [FOLDER], diagnose MODULE:FUNCTION (``--help``
says what each does). The authors' commands are ``python -m course_authoring``.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import Any, Callable, Sequence

from .checks import check_folder
from .config import QUICK_ENV
from .image_folder import ImageFolderDataset
from .machine import doctor
from .tools.tune.search import MIN_BUDGET_S, TuningInterrupted, folder_for_tuning, tune_loader


def _cmd_doctor(args: argparse.Namespace) -> int:
    report = doctor()
    print(json.dumps(report.to_dict(), indent=2, default=str) if args.json else report.render())
    return 0


def _cmd_grade(args: argparse.Namespace) -> int:
    """Grade notebooks; a bad path gives one line on stderr and exit status 2, before any runs."""
    from .grading.grade import grade_notebooks, read_notebook  # only when this subcommand runs
    if args.cell_timeout <= 0:
        print(f"python -m course_utils grade: error: --cell-timeout {args.cell_timeout} must be more "
              f"than 0 seconds per cell; pass e.g. --cell-timeout 600.", file=sys.stderr)
        return 2
    for notebook in args.notebooks:
        try:
            read_notebook(notebook, argument="NOTEBOOK")
        except (OSError, ValueError) as exc:
            print(f"python -m course_utils grade: error: {exc}", file=sys.stderr)
            return 2
    results = grade_notebooks(args.notebooks, cell_timeout=args.cell_timeout)   # one pytest run
    for result in results:
        print(result)
    return 1 if any(not r.passed for r in results) else 0


def _print_and_save(result: Any, json_path: str | None) -> None:
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
    from .tools.bench.run import benchmark_sizes, run_benchmark  # only when this subcommand runs
    try:
        n, batch_size, repeats = benchmark_sizes(args.images, args.batch_size, args.repeats,
                                                 names=("--images ", "--batch-size "))
    except ValueError as exc:
        print(f"python -m course_utils bench: error: {exc}", file=sys.stderr)
        return 2
    result = run_benchmark(n=n, batch_size=batch_size, repeats=repeats,
                           storage=not args.no_storage, progress=not args.no_progress)
    _print_and_save(result, args.json)
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
    _print_and_save(result, args.json)
    if args.plot:
        result.plot().savefig(args.plot, dpi=100)
        print(f"wrote {args.plot}")
    return 0


def _cmd_diagnose(args: argparse.Namespace) -> int:
    """``diagnose``: one line and exit 2 on bad input, exit 130 on Ctrl-C."""
    from .tools.diagnose import DiagnoseError, build_loop, diagnose, load_target  # only when it runs

    def fail(message: str, code: int = 2) -> int:
        print(f"python -m course_utils diagnose: error: {message}", file=sys.stderr)
        return code

    if not args.budget > 0:
        return fail(f"--budget {args.budget:g} must be more than 0 seconds; pass e.g. --budget 60.")
    if args.steps < 1:
        return fail(f"--steps {args.steps} must be 1 or more; pass e.g. --steps 200.")
    try:
        t0 = time.perf_counter()
        loader, step = build_loop(load_target(args.target), args.target.rpartition(":")[2])
        built_s = time.perf_counter() - t0
        result = diagnose(loader, step, budget_s=args.budget, max_steps=args.steps,
                          target=args.target, progress=not args.no_progress)
        result.notes.append(f"importing the module and {args.target.rpartition(':')[2]}() took "
                            f"{built_s:.1f} s before the --budget of {args.budget:g} s began; "
                            f"worker start-ups inside the runs may also overrun it a little.")
    except DiagnoseError as exc:
        return fail(str(exc))
    except KeyboardInterrupt:
        return fail("interrupted (Ctrl-C); no workers left running.", 130)
    _print_and_save(result, args.json)
    return 0


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m course_utils",
        description="Feed the GPU: helpers for the PyTorch data-loading course.",
        epilog=f"Set {QUICK_ENV}=1 to shrink every experiment (quick mode). Authors: "
               f"python -m course_authoring --help (make-exercises, hosted-cell, gpu-check).")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("doctor", help="describe this machine for data loading, with advice",
                       description="Usable CPUs, every thread pool, torch build, accelerator, "
                                   "start method, and advice derived from them.")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=_cmd_doctor)

    p = sub.add_parser("grade", help="grade exercise notebooks (runs them through nbval)",
                       description="Run each notebook top to bottom in a fresh kernel with "
                                   "pytest --nbval-lax and print pass/fail per exercise. "
                                   "Exit status 0 only when every exercise passes.")
    p.add_argument("notebooks", nargs="+", metavar="NOTEBOOK",
                   help="e.g. exercises/00_measure_first.ipynb")
    p.add_argument("--cell-timeout", type=int, default=600, help="seconds per cell (default 600)")
    p.set_defaults(func=_cmd_grade)

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
        "diagnose", help="is your training loop waiting for data, and why? (MODULE:FUNCTION)",
        description="FUNCTION() must return (loader, step). diagnose times your loop within "
                    "--budget seconds, the step alone and the loader alone; says data-bound or "
                    "compute-bound and, when data-bound, times the cheap fixes on the same loop.",
        epilog="examples: python -m course_utils diagnose train.py:make_loop --budget 60\n"
               "          python -m course_utils diagnose course_utils.tools.examples.data_bound:make_loop",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target", metavar="MODULE:FUNCTION",
                   help="a .py file or importable module, a colon, and the function that returns "
                        "(loader, step)")
    p.add_argument("--budget", type=float, default=60.0, metavar="SECONDS",
                   help="wall-clock seconds for the measurements (default 60); building your "
                        "loader comes before it")
    p.add_argument("--steps", type=int, default=200, help="at most this many timed steps per run "
                                                          "(default 200)")
    p.add_argument("--json", metavar="PATH", help="also write the result as JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_diagnose)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
