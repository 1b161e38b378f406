"""The package's shape (ARCHITECTURE.md): three layers whose arrows only point down (the core
imports neither tools nor grading, tools never import grading), no private name used across
modules, no import cycles between course_utils modules (imports inside functions count too: a lazy
import only hides a cycle), no module over 500 lines, and plots import the timing results, never
the reverse.

``course_utils.__main__`` dispatches the command line to each layer's ``cli`` module
(``tools/cli.py``, ``grading/cli.py``): it sits above every layer (nothing imports it) and is the
one core-level module allowed to import them."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "course_utils"
TOOLS, GRADING = "course_utils.tools", "course_utils.grading"
#: the command line: above every layer, so it may import all of them
ENTRY_POINTS = {"course_utils.__main__"}


def _imports() -> dict[str, set[str]]:
    """module -> the course_utils modules it imports anywhere in its code (not the package face)."""
    modules = _layer_modules()
    graph: dict[str, set[str]] = {}
    for name, imports in _layer_imports().items():
        targets = {target.split(":")[0] for _, target, _ in imports}
        graph[name] = {t for t in targets if t in modules and t not in (name, "course_utils")}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt, path + [nxt])
                if found:
                    return found
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start, [start])
            if found:
                return found
    return None


def test_no_import_cycles():
    cycle = _cycle(_imports())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in graph[todo.pop()] - seen:
            seen.add(nxt)
            todo.append(nxt)
    return seen


def test_plots_import_the_timing_results_never_the_reverse():
    """Plots read the measurement results; the timing engine and its results never need plots."""
    graph = _imports()
    assert "course_utils.measurement" in graph["course_utils.plots"]
    for engine in ("course_utils.timing", "course_utils.measurement", "course_utils.process_tree"):
        assert "course_utils.plots" not in _reachable(graph, engine), f"{engine} reaches plots"


def test_the_check_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def _uncommented_function_imports(source: str) -> list[tuple[int, str]]:
    """(line, text) of each import inside a function with no comment on its line or the line
    above: an import there must say why it is not at the module's top."""
    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for sub in ast.walk(node):
                if isinstance(sub, (ast.Import, ast.ImportFrom)):
                    line, prev = lines[sub.lineno - 1], lines[sub.lineno - 2]
                    if "#" not in line and not prev.strip().startswith("#"):
                        found.append((sub.lineno, line.strip()))
    return sorted(set(found))


def test_function_level_imports_say_why():
    """Imports go at the module's top; one inside a function (heavy and kept out of what
    ``import course_utils`` or DataLoader workers import, optional, an import cycle, or one that
    must run after something else) says why in a comment on its line or the line above."""
    silent = [f"{path.relative_to(ROOT).as_posix()}:{lineno}: {text}"
              for path in sorted(PACKAGE.rglob("*.py"))
              for lineno, text in _uncommented_function_imports(path.read_text(encoding="utf-8"))]
    assert not silent, ("imports inside functions without a comment saying why; move them to "
                        "the module's top, or add the reason:\n" + "\n".join(silent))


def test_the_import_check_finds_a_silent_one():
    source = ("import os\n\n\ndef f():\n    import json\n    return json\n\n\n"
              "def g():\n    # lazy: heavy\n    import numpy\n    import sys  # optional\n")
    assert _uncommented_function_imports(source) == [(5, "import json")]


MAX_LINES = 500


def test_no_module_grows_past_its_limit():
    """A unit that needs more than 500 lines becomes a subpackage (not two sibling files split
    only to pass this limit)."""
    too_long = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(ROOT).as_posix()
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_LINES:
            too_long[name] = lines
    assert not too_long, (f"modules over {MAX_LINES} lines: {too_long}; make the unit a "
                          f"subpackage (ARCHITECTURE.md, 'The rules')")


