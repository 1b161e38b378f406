"""``make mutation``'s groups (tools/mutation.py): the modules each group mutates, and the test
files that pin them, which are **every** test file that imports one of the group's modules
(found by reading each test file's imports, its ``monkeypatch`` targets and its
``notebook_module(...)`` names, never a hand-picked list).

The groups cover every module that computes a figure, a threshold or a verdict a learner reads:
the core's, the tools', every grader's judging code, and the lessons' verdict modules. Those are
``%%writefile lessonNN_verdicts.py`` cells, so the scratch copy gets them as files of a package,
:data:`VERDICTS_PACKAGE` (:func:`write_verdict_modules`), and ``notebook_module`` imports them
from there when ``COURSE_NOTEBOOK_MODULES`` names it: the tests that import a lesson's verdicts
then test the mutated file.
"""
from __future__ import annotations

import ast
import re
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: where the scratch copy keeps the lessons' verdict modules (a package mutmut can mutate)
VERDICTS_PACKAGE = "course_utils.notebook_verdicts"
VERDICTS_DIR = VERDICTS_PACKAGE.replace(".", "/")
#: lesson number -> its notebook, for the lessons that write a ``lessonNN_verdicts.py``
VERDICT_NOTEBOOKS = {
    "00": "00_measure_first.ipynb", "01": "01_numpy_torch_opencv.ipynb", "02": "02_threads.ipynb",
    "03": "03_num_workers.ipynb", "04": "04_host_to_device.ipynb",
    "05": "05_gpu_augmentation.ipynb", "06": "06_tune_your_pipeline.ipynb",
    "07": "07_scaling_out.ipynb", "08": "08_find_the_stall.ipynb", "09": "09_when_the_loader_breaks.ipynb",
}

_CU = "course_utils/"
_TOOLS = _CU + "tools/"
_GRADING = _CU + "grading/"

#: group -> the modules it mutates (paths from the checkout's root)
GROUPS: dict[str, list[str]] = {
    # the core: the timing engine and its results, the probes, the arithmetic of the lessons
    "timing": [_CU + "timing.py"],
    "measurement": [_CU + "measurement.py", _CU + "advice.py"],
    "process_tree": [_CU + "process_tree.py"],
    "machine": [_CU + "machine.py", _CU + "start_methods.py"],
    "threads": [_CU + "threads.py"],
    "scaling": [_CU + "scaling.py"],
    "augment": [_CU + "augment.py"],
    "prefetch": [_CU + "prefetch.py"],
    "transforms": [_CU + "transforms.py", _CU + "image_ops.py"],
    "device_copies": [_CU + "device.py", _CU + "lessons/l04_copies.py"],
    "datasets": [_CU + "lessons/l03_num_workers.py"],
    # the lessons' harness that computes a verdict or a figure: lesson 07's sharding report,
    # lesson 04's summed GPU reference and its calibrated compute stand-in
    "lesson_harness": [_CU + "lessons/l07_scaling_out.py", _CU + "lessons/l04_reference.py",
                       _CU + "lessons/l04_overlap.py"],
    # the tools
    "tune": [_TOOLS + "tune/search.py", _TOOLS + "tune/window.py", _TOOLS + "tune/result.py"],
    "diagnose": [_TOOLS + "diagnose/rules.py", _TOOLS + "diagnose/health.py"],
    "diagnose_script": [_TOOLS + "diagnose/script.py", _TOOLS + "diagnose/probe.py"],
    "bench": [_TOOLS + "bench/run.py", _TOOLS + "bench/recipes.py", _TOOLS + "bench/storage.py"],
    # every grader's judging code
    "grader00": [_GRADING + "ex00_measure_first.py"],
    "grader01": [_GRADING + "ex01_uint8_pipeline.py"],
    "grader02": [_GRADING + "ex02_worker_init/__init__.py", _GRADING + "ex02_worker_init/workers.py",
                 _GRADING + "ex02_worker_init/share.py"],
    "grader03": [_GRADING + "ex03_num_workers.py"],
    "grader04": [_GRADING + "ex04_prefetcher.py"],
    "grader05": [_GRADING + "ex05_augment.py"],
    "grader06": [_GRADING + "ex06_tune_pipeline.py"],
    "grader07": [_GRADING + "ex07_fix_sharding.py"],
    "grader08": [_GRADING + "ex08_find_the_stall.py"],
    "grader09": [_GRADING + "ex09_survive_the_limits.py"],
    # the lessons' "common advice, checked" verdicts, written from the notebooks
    "verdicts": [f"{VERDICTS_DIR}/lesson{n}_verdicts.py" for n in VERDICT_NOTEBOOKS],
}

