"""Argument checks, one family: each names the argument, what it must be, and what it got.

Helpers call these instead of writing their own ``isinstance``/range checks, so that every bad
argument in the course fails the same clear way (a TypeError for the wrong kind of value, a
ValueError for the wrong range). Nothing happens at import time.
"""
from __future__ import annotations

import numbers
from typing import Any

__all__ = ["check_int"]


def check_int(name: str, value: Any, minimum: int, *, allow_none: bool = False) -> None:
    """Raise unless ``value`` is an int (not a bool) >= ``minimum`` (or None when allowed)."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int >= {minimum}{' or None' if allow_none else ''}, "
                        f"got {value!r}.")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}.")
