"""A lesson's core path and its optional deep dives, read from the notebook's own headings.

A deep dive is a section whose heading reads ``## Deep dive (optional, ~N min): title`` (or
``###`` for part of a section); it ends at the next heading of the same or a higher level. The
first cell states ``Core path: about C minutes. Deep dives (optional): about D minutes.``, and D
is the sum of the deep dives' N. Everything outside the deep dives is the core path, and it must
run with every deep dive skipped: a core cell may use what a deep dive defines only under
``if "name" in globals():`` where ``name`` is one of that deep dive's names (the test says "this
deep dive ran"). ``core_only`` gives the notebook a learner who skips them runs.

Sections are numbered in their headings (``## 4. Title``, ``## Deep dive (...): 4. Title``).
``section_references`` finds core text that sends the learner to a deep dive's section ("as
section 4 showed"), and ``deep_dive_needs`` a deep dive that uses what another deep dive made
without its heading saying ``(needs section K)``.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import Iterable

DEEP_DIVE = re.compile(r"^(#{2,3}) Deep dive \(optional, ~(\d+) min\): \S")
HEADING = re.compile(r"^(#{2,3}) \S")
SECTION_NUMBER = re.compile(r"^## (?:Deep dive \(optional, ~\d+ min\): )?(\d+)\. ")
#: "section 4", "sections 2 to 4", "sections 4 and 7", "deep dive 5", "§6"
SECTION_REFERENCE = re.compile(r"(?:\b[Ss]ections?|\b[Dd]eep dives?|§)\s*(\d+(?:\s*(?:,|and|or|to|-|–)\s*\d+)*)")
MINUTES = re.compile(r"Core path: about (\d+) minutes\. "
                     r"(?:Deep dives \(optional\): about (\d+) minutes\. )?"
                     r"Exercises?: about (\d+) minutes")
WORDS_PER_MINUTE = 200
CODE_LINES_PER_MINUTE = 10
MINUTES_PER_OUTPUT = 0.5          # reading one code cell's output


def cell_text(cell: dict) -> str:
    """A cell's source as one string (notebooks store it as a string or a list of lines)."""
    source = cell["source"]
    return source if isinstance(source, str) else "".join(source)


@dataclass
class Part:
    """One run of cells: the core path's, or one deep dive's (``minutes`` is its stated N)."""
    title: str
    deep: bool
    minutes: int = 0
    cells: list[int] = field(default_factory=list)


def parts(cells: list[dict]) -> list[Part]:
    """Split a notebook's cells into core parts and deep dives, in order.

    A markdown cell whose heading opens or closes a deep dive belongs to the part that heading
    opens (text above the heading in the same cell is a few lines of the part before; keep the
    heading first in its cell where that matters)."""
    found = [Part("core", deep=False)]
    level = 0                                   # heading level of the open deep dive, 0 if none
    for index, cell in enumerate(cells):
        if cell["cell_type"] == "markdown":
            for line in cell_text(cell).splitlines():
                dive, heading = DEEP_DIVE.match(line), HEADING.match(line)
                if dive:
                    found.append(Part(line.lstrip("# "), deep=True, minutes=int(dive.group(2))))
                    level = len(dive.group(1))
                    break
                if heading and level and len(heading.group(1)) <= level:
                    found.append(Part("core", deep=False))
                    level = 0
                    break
        found[-1].cells.append(index)
    return [part for part in found if part.cells]


def section_numbers(cells: list[dict]) -> list[int | None]:
    """Each cell's section number: the K of the last ``## K. ...`` heading at or above it."""
    numbers, current = [], None
    for cell in cells:
        if cell["cell_type"] == "markdown":
            for line in cell_text(cell).splitlines():
                match = SECTION_NUMBER.match(line)
                if match or line.startswith("## "):
                    current = int(match.group(1)) if match else None
        numbers.append(current)
    return numbers


def _referenced(text: str) -> set[int]:
    """Section numbers a text refers to ("sections 2 to 4" is 2, 3 and 4)."""
    found = set()
    for match in SECTION_REFERENCE.finditer(text):
        numbers = [int(n) for n in re.findall(r"\d+", match.group(1))]
        joins = re.findall(r"(?<=\d)\s*(,|and|or|to|-|–)\s*(?=\d)", match.group(1))
        found.update(numbers)
        for k, join in enumerate(joins):
            if join in ("to", "-", "–"):
                found.update(range(numbers[k], numbers[k + 1] + 1))
    return found


