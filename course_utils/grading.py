"""Self-grading for the course exercises.

A learner's check cell calls :func:`check` with the exercise's id and their answer::

    check("00.time_loader", time_loader)

The grader for that id runs the answer for real (in real DataLoader workers, on real data)
and either prints a short pass line or raises :class:`ExerciseFailed`, whose message says
what was expected, what was seen, and a hint. Graders live in ``course_utils.graders``,
one module per lesson, and register themselves with :func:`grader`.
"""
from __future__ import annotations

import dis
import functools
import importlib
import inspect
import os
import pkgutil
import sys
import sysconfig
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

from . import graders

__all__ = ["ExerciseFailed", "CheckResult", "check", "grader", "exercise_ids",
           "refuse_course_helper"]

#: the course package's name ("course_utils"): what its helpers' ``__module__`` starts with
_PACKAGE = __name__.partition(".")[0]
#: folders of the standard library and installed packages: code there is not the learner's
_LIBRARY_DIRS = tuple(sorted({os.path.join(os.path.realpath(sysconfig.get_paths()[k]), "")
                              for k in ("stdlib", "platstdlib", "purelib", "platlib")}))
#: how deep :func:`refuse_course_helper` follows references (function -> function -> ...)
_MAX_DEPTH = 6
#: containers with more items than this are not looked into (data, not code)
_MAX_ITEMS = 64
#: values that hold no code
_PLAIN = (str, bytes, bytearray, int, float, complex, type(None), types.ModuleType,
          types.BuiltinFunctionType, types.CodeType)


class ExerciseFailed(AssertionError):
    """An exercise answer did not pass; the message teaches what to change."""

    def __init__(self, exercise: str, problem: str, *, expected: str = "", seen: str = "",
                 hint: str = "") -> None:
        self.exercise, self.problem = exercise, problem
        self.expected, self.seen, self.hint = expected, seen, hint
        lines = [f"{exercise}: {problem}"]
        if expected:
            lines.append(f"  expected: {expected}")
        if seen:
            lines.append(f"  seen:     {seen}")
        if hint:
            lines.append(f"  hint:     {hint}")
        super().__init__("\n".join(lines))


@dataclass
class CheckResult:
    """What a passing check found (printed in the notebook)."""

    exercise: str
    summary: str
    details: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"PASSED {self.exercise}: {self.summary}"

    def __repr__(self) -> str:  # notebooks echo the return value of the last line
        return str(self)


_GRADERS: dict[str, Callable[..., CheckResult]] = {}


def grader(exercise: str) -> Callable[[Callable[..., CheckResult]], Callable[..., CheckResult]]:
    """Register the decorated function as the grader for ``exercise``."""
    def register(fn: Callable[..., CheckResult]) -> Callable[..., CheckResult]:
        _GRADERS[exercise] = fn
        return fn
    return register


def _load_graders() -> None:
    for module in pkgutil.iter_modules(graders.__path__):
        importlib.import_module(f"{graders.__name__}.{module.name}")


def exercise_ids() -> list[str]:
    """The ids :func:`check` knows, sorted."""
    _load_graders()
    return sorted(_GRADERS)


def check(exercise: str, answer: Any, **options: Any) -> CheckResult:
    """Grade ``answer`` for ``exercise``; return a :class:`CheckResult` or raise ExerciseFailed.

    ``options`` go to the grader (for example a smaller workload in a test).
    """
    _load_graders()
    if exercise not in _GRADERS:
        known = ", ".join(sorted(_GRADERS)) or "none"
        raise ValueError(f"check(exercise={exercise!r}): no such exercise; known ids: {known}.")
    try:
        return _GRADERS[exercise](answer, **options)
    except NotImplementedError as exc:
        raise ExerciseFailed(
            exercise, "not done yet: the answer still raises NotImplementedError.",
            hint="replace the `raise NotImplementedError(...)` line with your code, run that "
                 "cell, then run this check again.") from exc


# --------------------------------------------------------------------------------------
# answers that are the course's own helper
# --------------------------------------------------------------------------------------
def _in_course(module: Any) -> bool:
    return isinstance(module, str) and (module == _PACKAGE or module.startswith(_PACKAGE + "."))


def _module_of(obj: Any) -> Any:
    if isinstance(obj, (type, types.FunctionType, types.BuiltinFunctionType)):
        return getattr(obj, "__module__", None)
    return type(obj).__module__


def _defined_in_course(obj: Any) -> bool:
    """True for a function or class defined in the course package, or an instance of one."""
    return _in_course(_module_of(obj))


def _course_made(obj: Any) -> bool:
    """True for a function or class defined in the course package, an instance of such a
    class, or a class deriving from one (a method: of such a function or object)."""
    if isinstance(obj, types.MethodType):
        return _course_made(obj.__func__) or _course_made(obj.__self__)
    if isinstance(obj, type):
        return any(_in_course(k.__module__) for k in obj.__mro__)
    return _in_course(_module_of(obj)) or any(_in_course(k.__module__) for k in type(obj).__mro__)