def test_top_level_names_are_few_and_each_is_used_by_a_notebook():
    import json

    import course_utils
    from IPython.core.inputtransformer2 import TransformerManager

    used = set()
    for book in [*ROOT.glob("notebooks/*.ipynb"), *ROOT.glob("solutions/*.ipynb")]:
        for cell in json.loads(book.read_text(encoding="utf-8"))["cells"]:
            if cell["cell_type"] != "code":
                continue
            source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            for node in ast.walk(ast.parse(TransformerManager().transform_cell(source))):
                if isinstance(node, ast.ImportFrom) and node.module == "course_utils" and not node.level:
                    used |= {alias.name for alias in node.names}
    names = set(course_utils.__all__)
    assert len(names) <= 30, f"{len(names)} top-level names; at most 30 (import the rest from their module)"
    assert names <= used, f"exported but used by no notebook: {sorted(names - used)}"


# ---- the three layers -----------------------------------------------------------------------

def _layer_modules() -> dict[str, Path]:
    """dotted name -> file, for every module and package of course_utils."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        parts = path.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _layer_of(module: str) -> str:
    if module == TOOLS or module.startswith(TOOLS + "."):
        return "tools"
    if module == GRADING or module.startswith(GRADING + "."):
        return "grading"
    return "core"


def _layer_resolve(module: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute name an ImportFrom reads from (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    base = package.split(".")
    base = base[: len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _layer_in_function(tree: ast.AST) -> set[int]:
    """ids of the import nodes that sit inside a function (run only when it is called)."""
    inside = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            inside |= {id(n) for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom))}
    return inside


def _layer_imports(*, module_level_only: bool = False) -> dict[str, list[tuple[int, str, str]]]:
    """module -> [(line, imported course_utils module or 'module:name', as written)].

    ``from X import n`` gives X.n when that is a module, else ``X:n``; an ``import a.b.c`` gives
    a.b.c. Imports inside functions count unless ``module_level_only`` (a lazy import is still an
    arrow between layers; only a cycle needs both ends at import time)."""
    modules = _layer_modules()
    found: dict[str, list[tuple[int, str, str]]] = {m: [] for m in modules}
    for name, path in modules.items():
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source)
        skip = _layer_in_function(tree) if module_level_only else set()
        for node in ast.walk(tree):
            if id(node) in skip or not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            text = source.splitlines()[node.lineno - 1].strip()
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "course_utils":
                        found[name].append((node.lineno, alias.name, text))
            elif isinstance(node, ast.ImportFrom):
                target = _layer_resolve(name, path, node)
                if target.split(".")[0] != "course_utils":
                    continue
                for alias in node.names:
                    full = f"{target}.{alias.name}"
                    found[name].append((node.lineno, full if full in modules else f"{target}:{alias.name}",
                                        text))
    return found


def _layer_target_module(target: str) -> str:
    return target.split(":")[0]


def _layer_violations(source_layer: str, forbidden: set[str]) -> list[str]:
    out = []
    for module, imports in _layer_imports().items():
        if _layer_of(module) != source_layer or module in ENTRY_POINTS:
            continue
        for line, target, text in imports:
            if _layer_of(_layer_target_module(target)) in forbidden:
                out.append(f"{module}:{line}: {text}")
    return sorted(set(out))


def test_the_core_imports_neither_tools_nor_grading():
    """Lessons and their DataLoader workers import the core; it must not pull in a tool or a
    grader (ARCHITECTURE.md: the arrows only point down)."""
    bad = _layer_violations("core", {"tools", "grading"})
    assert not bad, ("the core imports a tool or the graders; move the code it needs down into "
                     "the core, or the importing code up:\n" + "\n".join(bad))


def test_tools_never_import_grading():
    bad = _layer_violations("tools", {"grading"})
    assert not bad, ("a tool imports the graders; the graders build on the tools, never the "
                     "reverse:\n" + "\n".join(bad))


def _layer_private_imports() -> list[str]:
    """``from x import _y`` and ``x._y`` on an imported course_utils module, x another module;
    in course_utils and in course_authoring (the authors' tools use the package too)."""
    modules = _layer_modules()
    importers = dict(modules)
    for path in sorted((ROOT / "course_authoring").glob("*.py")):
        importers[f"course_authoring.{path.stem}" if path.stem != "__init__"
                  else "course_authoring"] = path
    out = []
    for name, path in importers.items():
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source)
        bound: dict[str, str] = {}     # local name -> course_utils module it is bound to
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                target = _layer_resolve(name, path, node)
                if target.split(".")[0] != "course_utils":
                    continue
                for alias in node.names:
                    full = f"{target}.{alias.name}"
                    if full in modules:
                        bound[alias.asname or alias.name] = full
                    if alias.name.startswith("_") and not alias.name.startswith("__") \
                            and target != name:
                        out.append(f"{name}:{node.lineno}: from {target} import {alias.name}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "course_utils" and alias.asname:
                        bound[alias.asname] = alias.name
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
                    node.value.id in bound and node.attr.startswith("_") and \
                    not node.attr.startswith("__") and bound[node.value.id] != name:
                out.append(f"{name}:{node.lineno}: {node.value.id}.{node.attr} "
                           f"({bound[node.value.id]})")
    return sorted(set(out))


def test_no_module_imports_a_private_name_of_another():
    """A name with a leading underscore is its module's own; another module that needs it gets
    a public name with a docstring, or the code moves to where it is used."""
    found = _layer_private_imports()
    assert not found, "private names used across modules:\n" + "\n".join(found)


def test_the_layer_checks_see_relative_imports(tmp_path):
    """``from ...grading import x`` in a tool resolves to course_utils.grading."""
    node = ast.parse("from ...grading import checker").body[0]
    assert _layer_resolve("course_utils.tools.tune.search", Path("search.py"), node) == \
        "course_utils.grading"
    node = ast.parse("from . import window").body[0]
    assert _layer_resolve("course_utils.tools.tune", Path("__init__.py"), node) == \
        "course_utils.tools.tune"
    assert _layer_of("course_utils.tools.tune.search") == "tools"
    assert _layer_of("course_utils.grading.ex03_num_workers") == "grading"
    assert _layer_of("course_utils.timing") == "core"


@pytest.mark.parametrize("layer", ["core", "tools", "grading"])
def test_every_layer_exists(layer):
    assert any(_layer_of(m) == layer for m in _layer_modules())


#: Lines per layer (``lessons/`` counts as core) and for the whole package (ARCHITECTURE.md): a
#: feature that needs more lines retires lines elsewhere.
LAYER_BUDGETS = {"core": 5_500, "tools": 3_500, "grading": 3_500}
PACKAGE_BUDGET = 12_500


def _lines_per_layer(modules: dict[str, Path]) -> dict[str, int]:
    lines = dict.fromkeys(LAYER_BUDGETS, 0)
    for name, path in modules.items():
        lines[_layer_of(name)] += len(path.read_text(encoding="utf-8").splitlines())
    return lines


def test_every_layer_keeps_within_its_line_budget():
    lines = _lines_per_layer(_layer_modules())
    over = {layer: f"{n:,} > {LAYER_BUDGETS[layer]:,}" for layer, n in lines.items()
            if n > LAYER_BUDGETS[layer]}
    assert not over, (f"layers over their line budget: {over}; retire lines (a second way of "
                      f"doing a job, dead code, a docstring that says more than the code) first")
    assert sum(lines.values()) <= PACKAGE_BUDGET, f"course_utils is {sum(lines.values()):,} lines"


def test_the_budget_counts_each_file_in_its_own_layer(tmp_path):
    files = {"course_utils.timing": 7, "course_utils.lessons.l02_threads": 5,
             "course_utils.tools.tune.search": 3, "course_utils.grading": 2}
    modules = {}
    for i, (name, n) in enumerate(files.items()):
        modules[name] = tmp_path / f"{i}.py"
        modules[name].write_text("x\n" * n, encoding="utf-8")
    assert _lines_per_layer(modules) == {"core": 12, "tools": 3, "grading": 2}