def section_references(cells: list[dict]) -> list[str]:
    """Core cells (text or code) that name a section only a deep dive holds: one line each."""
    deep = {int(m.group(1)) for cell in cells if cell["cell_type"] == "markdown"
            for line in cell_text(cell).splitlines()
            if line.startswith("## Deep dive") and (m := SECTION_NUMBER.match(line))}
    core = {i for p in parts(cells) if not p.deep for i in p.cells}
    return [f"cell {i} names deep-dive section(s) {', '.join(map(str, sorted(hit)))}: the core path "
            f"must stand alone; say what it needs here, or move this text into the deep dive"
            for i in sorted(core) if (hit := _referenced(cell_text(cells[i])) & deep)]


def stated_minutes(cells: list[dict]) -> tuple[int, int, int]:
    """(core, deep dives, exercise) minutes from the first cell; ValueError if it lacks them."""
    match = MINUTES.search(cell_text(cells[0]))
    if not match:
        raise ValueError("the first cell lacks 'Core path: about C minutes. Deep dives (optional): "
                         "about D minutes. Exercise: about E minutes.'")
    core, deep, exercise = match.groups()
    return int(core), int(deep or 0), int(exercise)


def estimated_minutes(cells: Iterable[dict]) -> float:
    """Minutes a learner spends on these cells: words of text at 200 a minute, non-blank code
    lines at 10 a minute (``%%writefile`` cells included) and half a minute per code cell to read
    its output."""
    words = code = outputs = 0
    for cell in cells:
        text = cell_text(cell)
        if cell["cell_type"] == "markdown":
            words += len(re.findall(r"\w+", text))
        elif cell["cell_type"] == "code":
            code += sum(1 for line in text.splitlines() if line.strip())
            outputs += 1
    return words / WORDS_PER_MINUTE + code / CODE_LINES_PER_MINUTE + outputs * MINUTES_PER_OUTPUT


def _python(text: str) -> ast.Module | None:
    """The cell as Python, IPython's magics and shell lines dropped; None for %%writefile."""
    if text.lstrip().startswith("%%"):
        return None
    lines = [line[:len(line) - len(line.lstrip())] + "pass" if line.lstrip().startswith(("%", "!"))
             else line for line in text.splitlines()]
    return ast.parse("\n".join(lines))


def written_module(text: str) -> str | None:
    """The module name a ``%%writefile NAME.py`` cell writes, else None."""
    match = re.match(r"\s*%%writefile\s+(?:-a\s+)?(\S+)\.py\b", text)
    return match.group(1).rsplit("/", 1)[-1] if match else None


def _guarded(node: ast.If | ast.IfExp) -> set[str]:
    """Names an ``if "a" in globals() [and "b" in globals()]:`` test guards."""
    tests = node.test.values if isinstance(node.test, ast.BoolOp) else [node.test]
    names = set()
    for test in tests:
        if (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.In)
                and isinstance(test.left, ast.Constant) and isinstance(test.left.value, str)
                and isinstance(test.comparators[0], ast.Call)
                and getattr(test.comparators[0].func, "id", None) == "globals"):
            names.add(test.left.value)
    return names


class _Names(ast.NodeVisitor):
    """Names a cell binds anywhere, and each name it reads with the names guarding the read."""

    def __init__(self) -> None:
        self.bound: set[str] = set()
        self.reads: set[tuple[str, frozenset[str]]] = set()
        self.imported: set[str] = set()
        self._guards: list[set[str]] = []

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load):
            self.reads.add((node.id, frozenset().union(*self._guards)))
        else:
            self.bound.add(node.id)

    def visit_BoolOp(self, node: ast.BoolOp) -> None:
        """In ``"a" in globals() and a``, the operands after a guard read under it."""
        pushed = 0
        for value in node.values:
            self.visit(value)
            if isinstance(node.op, ast.And) and isinstance(value, ast.Compare):
                self._guards.append(_guarded(ast.If(test=value, body=[], orelse=[])))
                pushed += 1
        del self._guards[len(self._guards) - pushed:]

    def visit_IfExp(self, node: ast.IfExp) -> None:
        self.visit(node.test)
        self._guards.append(_guarded(node))
        self.visit(node.body)
        self._guards.pop()
        self.visit(node.orelse)

    def visit_If(self, node: ast.If) -> None:
        self.visit(node.test)
        self._guards.append(_guarded(node))
        for child in node.body:
            self.visit(child)
        self._guards.pop()
        for child in node.orelse:
            self.visit(child)

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> None:
        for arg in ast.walk(node.args):
            if isinstance(arg, ast.arg):
                self.bound.add(arg.arg)
        if not isinstance(node, ast.Lambda):
            self.bound.add(node.name)
        self.generic_visit(node)

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.bound.add(node.name)
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.bound.add((alias.asname or alias.name).split(".")[0])
            self.imported.add(alias.name.split(".")[0])

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        for alias in node.names:
            self.bound.add(alias.asname or alias.name)
        if node.module and not node.level:
            self.imported.add(node.module.split(".")[0])

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        if node.name:
            self.bound.add(node.name)
        self.generic_visit(node)


