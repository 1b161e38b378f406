"""``check("00.time_loader", time_loader)`` runs the grader registered for that id on the answer,
for real: a :class:`CheckResult`, or :class:`ExerciseFailed` (what was expected, what was seen, a
hint). An answer defined in the course package itself is refused (:func:`refuse_course_code`)."""
from __future__ import annotations

import functools
import importlib
import inspect
import os
import pkgutil
import types
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

__all__ = ["ExerciseFailed", "CheckResult", "check", "grader", "exercise_ids",
           "refuse_course_code", "require_callable", "require_signature", "call_answer", "describe"]

#: the course package's name ("course_utils"): what its code's ``__module__`` starts with
_PACKAGE = __name__.partition(".")[0]


class ExerciseFailed(AssertionError):
    """An exercise answer did not pass; the message teaches what to change."""

    def __init__(self, exercise: str, problem: str, *, expected: str = "", seen: str = "",
                 hint: str = "") -> None:
        self.exercise, self.problem, self.expected, self.seen, self.hint = (
            exercise, problem, expected, seen, hint)
        super().__init__("\n".join([f"{exercise}: {problem}"] + [
            f"  {k}:{' ' * (9 - len(k))}{v}" for k, v in
            (("expected", expected), ("seen", seen), ("hint", hint)) if v]))

    def as_exercise(self, exercise: str) -> "ExerciseFailed":
        """The same failure, reported for ``exercise`` (a step that reuses another's checks)."""
        return ExerciseFailed(exercise, self.problem, expected=self.expected, seen=self.seen, hint=self.hint)


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
    """Grade ``answer`` for ``exercise``; ``options`` go to the grader (a test's smaller load)."""
    _load_graders()
    if exercise not in _GRADERS:
        known = ", ".join(sorted(_GRADERS)) or "none"
        raise ValueError(f"check(exercise={exercise!r}): no such exercise; known ids: {known}.")
    refuse_course_code(exercise, answer)
    try:
        return _GRADERS[exercise](answer, **options)
    except NotImplementedError as exc:
        raise ExerciseFailed(
            exercise, "not done yet: the answer still raises NotImplementedError.",
            hint="replace the `raise NotImplementedError(...)` line with your code, run that "
                 "cell, then run this check again.") from exc


# ---- what every grader does with an answer ---------------------------------------------------
def describe(x: Any, limit: int = 80) -> str:
    """A value as a failure shows it: a tensor's or array's shape and dtype, else its repr."""
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


def require_signature(exercise: str, fn: Callable[..., Any], problem: str, expected: str,
                      *args: Any, **kwargs: Any) -> None:
    """Fail unless ``fn`` is callable and ``fn(*args, **kwargs)`` binds (else ``problem``)."""
    require_callable(exercise, fn, expected)
    try:
        inspect.signature(fn).bind(*args, **kwargs)
    except TypeError:
        raise ExerciseFailed(exercise, problem, expected=expected, seen=f"the signature "
                             f"{getattr(fn, '__name__', 'answer')}{inspect.signature(fn)}") from None
    except ValueError:
        pass


def call_answer(exercise: str, fn: Callable[..., Any], *args: Any, what: str = "your function",
                signature: str = "", hint: Any = None, expected: str = "", seen: str = "",
                **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``; an error (not NotImplementedError) fails with ``hint``."""
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
                             expected=expected, seen=seen, hint=(hint(exc) if callable(hint) else hint)
                             or "run it in a cell of its own and read the traceback.") from exc


def refuse_course_code(exercise: str, answer: Any) -> None:
    """Refuse an answer (function, class, partial, method, instance) defined in course_utils."""
    obj = answer.func if isinstance(answer, functools.partial) else answer
    obj = getattr(obj, "__func__", obj) if isinstance(obj, types.MethodType) else obj
    if not isinstance(obj, (type, types.FunctionType, types.BuiltinFunctionType)):
        obj = type(obj)
    module = getattr(obj, "__module__", None) or ""
    if module.partition(".")[0] == _PACKAGE:
        raise ExerciseFailed(
            exercise, f"the answer is the course's own `{obj.__qualname__}` ({module}), not code "
                      f"of your own.",
            expected="a function or class you wrote (calls to torch, NumPy or OpenCV are fine)",
            seen=describe(answer),
            hint="the exercise asks you to write this mechanism yourself; the course's version "
                 "is for the lessons after it.")
