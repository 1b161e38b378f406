"""The argument checks of public entry points: each names the argument, what it must be and what
it got, and returns the value converted. ``where`` (the function) starts the message, ``hint``
ends it; a value of the wrong kind raises :class:`WrongType` (a TypeError and a ValueError)."""
from __future__ import annotations

import math
import numbers
import operator
import os
from pathlib import Path
from typing import Any, Callable, Optional, Union

__all__ = ["WrongType", "check_int", "check_seconds", "check_fraction", "check_index", "check_transform",
           "check_folder"]


class WrongType(TypeError, ValueError):
    """An argument of the wrong kind (a str where an int belongs, a bool for a count, ...)."""


def _prefix(where: str) -> str:
    return f"{where}: " if where else ""


def check_int(name: str, value: Any, minimum: int, where: str = "", hint: str = "", *,
              allow_none: bool = False, maximum: int | None = None) -> int | None:
    """``value`` as an int in [``minimum``, ``maximum``] (None passes with ``allow_none``)."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise WrongType(f"{_prefix(where)}{name} must be an int >= {minimum}"
                        f"{' or None' if allow_none else ''}, got {value!r} "
                        f"({type(value).__name__}).{hint}")
    if value < minimum:
        raise ValueError(f"{_prefix(where)}{name}={value!r} is too small: {name} must be "
                         f">= {minimum}.{hint}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{_prefix(where)}{name}={value!r} is too large: {name} must be "
                         f"<= {maximum}.{hint}")
    return int(value)


def _real(name: str, value: Any, where: str, need: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise WrongType(f"{_prefix(where)}{name} must be {need}, got {value!r}.")
    return float(value)


def check_seconds(name: str, value: Any, where: str = "", *, positive: bool = False) -> float:
    """``value`` as a finite number of seconds, >= 0 (``> 0`` with ``positive``)."""
    need = "> 0" if positive else ">= 0"
    value = _real(name, value, where, f"a number of seconds {need}")
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise ValueError(f"{_prefix(where)}{name} must be a number of seconds {need} (finite), "
                         f"got {value!r}.")
    return value


def check_fraction(name: str, value: Any, where: str = "") -> float:
    """``value`` as a number in (0, 1]."""
    value = _real(name, value, where, "a number in (0, 1]")
    if not 0.0 < value <= 1.0:
        raise ValueError(f"{_prefix(where)}{name}={value!r} must be in (0, 1], e.g. 0.9 for "
                         f"'within 90 % of the best'.")
    return value


def check_index(i: Any, n: int, where: str) -> int:
    """A sample index into ``n`` samples (negative from the end); out of range an IndexError, so
    ``for x in dataset`` stops as Python expects."""
    try:
        i = operator.index(i)
    except TypeError:
        raise TypeError(f"{where}: index must be an int, got {i!r} ({type(i).__name__}).") from None
    if i < 0:
        i += n
    if not 0 <= i < n:
        raise IndexError(f"{where}: index {i} is out of range for a dataset of {n} samples.")
    return i


def check_transform(transform: Any, where: str) -> Optional[Callable]:
    """A dataset's ``transform``: a callable or None."""
    if transform is not None and not callable(transform):
        raise TypeError(f"{where}: transform must be callable or None, got {transform!r}; "
                        f"pass e.g. CommonRecipeTransform() (a class from course_utils, so "
                        f"workers can unpickle it).")
    return transform


def check_folder(value: Union[str, os.PathLike], name: str, hint: str) -> Path:
    """``value`` as an existing folder (``~`` expanded), else an error naming ``name`` and ending
    in ``hint`` (what to pass instead)."""
    path = Path(value).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"{name}={str(value)!r}: no such folder; {hint}")
    if not path.is_dir():
        raise NotADirectoryError(f"{name}={str(value)!r} is a file, not a folder; {hint}")
    return path
