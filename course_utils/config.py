"""Course settings, read in one place.

Quick mode shrinks every experiment so the whole test suite runs in a few minutes on a
2-core machine. It is switched on by one environment variable, ``COURSE_QUICK``:

    COURSE_QUICK=1 jupyter lab        # quick: small datasets, few repeats
    COURSE_QUICK=0 jupyter lab        # full: real measurement (the default)

Every helper that sizes an experiment calls :func:`quick_mode` or :func:`pick`; nothing else
reads the variable.
"""
from __future__ import annotations

import os
from typing import TypeVar

QUICK_ENV = "COURSE_QUICK"

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}

T = TypeVar("T")


def quick_mode() -> bool:
    """Return True when ``COURSE_QUICK`` asks for quick mode.

    Raises ValueError naming the variable when its value is not one of
    1/true/yes/on or 0/false/no/off (case-insensitive).
    """
    raw = os.environ.get(QUICK_ENV, "")
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(
        f"{QUICK_ENV}={raw!r} is not understood: set it to 1 (quick mode) or 0 (full mode), "
        f"or unset it."
    )


def pick(full: T, quick: T) -> T:
    """Return ``quick`` in quick mode and ``full`` otherwise."""
    return quick if quick_mode() else full


def mode_banner() -> str:
    """One line for a notebook's setup cell; empty string in full mode."""
    if quick_mode():
        return (f"QUICK MODE ({QUICK_ENV}=1): experiments are shrunk to run fast; "
                f"numbers are rough. Unset {QUICK_ENV} for real measurement.")
    return ""
