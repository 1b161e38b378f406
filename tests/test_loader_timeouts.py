"""Lessons 01, 04, 05 and 08 give a DataLoader a ``timeout`` only under ``fork``. Under forkserver (and
spawn on Windows) the main process learns that a worker died only when the timeout runs out
(torch checks every 5 s without one): a timeout of minutes delays a dead worker's error by as
much (issue 38). Under fork the workers are its children, a SIGCHLD reports a death at once, and
the timeout guards against the hangs fork's inherited locks cause. Lesson 09 hangs a loader on
purpose, so its hang needs a timeout under every start method: there it is a few seconds at most,
which delays a dead worker's error by as little. Static: read from the cells."""
from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LESSONS = ["01_numpy_torch_opencv", "04_host_to_device", "05_gpu_augmentation", "08_find_the_stall"]


def _code(source: str) -> str:
    """A cell's Python: IPython magics and shell lines made ``pass`` (an ``if`` may hold one)."""
    return "\n".join(line[:len(line) - len(line.lstrip())] + "pass" if line.lstrip().startswith(("%", "!"))
                     else line for line in source.split("\n"))


def _fork_only(expr: ast.expr, names: dict[str, ast.expr]) -> bool:
    """Whether a timeout expression is 0, or non-zero only when start_method() == "fork"."""
    if isinstance(expr, ast.Name) and expr.id in names:
        expr = names[expr.id]
    if isinstance(expr, ast.Constant):
        return expr.value == 0
    text = ast.unparse(expr)
    return "start_method()" in text and ("== 'fork'" in text or '== "fork"' in text)


def timeout_problems(source: str) -> list[str]:
    """Each DataLoader timeout (keyword, or ``x.timeout = ...``) that is not fork-only, unless the
    loader names its context ("fork" or "spawn": then the method is known and chosen)."""
    tree = ast.parse(_code(source))
    names = {t.id: node.value for node in ast.walk(tree) if isinstance(node, ast.Assign)
             for t in node.targets if isinstance(t, ast.Name)}
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("DataLoader"):
            kw = {k.arg: k.value for k in node.keywords}
            context = kw.get("multiprocessing_context")
            if "timeout" not in kw or (isinstance(context, ast.Constant) and context.value in ("fork", "spawn")):
                continue
            if not _fork_only(kw["timeout"], names):
                problems.append(f"line {node.lineno}: timeout={ast.unparse(kw['timeout'])}")
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Attribute) and t.attr == "timeout"
                                                  for t in node.targets):
            if not _fork_only(node.value, names):
                problems.append(f"line {node.lineno}: .timeout = {ast.unparse(node.value)}")
    return problems


@pytest.mark.parametrize("lesson", LESSONS)
def test_loader_timeouts_are_fork_only(lesson):
    cells = json.loads((ROOT / "notebooks" / f"{lesson}.ipynb").read_text(encoding="utf-8"))["cells"]
    found = {i: p for i, c in enumerate(cells) if c["cell_type"] == "code"
             for p in [timeout_problems(c["source"] if isinstance(c["source"], str) else "".join(c["source"]))] if p}
    assert found == {}, f"{lesson}: cells whose loader timeout would delay a dead worker's error: {found}"


def test_the_lessons_still_guard_fork():
    """The fix kept the guard under fork (a hung forked worker raises): 01, 04, 05 and 08 each set one."""
    for lesson in LESSONS:
        text = (ROOT / "notebooks" / f"{lesson}.ipynb").read_text(encoding="utf-8")
        assert 'start_method() == \\"fork\\"' in text, lesson


@pytest.mark.parametrize("source, bad", [
    ("DataLoader(ds, num_workers=2, timeout=120)", True),
    ("loader.timeout = 300", True),
    ("g = 0 if start_method() == 'forkserver' else 120\nDataLoader(ds, timeout=g)", True),   # spawn on Windows
    ("%%writefile x.py\ng = 120 if start_method() == 'fork' else 0\nDataLoader(ds, timeout=g)", False),
    ("loader.timeout = 300 if start_method() == 'fork' else 0", False),
    ("DataLoader(ds, num_workers=0, timeout=0)", False),
    ("DataLoader(ds, num_workers=1, multiprocessing_context='fork', timeout=30)", False),
    ("DataLoader(ds, num_workers=1, multiprocessing_context='forkserver', timeout=30)", True),
    ("DataLoader(ds, num_workers=1)", False),
])
def test_timeout_problems_are_found(source, bad):
    assert bool(timeout_problems(source)) is bad


