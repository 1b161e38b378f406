#!/usr/bin/env python3
"""Time every lesson notebook, quick and full mode, and write the table into README.md.

    make runtimes                                           # every lesson, both modes (slow)
    .venv/bin/python tools/lesson_runtimes.py --quick-only --lessons 00 03

Each notebook in notebooks/ runs top to bottom in a fresh kernel (nbclient), once in quick
mode and once in full mode; the wall time includes starting the kernel. The table, with the
machine and the date, replaces whatever stands between the two marker comments in README.md:

    <!-- lesson-runtimes:start -->
    ...
    <!-- lesson-runtimes:end -->

A notebook that fails is shown as failed, with the first line of its error, and the others
still run; the exit code is then 1. The raw results go to build/lesson_runtimes.json (the
table can be rebuilt from it with --from-json). --check only checks that README.md has a
table between the markers.
"""
from __future__ import annotations

import argparse
import atexit
import datetime as _dt
import json
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
README = ROOT / "README.md"
DEFAULT_JSON = ROOT / "build" / "lesson_runtimes.json"
START = "<!-- lesson-runtimes:start -->"
END = "<!-- lesson-runtimes:end -->"
PLACEHOLDER = ("_Not measured yet: `make runtimes` writes this table (the wall time of each "
               "lesson in quick and full mode, on the machine it runs on)._")
MODES = ("quick", "full")
TABLE_HEADER = "| lesson | quick mode | full mode |"
START_ATTEMPTS = 2  # a kernel that dies before running any cell is started once more


class MarkerError(ValueError):
    pass


@dataclass
class Result:
    lesson: str              # notebook stem, e.g. 00_measure_first
    path: str                # notebook path relative to the repository
    mode: str                # quick | full
    ok: bool
    seconds: float
    error: str | None = None  # first line of the error when not ok


# --------------------------------------------------------------------------------------
# finding and running notebooks
# --------------------------------------------------------------------------------------
def discover(notebooks_dir: Path = NOTEBOOKS, lessons: list[str] | None = None) -> list[Path]:
    """The lesson notebooks, sorted; ``lessons`` keeps those whose name starts with one of
    them ('00', '03_num_workers'). Raises ValueError naming an unknown lesson."""
    found = sorted(p for p in notebooks_dir.glob("*.ipynb") if not p.name.startswith("."))
    if not lessons:
        return found
    chosen = []
    for want in lessons:
        stem = Path(want).stem
        matches = [p for p in found if p.stem.startswith(stem)]
        if not matches:
            raise ValueError(f"no lesson {want!r} in {notebooks_dir} (there are: "
                             + ", ".join(p.stem for p in found) + ")")
        chosen += [p for p in matches if p not in chosen]
    return sorted(chosen)


def _first_line(text: str) -> str:
    return next((line.strip() for line in str(text).splitlines() if line.strip()), "")