_DOTTED_STRING = re.compile(r"^course_utils(?:\.\w+)+$")
_VERDICT_NAME = re.compile(r"^lesson(\d\d)_verdicts$")
_EXERCISE_ID = re.compile(r"^(\d\d)\.\w+$")            # check("01.uint8_pipeline", ...)
#: test files that read the package as text (line budgets, layers, dead code): on mutmut's copy,
#: whose modules carry its trampolines, their figures would be mutmut's, not the course's
READS_SOURCE_AS_TEXT = {"tests/test_layout.py", "tests/test_dead_code.py"}


def dotted(path: str) -> str:
    """``course_utils/tools/tune/search.py`` -> ``course_utils.tools.tune.search`` (a package's
    ``__init__.py`` -> the package)."""
    return path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


@lru_cache(maxsize=None)
def _package_modules(root: Path) -> dict[str, Path]:
    """Every module of course_utils in ``root``: dotted name -> file."""
    return {dotted(str(p.relative_to(root))): p for p in (root / "course_utils").rglob("*.py")
            if "__pycache__" not in p.parts}


@lru_cache(maxsize=None)
def _reexports(root: Path, package: str) -> dict[str, str]:
    """What a package's ``__init__`` imports from its own modules: name -> dotted module."""
    init = _package_modules(root).get(package)
    if init is None or init.name != "__init__.py":
        return {}
    out = {}
    for node in ast.walk(ast.parse(init.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            for alias in node.names:
                out[alias.asname or alias.name] = f"{package}.{node.module}"
    return out


@lru_cache(maxsize=None)
def imported_modules(test_file: Path, root: Path = ROOT) -> frozenset[str]:
    """The course_utils modules ``test_file`` imports (``import``, ``from ... import``, a name a
    package re-exports, a ``"course_utils.x.y"`` string such as a monkeypatch target, those of a
    test file it takes fixtures from), and
    ``lessonNN_verdicts`` for each ``notebook_module(..., "lessonNN_verdicts")`` it names."""
    modules = _package_modules(root)
    found: set[str] = set()

    def add(name: str) -> None:        # the longest prefix of ``name`` that is a module
        parts = name.split(".")
        for end in range(len(parts), 0, -1):
            if ".".join(parts[:end]) in modules:
                found.add(".".join(parts[:end]))
                return

    for node in ast.walk(ast.parse(test_file.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("test_"):
            shared = test_file.parent / f"{node.module}.py"     # fixtures from another test file
            found.update(imported_modules(shared, root) if shared.is_file() else ())
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                add(full if full in modules else _reexports(root, node.module).get(alias.name, node.module))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if _DOTTED_STRING.match(node.value):
                add(node.value)
            elif _VERDICT_NAME.match(node.value):
                found.add(f"{VERDICTS_PACKAGE}.{node.value}")
            elif match := _EXERCISE_ID.match(node.value):     # check() loads that grader
                found.update(m for m in modules if m.startswith(f"course_utils.grading.ex{match[1]}_"))
    return frozenset(m for m in found if m.startswith("course_utils"))


def tests_for(modules: list[str], root: Path = ROOT) -> list[str]:
    """Every test file under ``root/tests`` that imports one of ``modules`` (paths), sorted,
    but those of :data:`READS_SOURCE_AS_TEXT`."""
    wanted = {dotted(m) for m in modules}
    found = (str(f.relative_to(root)) for f in (root / "tests").glob("test_*.py")
             if imported_modules(f, root) & wanted)
    return sorted(set(found) - READS_SOURCE_AS_TEXT)


def write_verdict_modules(dest: Path) -> list[str]:
    """Write each lesson's ``lessonNN_verdicts.py`` (its ``%%writefile`` cells, as the notebook
    writes them) into ``dest``'s :data:`VERDICTS_DIR` as a package; the paths written."""
    import sys
    sys.path.insert(0, str(ROOT))
    try:
        from course_authoring.notebook_modules import writefile_cells
    finally:
        sys.path.remove(str(ROOT))
    folder = dest / VERDICTS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "__init__.py").write_text('"""The lessons\' verdict modules, for make mutation."""\n')
    written = []
    for number, notebook in VERDICT_NOTEBOOKS.items():
        name = f"lesson{number}_verdicts.py"
        (folder / name).write_text(writefile_cells(ROOT / "notebooks" / notebook)[name], encoding="utf-8")
        written.append(f"{VERDICTS_DIR}/{name}")
    return written