def test_every_loader_timeout_of_lesson_05_is_fork_only():
    """Lesson 05's loaders with a timeout: the throughput harness (section 5), the training
    harness and loop (section 6), the decode comparison (section 7): each cell, by its opening."""
    cells = json.loads((ROOT / "notebooks" / "05_gpu_augmentation.ipynb").read_text(encoding="utf-8"))["cells"]
    sources = [c["source"] if isinstance(c["source"], str) else "".join(c["source"]) for c in cells
               if c["cell_type"] == "code"]
    guarded = [s.split("\n")[0] for s in sources if "timeout" in s and 'start_method() == "fork"' in s]
    assert guarded == ["%%writefile lesson05_throughput.py", "%%writefile lesson05_training.py",
                       "loop_batch, loop_steps, loop_side = pick(full=32, quick=16), pick(full=8, quick=5), "
                       "pick(full=224, quick=64)", "workers = usable_cpus()"]
    assert all(timeout_problems(s) == [] for s in sources)


#: lesson 09's hang: a timeout under every start method, of at most this many seconds
HANG_LESSON, SHORT_S = "09_when_the_loader_breaks", 10


def seconds_at_most(expr: ast.expr, names: dict[str, ast.expr]) -> float | None:
    """The most seconds a timeout expression can be: a number, or ``pick(full=..., quick=...)`` of
    numbers, directly or through a name of the cell; None for anything else."""
    if isinstance(expr, ast.Name) and expr.id in names:
        expr = names[expr.id]
    if isinstance(expr, ast.Constant) and isinstance(expr.value, (int, float)):
        return expr.value
    if isinstance(expr, ast.Call) and ast.unparse(expr.func) == "pick":
        values = [seconds_at_most(a, names) for a in [*expr.args, *(k.value for k in expr.keywords)]]
        return max(values) if values and None not in values else None
    return None


def timeouts_everywhere(source: str) -> list[float | None]:
    """The most seconds of each DataLoader timeout of a cell that is not fork-only."""
    tree = ast.parse(_code(source))
    names = {t.id: node.value for node in ast.walk(tree) if isinstance(node, ast.Assign)
             for t in node.targets if isinstance(t, ast.Name)}
    return [seconds_at_most(kw.value, names) for node in ast.walk(tree)
            if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("DataLoader")
            for kw in node.keywords if kw.arg == "timeout" and not _fork_only(kw.value, names)]


@pytest.mark.parametrize("source, seconds", [
    ("T = pick(full=5, quick=3)\nDataLoader(ds, timeout=T)", [5]),
    ("DataLoader(ds, timeout=4)", [4]),
    ("DataLoader(ds, timeout=120 if start_method() == 'fork' else 0)", []),    # fork-only: not counted
    ("DataLoader(ds, timeout=t)", [None]),                                     # unknown: refused below
    ("T = pick(full=600, quick=3)\nDataLoader(ds, timeout=T)", [600]),
])
def test_the_most_seconds_of_a_timeout_are_read(source, seconds):
    assert timeouts_everywhere(source) == seconds


def test_lesson_09_bounds_its_hang_with_a_short_timeout_under_every_start_method():
    cells = json.loads((ROOT / "notebooks" / f"{HANG_LESSON}.ipynb").read_text(encoding="utf-8"))["cells"]
    found = [t for c in cells if c["cell_type"] == "code"
             for t in timeouts_everywhere(c["source"] if isinstance(c["source"], str) else "".join(c["source"]))]
    assert found, f"{HANG_LESSON}: its hang has no DataLoader timeout"
    assert all(t is not None and t <= SHORT_S for t in found), (
        f"{HANG_LESSON}: loader timeouts set under every start method must be numbers of at most {SHORT_S} s "
        f"(a longer one delays a dead worker's error under forkserver by as much): {found}")
