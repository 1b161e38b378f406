"""Self-grading for the course exercises: ``check("00.time_loader", time_loader)`` runs the
grader registered (with :func:`grader`; one module per exercise in ``course_utils.grading``) for
that id on the answer, for real, and returns a :class:`CheckResult` or raises
:class:`ExerciseFailed`, whose message says what was expected, what was seen, and a hint.
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

import numpy as np
import torch

__all__ = ["ExerciseFailed", "CheckResult", "check", "grader", "exercise_ids",
           "refuse_course_helper", "require_callable", "call_answer", "describe"]

#: the course package's name ("course_utils"): what its helpers' ``__module__`` starts with
_PACKAGE = __name__.partition(".")[0]
#: folders of the standard library and installed packages: code there is not the learner's
_LIBRARY_DIRS = tuple(sorted({os.path.join(os.path.realpath(sysconfig.get_paths()[k]), "")
                              for k in ("stdlib", "platstdlib", "purelib", "platlib")}))
_MAX_DEPTH = 6   # how deep refuse_course_helper follows references
_MAX_ITEMS = 64  # containers with more items are data, not code: not looked into
#: values that hold no code
_PLAIN = (str, bytes, bytearray, int, float, complex, type(None), types.ModuleType,
          types.BuiltinFunctionType, types.CodeType)


class ExerciseFailed(AssertionError):
    """An exercise answer did not pass; the message teaches what to change."""

    def __init__(self, exercise: str, problem: str, *, expected: str = "", seen: str = "",
                 hint: str = "") -> None:
        for name, text in (("exercise", exercise), ("problem", problem), ("expected", expected),
                           ("seen", seen), ("hint", hint)):
            if not isinstance(text, str) or (not text and name in ("exercise", "problem")):
                # a grader's bug, not the learner's: every part of the message is text
                raise TypeError(f"ExerciseFailed: {name} must be a str (the text the learner "
                                f"reads; exercise and problem non-empty), got {text!r}")
        self.exercise, self.problem = exercise, problem
        self.expected, self.seen, self.hint = expected, seen, hint
        lines = [f"{exercise}: {problem}"] + [f"  {k}:{' ' * (9 - len(k))}{v}" for k, v in (
            ("expected", expected), ("seen", seen), ("hint", hint)) if v]
        super().__init__("\n".join(lines))

    def as_exercise(self, exercise: str) -> "ExerciseFailed":
        """The same failure, reported for ``exercise`` (a step that reuses another's checks)."""
        return ExerciseFailed(exercise, self.problem, expected=self.expected, seen=self.seen,
                              hint=self.hint)


@dataclass
class CheckResult:
    """What a passing check found (printed in the notebook)."""

    exercise: str
    summary: str
    details: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"PASSED {self.exercise}: {self.summary}"

    __repr__ = __str__  # notebooks echo the return value of the last line


_GRADERS: dict[str, Callable[..., CheckResult]] = {}


def grader(exercise: str) -> Callable[[Callable[..., CheckResult]], Callable[..., CheckResult]]:
    """Register the decorated function as the grader for ``exercise``."""
    def register(fn: Callable[..., CheckResult]) -> Callable[..., CheckResult]:
        _GRADERS[exercise] = fn
        return fn
    return register


def _load_graders() -> None:
    package = __name__.rpartition(".")[0]
    for module in pkgutil.iter_modules([os.path.dirname(__file__)]):
        if module.name[:2] == "ex" and module.name[2:4].isdigit():  # ex03_num_workers
            importlib.import_module(f"{package}.{module.name}")


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
# what every grader does with an answer
# --------------------------------------------------------------------------------------
def describe(x: Any, limit: int = 80) -> str:
    """A value as a failure message shows it: an array's or tensor's shape, dtype (and device),
    else its type and the start of its repr."""
    if isinstance(x, torch.Tensor):
        return f"torch.Tensor {tuple(x.shape)} {x.dtype} on {x.device}"
    if isinstance(x, np.ndarray):
        return f"NumPy array {x.shape} {x.dtype}"
    return f"{type(x).__name__}: {x!r}"[:limit]


def require_callable(exercise: str, answer: Any, expected: str, *, what: str = "function",
                     hint: str = "pass the function itself, without calling it.") -> None:
    """Raise :class:`ExerciseFailed` unless ``answer`` can be called."""
    if not callable(answer):
        raise ExerciseFailed(exercise, f"the answer is not a {what}.", expected=expected,
                             seen=describe(answer), hint=hint)


def call_answer(exercise: str, fn: Callable[..., Any], *args: Any, what: str = "your function",
                signature: str = "", hint: Any = None, expected: str = "", seen: str = "",
                **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``. NotImplementedError goes on to :func:`check` ("not done yet");
    any other error becomes a failure saying ``what`` raised it, with ``hint`` (a text, or a
    function of the exception returning one or None); a TypeError about the arguments, when
    ``signature`` is given, asks to keep that signature."""
    try:
        return fn(*args, **kwargs)
    except NotImplementedError:
        raise
    except Exception as exc:  # the learner's code can raise anything
        if signature and isinstance(exc, TypeError) and "argument" in str(exc):
            raise ExerciseFailed(exercise, f"calling {what} failed: {exc}", expected=signature,
                                 hint="keep the stub's signature: the check passes the keyword "
                                      "arguments by name.") from exc
        raise ExerciseFailed(exercise, f"{what} raised {type(exc).__name__}: {exc}",
                             expected=expected, seen=seen,
                             hint=(hint(exc) if callable(hint) else hint)
                             or "run it in a cell of its own and read the traceback.") from exc


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
    """A function or class defined in the course package, or an instance of one."""
    return _in_course(_module_of(obj))


def _course_made(obj: Any) -> bool:
    """Also a class deriving from a course class, or an instance of one; a method: of one."""
    if isinstance(obj, types.MethodType):
        return _course_made(obj.__func__) or _course_made(obj.__self__)
    klass = obj if isinstance(obj, type) else type(obj)
    return (not isinstance(obj, type) and _defined_in_course(obj)) or any(
        _in_course(k.__module__) for k in klass.__mro__)


def _is_library(obj: Any) -> bool:
    """Code of the standard library or an installed package (never the learner's)."""
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
    """(global names, attribute names, imported modules) the code and its nested code read."""
    found: tuple[set[str], set[str], set[str]] = (set(), set(), set())
    kinds = {"LOAD_GLOBAL": 0, "LOAD_NAME": 0, "LOAD_ATTR": 1, "LOAD_METHOD": 1,
             "LOAD_SUPER_ATTR": 1, "IMPORT_FROM": 1, "IMPORT_NAME": 2}
    for ins in dis.get_instructions(code):
        if ins.opname in kinds:
            found[kinds[ins.opname]].add(ins.argval)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            for mine, more in zip(found, _names(const)):
                mine |= more
    return found


def _referenced(fn: types.FunctionType) -> Iterator[Any]:
    """What ``fn`` refers to: its global names' objects, the course modules' attributes it
    reads (also after an import inside it), its closure, defaults and ``__wrapped__``."""
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
        for value in (vars(module).get(name) for name in sorted(attrs)):
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
    """The objects a learner's ``obj`` is made of (a function's references, a partial's or
    method's pieces, a class's and an instance's attributes, a small container's items).
    Course and library objects are compared, never looked into."""
    if isinstance(obj, _PLAIN):
        return
    if isinstance(obj, functools.partial):
        yield from (obj.func, *obj.args, *obj.keywords.values())
    elif isinstance(obj, types.MethodType):
        yield from (obj.__func__, obj.__self__)
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
    """How a learner's function, class or object (by its class) is named on the way to a
    helper; None for what is only passed through (partials, methods, containers, values)."""
    if isinstance(obj, (type, types.FunctionType)):
        return _label(obj)
    if isinstance(obj, _PLAIN + (functools.partial, types.MethodType, staticmethod, classmethod,
                                 property, list, tuple, set, frozenset, dict)):
        return None
    return None if _defined_in_course(obj) or _is_library(obj) else type(obj).__qualname__


def _same(obj: Any, helper: Any) -> bool:
    """``obj`` is ``helper``, or a course function or class of the same name and kind (a copy
    left in another module while a helper moves)."""
    kinds = (type, types.FunctionType)
    return obj is helper or (isinstance(obj, kinds) and isinstance(helper, kinds)
                             and isinstance(obj, type) == isinstance(helper, type)
                             and _in_course(obj.__module__)
                             and obj.__qualname__ == helper.__qualname__)


def _match(obj: Any, helpers: list[Any]) -> tuple[Any, str] | None:
    """(helper, "is" | "subclass" | "instance") when ``obj`` is one of ``helpers``, a
    subclass of a helper class, or an instance of one."""
    for helper in helpers:
        if _same(obj, helper):
            return helper, "is"
    for helper in (h for h in helpers if isinstance(h, type)):
        mro = obj.__mro__ if isinstance(obj, type) else type(obj).__mro__
        if any(_same(k, helper) for k in mro):
            return helper, "subclass" if isinstance(obj, type) else "instance"
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


def _made_by(cls: type, helpers: list[Any]) -> str:
    """" (what make_worker_init(...) returns)" when a helper function is annotated as
    returning ``cls``, else ""."""
    for helper in helpers:
        if isinstance(helper, types.FunctionType):
            returns = inspect.signature(helper).return_annotation
            if returns is cls or returns == cls.__name__:
                return f" (what {helper.__name__}(...) returns)"
    return ""


def refuse_course_helper(exercise: str, answer: Any, helpers: Iterable[Any], *,
                         write: str) -> None:
    """Raise :class:`ExerciseFailed` when ``answer`` is the course's own version of the
    exercise instead of the learner's code; ``write`` says what to write (a hint, not the
    answer).

    Refused: anything defined in the course package as the answer itself (a function, a
    class, a subclass or an instance of a course class); and an answer built on one of
    ``helpers`` (the course objects the exercise asks the learner to write): a subclass or
    instance of a helper class, or a function, method, partial, lambda, class or instance whose
    code refers to a helper (by global name, resolved in ``__globals__`` so an alias is found
    and an unrelated name is not; as a course module's attribute, also imported inside the
    function; in a closure, a default or ``__wrapped__``), followed through the learner's
    other functions and classes. Other course objects and library code may be used freely.
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
            seen = (f"`{_label(answer)}` derives from it" if isinstance(answer, type) else
                    f"the answer is an instance of it{_made_by(helper, helpers)}")
    else:
        found = _search(answer, helpers, [], 0, set())
        if found is None:
            return
        helper, relation, path = found
        where = " -> ".join(f"`{p}`" for p in path) or f"`{_label(answer)}`"
        made_by = _made_by(helper, helpers) if isinstance(helper, type) else ""
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
