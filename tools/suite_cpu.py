#!/usr/bin/env python3
"""Where the quick suite's CPU time goes: ``make suite-cpu`` (opt-in, about 14 minutes).

On 2 cores the suite is bound by CPU, not by waiting: its wall time cannot drop below the CPU
seconds it uses divided by the cores, however the tests are spread over pytest processes. So
``pytest --durations`` (wall time) is not enough to know what to make cheaper. This file is
both a pytest plugin and its report:

    PYTHONPATH=tools pytest -p suite_cpu -n 0 ...      # record: build/suite_cpu.tsv
    .venv/bin/python tools/suite_cpu.py [FILE]          # report it

The plugin reads the whole machine's busy CPU seconds (``psutil.cpu_times()``) before and after
each test item, so a test's figure includes every process it started: kernels, subprocesses,
DataLoader workers, torchrun ranks. That is only true when the items run one at a time
(``-n 0``) on an otherwise quiet machine; ``make suite-cpu`` runs it so.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Iterable, Sequence

import psutil

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TSV = ROOT / "build" / "suite_cpu.tsv"
#: (label, test-file prefix) in the order the report tries them; the first match names the area
AREAS = (("lessons (notebooks/, under nbval)", "notebooks/"),
         ("solutions (solutions/, under nbval)", "solutions/"),
         ("the grade run of every exercise (tests/test_notebooks.py)", "tests/test_notebooks.py"),
         ("the site build (tests/test_site.py)", "tests/test_site.py"),
         ("graders (tests/test_grader*.py, test_grading.py)", "tests/test_grad"),
         ("diagnose (tests/test_diagnose*.py)", "tests/test_diagnose"),
         ("tune (tests/test_tuning.py)", "tests/test_tuning.py"),
         ("DDP (tests/test_ddp.py)", "tests/test_ddp.py"),
         ("other tests", "tests/"))


def busy_cpu_s() -> float:
    """Busy CPU seconds of the whole machine since boot (every core: user, system, nice, ...)."""
    times = psutil.cpu_times()
    return sum(times) - times.idle - getattr(times, "iowait", 0.0)


def read_rows(path: Path) -> list[tuple[str, float, float]]:
    """(test id, CPU seconds, wall seconds) of every line the plugin wrote into ``path``."""
    rows = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        try:
            nodeid, cpu, wall = line.rsplit("\t", 2)
            rows.append((nodeid, float(cpu), float(wall)))
        except ValueError:
            raise ValueError(f"{path}, line {number}: not a line the suite_cpu plugin writes "
                             f"(test id, CPU s, wall s separated by tabs)") from None
    return rows


def area_of(nodeid: str) -> str:
    """The report's area for a test id (see :data:`AREAS`)."""
    path = nodeid.split("::", 1)[0]
    return next((label for label, prefix in AREAS if path.startswith(prefix)), "other")


def totals(rows: Iterable[tuple[str, float, float]], key) -> list[tuple[str, float, float, int]]:
    """(name, CPU s, wall s, items) per ``key(test id)``, the most CPU first."""
    sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    for nodeid, cpu, wall in rows:
        entry = sums[key(nodeid)]
        entry[0] += cpu
        entry[1] += wall
        entry[2] += 1
    return sorted(((k, v[0], v[1], int(v[2])) for k, v in sums.items()), key=lambda t: -t[1])


def lesson_split(rows: Iterable[tuple[str, float, float]], notebooks: Path = ROOT / "notebooks",
                 ) -> list[tuple[str, float, float]]:
    """(lesson, CPU s of its core path, CPU s of its deep dives) for each lesson ``rows`` ran:
    nbval names a notebook's items ``Cell N`` (N counts the code cells only), and
    :func:`course_authoring.core_paths.parts` says which cells are in a deep dive."""
    from course_authoring.core_paths import parts         # the report alone needs no authoring code
    cpu: dict[str, dict[int, float]] = defaultdict(dict)
    for nodeid, seconds, _ in rows:
        path, _, item = nodeid.partition("::")
        if path.startswith("notebooks/") and item.startswith("Cell "):
            cpu[Path(path).name][int(item.split()[1])] = seconds
    split = []
    for name in sorted(cpu):
        cells = json.loads((notebooks / name).read_text(encoding="utf-8"))["cells"]
        code_number = {}
        for index, cell in enumerate(cells):
            if cell["cell_type"] == "code":
                code_number[index] = len(code_number)
        sums = {False: 0.0, True: 0.0}
        for part in parts(cells):
            sums[part.deep] += sum(cpu[name].get(code_number[i], 0.0) for i in part.cells
                                   if i in code_number)
        split.append((name, sums[False], sums[True]))
    return split