def _unguarded(name: str, guards: frozenset[str], deep_bound: Iterable[set[str]]) -> bool:
    """Whether a deep dive defines ``name`` and no guard names anything that deep dive defines."""
    defining = [bound for bound in deep_bound if name in bound]
    return bool(defining) and not any(guards & bound for bound in defining)


def skipped_uses(cells: list[dict]) -> list[str]:
    """Where the core path breaks with every deep dive skipped: one line per core cell that reads
    a name (or imports a ``%%writefile`` module) that only a deep dive before it defines, outside
    a guard naming one of that deep dive's own names."""
    owner = {i: k for k, part in enumerate(parts(cells)) if part.deep for i in part.cells}
    deep_cells = set(owner)
    core_bound: set[str] = set()
    deep_bound: dict[int, set[str]] = {}            # deep dive -> the names its cells bind
    core_files: set[str] = set()
    deep_files: set[str] = set()
    problems = []
    for index, cell in enumerate(cells):
        if cell["cell_type"] != "code":
            continue
        text = cell_text(cell)
        module = written_module(text)
        if module:
            (deep_files if index in deep_cells else core_files).add(module)
            continue
        tree = _python(text)
        if tree is None:
            continue
        names = _Names()
        names.visit(tree)
        if index in deep_cells:
            deep_bound.setdefault(owner[index], set()).update(names.bound)
            continue
        missing = sorted({name for name, guards in names.reads
                          if name not in names.bound and name not in core_bound
                          and _unguarded(name, guards, deep_bound.values())})
        files = sorted((names.imported & deep_files) - core_files)
        if missing or files:
            what = ", ".join(missing + [f"{name}.py" for name in files])
            problems.append(f"cell {index} uses {what}, which only a deep dive defines; "
                            f"guard it with if \"name\" in globals(): (a name that deep dive defines) or "
                            f"define it in the core path")
        core_bound |= names.bound
    return problems


def core_only(notebook: dict) -> dict:
    """A copy of the notebook without its deep dives' cells: what a learner who skips them runs."""
    cells = notebook["cells"]
    deep = {i for part in parts(cells) if part.deep for i in part.cells}
    return {**notebook, "cells": [cell for i, cell in enumerate(cells) if i not in deep]}


def deep_dive_needs(cells: list[dict]) -> list[str]:
    """Deep dives that read a name (or import a ``%%writefile`` module) that only another deep
    dive defines, when their heading does not say ``(needs section K)`` for that dive's K."""
    found, numbers = parts(cells), section_numbers(cells)
    owner = {i: k for k, part in enumerate(found) if part.deep for i in part.cells}
    bound: dict[int | None, set[str]] = {}        # deep dive (None: the core) -> names it binds
    problems = []
    for index, cell in enumerate(cells):
        text = cell_text(cell)
        if cell["cell_type"] != "code" or text.lstrip().startswith("%%") and not written_module(text):
            continue
        mine = owner.get(index)
        module = written_module(text)
        names = _Names()
        if module:
            names.bound.add(f"{module}.py")
        else:
            names.visit(_python(text))
        reads = {name for name, guards in names.reads if not guards} | {f"{m}.py" for m in names.imported}
        if mine is not None:
            known = names.bound | bound.get(None, set()) | bound.get(mine, set())
            for other, other_bound in bound.items():
                if other in (None, mine) or not (needed := sorted((reads - known) & other_bound)):
                    continue
                k = numbers[found[other].cells[0]]
                if f"(needs section {k})" not in found[mine].title:
                    problems.append(f"cell {index} (deep dive '{found[mine].title}') uses "
                                    f"{', '.join(needed)} from deep dive '{found[other].title}': define "
                                    f"it here, or end this heading with (needs section {k})")
        bound.setdefault(mine, set()).update(names.bound)
    return problems