def _is_library(obj: Any) -> bool:
    """True for code of the standard library or an installed package (never the learner's)."""
    if isinstance(obj, types.FunctionType):
        path = obj.__code__.co_filename
    else:
        module = getattr(obj if isinstance(obj, type) else type(obj), "__module__", None)
        if module in (None, "__main__"):  # a notebook's (or a script's) own code
            return False
        if module == "builtins":
            return True
        path = getattr(sys.modules.get(module), "__file__", None)
    return bool(path) and os.path.realpath(path).startswith(_LIBRARY_DIRS)


def _names(code: types.CodeType) -> tuple[set[str], set[str], set[str]]:
    """(global names, attribute names, imported modules) the code and its nested code (inner
    functions, lambdas, comprehensions) read."""
    globals_, attrs, modules = set(), set(), set()
    for ins in dis.get_instructions(code):
        if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
            globals_.add(ins.argval)
        elif ins.opname in ("LOAD_ATTR", "LOAD_METHOD", "LOAD_SUPER_ATTR", "IMPORT_FROM"):
            attrs.add(ins.argval)
        elif ins.opname == "IMPORT_NAME":
            modules.add(ins.argval)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            more = _names(const)
            globals_, attrs, modules = globals_ | more[0], attrs | more[1], modules | more[2]
    return globals_, attrs, modules


def _referenced(fn: types.FunctionType) -> Iterator[Any]:
    """What ``fn`` refers to: the objects its global names hold (in ``fn.__globals__``), the
    course modules' attributes it reads (``course_utils.threads.make_worker_init``, also after
    an import inside the function), its closure variables, defaults and ``__wrapped__``."""
    glob = fn.__globals__
    global_names, attrs, imported = _names(fn.__code__)
    values = [glob[n] for n in sorted(global_names) if n in glob]
    modules = [v for v in values if isinstance(v, types.ModuleType) and _in_course(v.__name__)]
    modules += [sys.modules[m] for m in sorted(imported) if _in_course(m) and m in sys.modules]
    done: set[str] = set()
    while modules:
        module = modules.pop()
        if module.__name__ in done:
            continue
        done.add(module.__name__)
        for name in sorted(attrs):
            value = vars(module).get(name)
            if isinstance(value, types.ModuleType):
                modules.append(value)
            elif value is not None:
                values.append(value)
    for cell in fn.__closure__ or ():
        try:
            values.append(cell.cell_contents)
        except ValueError:  # a cell not filled yet
            pass
    values += list(fn.__defaults__ or ()) + list((fn.__kwdefaults__ or {}).values())
    if hasattr(fn, "__wrapped__"):
        values.append(fn.__wrapped__)
    yield from values


def _parts(obj: Any) -> Iterator[Any]:
    """The objects ``obj`` is made of, when it is the learner's: a function's references, a
    partial's function and arguments, a method's function and instance, a class's methods and
    attributes (its own and its bases'), an instance's class and attributes, a small
    container's items. Course and library objects are compared, never looked into."""
    if isinstance(obj, _PLAIN):
        return
    if isinstance(obj, functools.partial):
        yield obj.func
        yield from obj.args
        yield from obj.keywords.values()
    elif isinstance(obj, types.MethodType):
        yield obj.__func__
        yield obj.__self__
    elif isinstance(obj, (staticmethod, classmethod)):
        yield obj.__func__
    elif isinstance(obj, property):
        yield from (f for f in (obj.fget, obj.fset, obj.fdel) if f is not None)
    elif isinstance(obj, (list, tuple, set, frozenset, dict)):
        if len(obj) <= _MAX_ITEMS:
            yield from (obj.values() if isinstance(obj, dict) else obj)
    elif _defined_in_course(obj) or _is_library(obj):
        return
    elif isinstance(obj, types.FunctionType):
        yield from _referenced(obj)
    elif isinstance(obj, type):
        for klass in obj.__mro__:
            if not (_defined_in_course(klass) or _is_library(klass)):
                yield from vars(klass).values()
    else:
        yield type(obj)
        attrs = getattr(obj, "__dict__", None)
        if isinstance(attrs, dict) and len(attrs) <= _MAX_ITEMS:
            yield from attrs.values()


def _label(obj: Any) -> str:
    if isinstance(obj, functools.partial):
        return f"functools.partial({_label(obj.func)}, ...)"
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    if isinstance(name, str) and isinstance(obj, (type, types.FunctionType, types.MethodType,
                                                  types.BuiltinFunctionType)):
        return name
    return f"a {type(obj).__name__} object"


def _path_label(obj: Any) -> str | None:
    """How the learner's function, class or object (by its class) is named on the way to a
    helper; None for what is only passed through (partials, methods, containers, values)."""
    if isinstance(obj, (type, types.FunctionType)):
        return _label(obj)
    if isinstance(obj, _PLAIN + (functools.partial, types.MethodType, staticmethod, classmethod,
                                 property, list, tuple, set, frozenset, dict)):
        return None
    return None if _defined_in_course(obj) or _is_library(obj) else type(obj).__qualname__


