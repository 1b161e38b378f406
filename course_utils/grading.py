"""Self-grading for the course exercises.

A learner's check cell calls :func:`check` with the exercise's id and their answer::

    check("00.time_loader", time_loader)

The grader for that id runs the answer for real (in real DataLoader workers, on real data)
and either prints a short pass line or raises :class:`ExerciseFailed`, whose message says
what was expected, what was seen, and a hint. Graders live in ``course_utils.graders``,
one module per lesson, and register themselves with :func:`grader`.
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from typing import Any, Callable

__all__ = ["ExerciseFailed", "CheckResult", "check", "grader", "exercise_ids"]


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
    from . import graders
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