def report(rows: Sequence[tuple[str, float, float]], *, cores: int, top: int = 25,
           notebooks: Path | None = ROOT / "notebooks") -> str:
    """The report: the CPU floor of the wall time on ``cores`` cores, then CPU per area, each
    lesson's core path and deep dives (read from ``notebooks``; None: not split), per file and
    the ``top`` items."""
    if not rows:
        raise ValueError("no test was recorded: run pytest with -p suite_cpu first (make suite-cpu)")
    cpu = sum(r[1] for r in rows)
    wall = sum(r[2] for r in rows)
    lines = [f"{len(rows)} test items: {cpu:.0f} CPU seconds in {wall:.0f} s run one at a time; "
             f"on {cores} cores the suite cannot take less than {cpu / cores:.0f} s of wall time "
             f"(CPU / cores), however it is spread over pytest processes.", "",
             "CPU s   share  wall s  items  area"]
    lines += [f"{c:6.0f}  {c / cpu:5.0%}  {w:6.0f}  {n:5d}  {name}"
              for name, c, w, n in totals(rows, area_of)]
    split = lesson_split(rows, notebooks) if notebooks is not None else []
    if split:
        lines += ["", "lesson CPU s: core path + deep dives"]
        lines += [f"{core:6.1f} + {deep:5.1f}  {name}" for name, core, deep in split]
        lines.append(f"{sum(s[1] for s in split):6.1f} + {sum(s[2] for s in split):5.1f}  all lessons")
    lines += ["", "CPU s  wall s  items  file"]
    lines += [f"{c:6.1f}  {w:6.1f}  {n:5d}  {name}"
              for name, c, w, n in totals(rows, lambda i: i.split("::", 1)[0])[:top]]
    lines += ["", "CPU s  wall s  item"]
    lines += [f"{c:6.1f}  {w:6.1f}  {name}" for name, c, w in sorted(rows, key=lambda r: -r[1])[:top]]
    return "\n".join(lines)


# ---- the pytest plugin (-p suite_cpu) ---------------------------------------------------------

try:
    import pytest
except ImportError:                         # the report needs no pytest
    pytest = None
else:
    RECORD = pytest.StashKey()              # the open file the items are written to

    def pytest_configure(config) -> None:
        out = Path(os.environ.get("SUITE_CPU_TSV", DEFAULT_TSV))
        out.parent.mkdir(parents=True, exist_ok=True)
        config.stash[RECORD] = out.open("w", encoding="utf-8")

    def pytest_unconfigure(config) -> None:
        config.stash[RECORD].close()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        busy, start = busy_cpu_s(), time.monotonic()
        yield
        record = item.config.stash[RECORD]
        record.write(f"{item.nodeid}\t{busy_cpu_s() - busy:.2f}\t{time.monotonic() - start:.2f}\n")
        record.flush()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("tsv", nargs="?", default=str(DEFAULT_TSV), metavar="FILE",
                        help=f"what the plugin recorded (default: {DEFAULT_TSV.relative_to(ROOT)})")
    parser.add_argument("--cores", type=int, default=psutil.cpu_count() or 1,
                        help="cores to compute the floor for (default: this machine's)")
    parser.add_argument("--top", type=int, default=25, help="files and items to list (default 25)")
    args = parser.parse_args(argv)
    if args.cores < 1 or args.top < 1:
        parser.error("--cores and --top must be at least 1")
    try:
        print(report(read_rows(Path(args.tsv)), cores=args.cores, top=args.top))
    except FileNotFoundError:
        print(f"suite_cpu.py: error: no {args.tsv}: record it first with make suite-cpu",
              file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"suite_cpu.py: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