def _same(obj: Any, helper: Any) -> bool:
    """``obj`` is ``helper``, or a course function or class of the same name and kind (a copy
    of it left in another module, as while a helper moves between modules)."""
    if obj is helper:
        return True
    kinds = (type, types.FunctionType)
    return (isinstance(obj, kinds) and isinstance(helper, kinds)
            and isinstance(obj, type) == isinstance(helper, type)
            and _in_course(obj.__module__) and obj.__qualname__ == helper.__qualname__)


def _match(obj: Any, helpers: list[Any]) -> tuple[Any, str] | None:
    """(helper, relation) when ``obj`` is a helper, a subclass of a helper class, or an
    instance of one."""
    for helper in helpers:
        if _same(obj, helper):
            return helper, "is"
    for helper in helpers:
        if isinstance(helper, type):
            if isinstance(obj, type) and any(_same(k, helper) for k in obj.__mro__):
                return helper, "subclass"
            if not isinstance(obj, type) and any(_same(k, helper) for k in type(obj).__mro__):
                return helper, "instance"
    return None


def _search(obj: Any, helpers: list[Any], path: list[str], depth: int,
            seen: set[int]) -> tuple[Any, str, list[str]] | None:
    """Depth-first through :func:`_parts`: (helper, relation, the learner's functions and
    classes on the way) for the first helper found."""
    if id(obj) in seen or depth > _MAX_DEPTH:
        return None
    seen.add(id(obj))
    hit = _match(obj, helpers)
    if hit is not None:
        return hit[0], hit[1], path
    label = _path_label(obj)
    if label and (not path or label != path[-1]):
        # Prefetcher -> Prefetcher.__iter__ reads as Prefetcher.__iter__
        path = path[:-1] + [label] if path and label.startswith(path[-1] + ".") else path + [label]
    for part in _parts(obj):
        found = _search(part, helpers, path, depth + 1, seen)
        if found is not None:
            return found
    return None


def _factories(cls: type, helpers: list[Any]) -> list[str]:
    """Names of the helper functions annotated as returning ``cls`` (e.g. make_worker_init)."""
    names = []
    for helper in helpers:
        if isinstance(helper, types.FunctionType):
            returns = inspect.signature(helper).return_annotation
            if returns is cls or returns == cls.__name__:
                names.append(helper.__name__)
    return names


def refuse_course_helper(exercise: str, answer: Any, helpers: Iterable[Any], *,
                         write: str) -> None:
    """Raise :class:`ExerciseFailed` when ``answer`` is the course's own version of the
    exercise instead of the learner's code.

    Refused: anything defined in the course package handed in as the answer itself (a
    function, a class, a class deriving from a course class, an instance of a course class
    such as what ``make_worker_init(1)`` returns); and an answer built on one of ``helpers``
    (the course objects this exercise asks the learner to write themselves): a subclass or an
    instance of a helper class, or a function, method, ``functools.partial``, lambda, class or
    instance whose code refers to a helper: by global name (resolved through the function's
    ``__globals__`` to the object it holds, so an alias is found and an unrelated name is
    not), as an attribute of a course module (also imported inside the function), in a
    closure, a default value or ``__wrapped__``, followed through the learner's other
    functions and classes. Course objects the exercise gives (not in ``helpers``) and library
    code (torch, NumPy, OpenCV, ...) may be used freely. ``write`` says what to write (a hint,
    not the answer).
    """
    helpers = list(helpers)
    if _course_made(answer):
        if isinstance(answer, types.MethodType):  # a course object's method: name the object
            answer = answer.__func__ if _course_made(answer.__func__) else answer.__self__
        if isinstance(answer, (type, types.FunctionType)) and _in_course(answer.__module__):
            helper, seen = answer, f"the answer is `{_label(answer)}` itself"
        else:
            cls = answer if isinstance(answer, type) else type(answer)
            helper = next(k for k in cls.__mro__ if _in_course(k.__module__))
            made = _factories(helper, helpers)
            seen = (f"`{_label(answer)}` derives from it" if isinstance(answer, type) else
                    f"the answer is an instance of it"
                    f"{f' (what {made[0]}(...) returns)' if made else ''}")
    else:
        found = _search(answer, helpers, [], 0, set())
        if found is None:
            return
        helper, relation, path = found
        where = " -> ".join(f"`{p}`" for p in path) or f"`{_label(answer)}`"
        made = _factories(helper, helpers) if isinstance(helper, type) else []
        made_by = f" (what {made[0]}(...) returns)" if made else ""
        seen = {"subclass": f"{where} derives from it",
                "instance": (f"{where} holds an instance of it" if path
                             else "the answer is an instance of it") + made_by,
                "is": f"{where} uses it"}[relation]
    where = _module_of(helper) if isinstance(helper, (type, types.FunctionType)) else None
    name = f"`{_label(helper)}`" + (f" ({where})" if where else "")
    raise ExerciseFailed(
        exercise, f"the answer is built on the course's own {name}, not on code of your own.",
        expected="your own code (library calls such as torch, NumPy or OpenCV are fine)",
        seen=seen,
        hint=f"this exercise asks you to write the mechanism yourself: {write}. The course's "
             f"version is for the lessons after this one; handing it in, or code built on it, "
             f"skips what this exercise teaches.")
