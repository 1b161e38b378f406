"""The package's shape: no import cycles between course_utils modules (imports inside functions
count too: a lazy import only hides a cycle), and plots imports bench, never the reverse."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "course_utils"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    """module -> the course_utils modules it imports anywhere in its code (not the package face)."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                candidates = [target] + [f"{target}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                candidates = [alias.name for alias in node.names]
            else:
                continue
            graph[name] |= {c for c in candidates if c in modules and c not in (name, "course_utils")}
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


def test_plots_import_bench_never_the_reverse():
    """Plots read the measurement results; the timing engine and its results never need plots."""
    graph = _imports()
    assert "course_utils.measurement" in graph["course_utils.plots"]
    for engine in ("course_utils.bench", "course_utils.measurement", "course_utils.process_tree"):
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


MAX_LINES = 600


def test_no_module_grows_past_its_limit():
    too_long = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(ROOT).as_posix()
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_LINES:
            too_long[name] = lines
    assert not too_long, (f"modules over their limit (lines): {too_long}; split them "
                          f"(COURSE_DESIGN.md: no module over ~{MAX_LINES} lines)")


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