def run_notebook(path: Path, quick: bool, timeout: float, kernel_log: Path | None = None) -> Result:
    """Execute ``path`` top to bottom in a fresh kernel; never raises for a notebook's error."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    from course_utils.config import QUICK_ENV
    from course_utils.grading.kernels import kernel_manager_class

    nb = nbformat.read(path, as_version=4)
    env = dict(os.environ)
    env[QUICK_ENV] = "1" if quick else "0"
    env.pop("MPLBACKEND", None)  # the kernel's inline backend, as in JupyterLab
    rel = _rel(path)
    mode = "quick" if quick else "full"
    for attempt in range(1, START_ATTEMPTS + 1):
        current = {"index": None}
        start = time.monotonic()
        deadline = start + timeout

        def on_cell_start(cell, cell_index, **_):
            current["index"] = cell_index

        client = NotebookClient(
            nb,
            timeout_func=lambda cell: max(1, int(deadline - time.monotonic()) + 1),
            kernel_name=nb.metadata.get("kernelspec", {}).get("name", "python3"),
            resources={"metadata": {"path": str(path.parent)}},
            on_cell_start=on_cell_start,
            kernel_manager_class=kernel_manager_class(),  # IPC: no port races with other kernels
        )
        error = None
        # The kernel process's own messages (not the cells' output) go to a log, not the progress.
        log_from = kernel_log.stat().st_size if kernel_log and kernel_log.exists() else 0
        log = open(kernel_log, "ab") if kernel_log else None
        launch = {"stdout": log, "stderr": log} if log else {}
        try:
            client.execute(env=env, **launch)
        except CellTimeoutError:
            error = f"{_where(nb, current['index'])}timed out after {timeout:.0f} s"
        except CellExecutionError as exc:
            detail = f"{exc.ename}: {_first_line(exc.evalue)}" if exc.ename else _first_line(str(exc))
            error = f"{_where(nb, current['index'])}{detail}"
        except DeadKernelError as exc:
            error = f"{_where(nb, current['index'])}the kernel died: {_first_line(str(exc))}"
        except Exception as exc:  # a kernel that does not start, ...
            error = f"{type(exc).__name__}: {_first_line(str(exc))}"
        finally:
            if log:
                log.close()
            # nbclient leaves its at-exit clean-up registered when the kernel fails to start,
            # and that clean-up then fails at exit with an AssertionError: drop it.
            atexit.unregister(client._cleanup_kernel)
        if error is None or current["index"] is not None:
            break
        # The kernel never ran a cell: it did not start. That is the machine, not the lesson
        # (e.g. two kernels starting at once raced for the same port), so start it once more.
        why = _last_line_since(kernel_log, log_from)
        if why:
            error += f" (kernel said: {why})"
        if attempt < START_ATTEMPTS:
            print(f"(kernel did not start: {error}; starting it again)", end=" ", flush=True)
    seconds = time.monotonic() - start
    return Result(path.stem, rel, mode, error is None, round(seconds, 2), error)


def _last_line_since(log: Path | None, offset: int) -> str:
    """The last non-empty line the kernel wrote to ``log`` after byte ``offset``."""
    if not log or not log.exists():
        return ""
    with open(log, "rb") as f:
        f.seek(offset)
        text = f.read().decode("utf-8", "replace")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:200] if lines else ""


def _where(nb, index: int | None) -> str:
    if index is None:
        return ""
    code_no = sum(1 for c in nb.cells[: index + 1] if c.cell_type == "code")
    return f"code cell {code_no}: "


def _rel(path: Path) -> str:
    try:
        return path.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return path.as_posix()


# --------------------------------------------------------------------------------------
# the machine
# --------------------------------------------------------------------------------------
def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    if sys.platform == "darwin":
        import subprocess
        try:
            return subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True,
                                  text=True, timeout=5).stdout.strip() or platform.machine()
        except OSError:
            pass
    return platform.processor() or platform.machine() or "unknown CPU"


def machine_info() -> dict:
    import psutil
    import torch

    from course_utils.machine import accelerator, cpu_info

    cpu = cpu_info()
    acc = accelerator()
    gpu = None
    if acc.kind == "cuda":
        gpu = acc.name + (f" x{acc.count}" if acc.count > 1 else "")
    elif acc.kind == "mps":
        gpu = "Apple MPS"
    return {
        "usable_cpus": cpu.usable,
        "logical_cpus": cpu.logical,
        "cpu_model": _cpu_model(),
        "ram_bytes": int(psutil.virtual_memory().total),
        "gpu": gpu,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": f"{platform.system()} {platform.machine()}",
    }


def describe_machine(m: dict) -> str:
    cpus = f"{m['usable_cpus']} usable CPU{'s' if m['usable_cpus'] != 1 else ''}"
    if m.get("logical_cpus") and m["logical_cpus"] != m["usable_cpus"]:
        cpus += f" (of {m['logical_cpus']})"
    ram = f"{m['ram_bytes'] / 2**30:.0f} GiB RAM"
    gpu = m.get("gpu") or "no GPU"
    return (f"{cpus}, {m['cpu_model']}, {ram}, {gpu}, torch {m['torch']}, "
            f"Python {m['python']}, {m['platform']}")


# --------------------------------------------------------------------------------------
# the table and the README
# --------------------------------------------------------------------------------------
def format_seconds(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def _cell(result: Result | None) -> str:
    if result is None:
        return "not run"
    if result.ok:
        return format_seconds(result.seconds)
    error = (result.error or "error").replace("|", "\\|").replace("`", "'")
    if len(error) > 90:
        error = error[:87] + "..."
    return f"**failed** after {format_seconds(result.seconds)}: {error}"


def lesson_title(stem: str) -> str:
    """'00_measure_first' -> '00 measure first'."""
    return stem.replace("_", " ")


def render_table(results: list[Result], machine: dict, date: str,
                 readme_dir: Path = ROOT) -> str:
    """The markdown that goes between the markers (without them)."""
    from course_utils.config import QUICK_ENV

    lessons: dict[str, str] = {}
    for r in results:
        lessons.setdefault(r.lesson, r.path)
    by_key = {(r.lesson, r.mode): r for r in results}
    modes_run = [m for m in MODES if any(r.mode == m for r in results)]
    lines = [
        f"Measured by `make runtimes` on {date}: {describe_machine(machine)}. "
        f"Each lesson ran top to bottom in a fresh kernel (starting the kernel included); quick "
        f"mode is `{QUICK_ENV}=1`.",
        "",
        TABLE_HEADER,
        "|---|---:|---:|",
    ]
    for lesson in sorted(lessons):
        path = lessons[lesson]
        try:
            link = os.path.relpath(ROOT / path, readme_dir).replace(os.sep, "/")
        except ValueError:
            link = path
        row = [f"[{lesson_title(lesson)}]({link})"] + [_cell(by_key.get((lesson, m))) for m in MODES]
        lines.append("| " + " | ".join(row) + " |")
    totals = []
    for mode in MODES:
        runs = [r for r in results if r.mode == mode]
        if mode not in modes_run:
            totals.append("not run")
            continue
        total = format_seconds(sum(r.seconds for r in runs))
        failed = sum(1 for r in runs if not r.ok)
        totals.append(f"**{total}**" + (f" ({failed} failed)" if failed else ""))
    lines.append("| **all lessons** | " + " | ".join(totals) + " |")
    return "\n".join(lines)


def _marker_span(text: str) -> tuple[int, int]:
    start, end = text.find(START), text.find(END)
    if start < 0 or end < 0:
        missing = " and ".join(m for m, i in ((START, start), (END, end)) if i < 0)
        raise MarkerError(f"README has no {missing}")
    if text.count(START) > 1 or text.count(END) > 1:
        raise MarkerError("README has the lesson-runtimes markers more than once")
    if end < start:
        raise MarkerError(f"{END} comes before {START} in the README")
    return start + len(START), end


def replace_between_markers(text: str, block: str) -> str:
    """``text`` with everything between the markers replaced by ``block`` on lines of its own."""
    a, b = _marker_span(text)
    return text[:a] + "\n" + block.strip("\n") + "\n" + text[b:]


def between_markers(text: str) -> str:
    a, b = _marker_span(text)
    return text[a:b].strip("\n")


def has_table(text: str) -> bool:
    try:
        block = between_markers(text)
    except MarkerError:
        return False
    return any(line.strip().startswith(TABLE_HEADER) for line in block.splitlines())


# --------------------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="lesson_runtimes.py",
        description=("Run each lesson notebook top to bottom in a fresh kernel, in quick and in full "
                     "mode, time it, and write the table between the lesson-runtimes markers in "
                     "README.md (raw results: build/lesson_runtimes.json)."),
        epilog="Full mode of every lesson takes a long time: run it on a quiet machine.")
    p.add_argument("--lessons", nargs="+", metavar="NN",
                   help="only these lessons, by number or name prefix (e.g. --lessons 00 03)")
    p.add_argument("--quick-only", action="store_true", help="skip full mode")
    p.add_argument("--timeout", type=float, default=1800, metavar="S",
                   help="give up on a notebook after S seconds in one mode (default 1800)")
    p.add_argument("--check", action="store_true",
                   help="run nothing: exit 1 unless README.md has the table between the markers")
    p.add_argument("--dry-run", action="store_true",
                   help="print the table instead of writing it into README.md")
    p.add_argument("--from-json", metavar="PATH",
                   help="run nothing: rebuild the README table from results saved earlier")
    p.add_argument("--json", default=str(DEFAULT_JSON), metavar="PATH",
                   help="where to write the raw results (default build/lesson_runtimes.json)")
    p.add_argument("--readme", default=str(README), metavar="PATH", help=argparse.SUPPRESS)
    p.add_argument("--notebooks", default=str(NOTEBOOKS), metavar="DIR", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.timeout <= 0:
        p.error("--timeout must be positive")
    return args


def write_readme(readme: Path, table: str) -> None:
    text = readme.read_text()
    readme.write_text(replace_between_markers(text, table))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    readme = Path(args.readme)
    if args.check:
        text = readme.read_text()
        try:
            _marker_span(text)
        except MarkerError as exc:
            print(f"lesson-runtimes: {exc}", file=sys.stderr)
            return 1
        if not has_table(text):
            print(f"lesson-runtimes: {readme.name} has the markers but no table between them; "
                  "run `make runtimes`", file=sys.stderr)
            return 1
        print(f"lesson-runtimes: {readme.name} has the lesson run-time table")
        return 0
    try:  # fail before running anything for an hour
        _marker_span(readme.read_text())
    except MarkerError as exc:
        if not args.dry_run:
            print(f"lesson-runtimes: {exc}; add the two marker lines first", file=sys.stderr)
            return 1

    if args.from_json:
        data = json.loads(Path(args.from_json).read_text())
        results = [Result(**r) for r in data["results"]]
        machine, date = data["machine"], data["date"]
    else:
        try:
            notebooks = discover(Path(args.notebooks), args.lessons)
        except ValueError as exc:
            print(f"lesson-runtimes: {exc}", file=sys.stderr)
            return 2
        if not notebooks:
            print(f"lesson-runtimes: no notebooks in {args.notebooks}", file=sys.stderr)
            return 2
        machine = machine_info()
        date = _dt.date.today().isoformat()
        print(f"lesson-runtimes: {len(notebooks)} notebook(s) on {describe_machine(machine)}", flush=True)
        results = []
        out = Path(args.json)
        out.parent.mkdir(parents=True, exist_ok=True)
        kernel_log = out.with_suffix(".kernels.log")
        kernel_log.write_text("")
        modes = ("quick",) if args.quick_only else MODES
        for mode in modes:
            for i, path in enumerate(notebooks, 1):
                print(f"[{mode} {i}/{len(notebooks)}] {path.stem} ...", end=" ", flush=True)
                r = run_notebook(path, quick=(mode == "quick"), timeout=args.timeout,
                                 kernel_log=kernel_log)
                print(f"{r.seconds:.1f} s" + ("" if r.ok else f"  FAILED: {r.error}"), flush=True)
                results.append(r)
        out.write_text(json.dumps({"date": date, "timestamp": _dt.datetime.now().isoformat(timespec="seconds"),
                                   "machine": machine, "results": [asdict(r) for r in results]},
                                  indent=1) + "\n")
        print(f"lesson-runtimes: raw results in {_rel(out)}, kernel messages in {_rel(kernel_log)}")

    table = render_table(results, machine, date, readme_dir=readme.resolve().parent)
    if args.dry_run:
        print(table)
    else:
        write_readme(readme, table)
        print(f"lesson-runtimes: table written to {_rel(readme)}")
    failed = [r for r in results if not r.ok]
    if failed:
        print(f"lesson-runtimes: {len(failed)} run(s) failed: "
              + ", ".join(f"{r.lesson} ({r.mode})" for r in failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))  # course_utils from this checkout, installed or not
    sys.exit(main())
