"""Course settings, read in one place: quick mode (``COURSE_QUICK=1``) shrinks every experiment
so the test suite runs in minutes; every helper that sizes one calls :func:`quick_mode` or
:func:`pick`, and nothing else reads the variable."""
from __future__ import annotations

import os
from typing import TypeVar

QUICK_ENV = "COURSE_QUICK"

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}

T = TypeVar("T")


def quick_mode() -> bool:
    """True when ``COURSE_QUICK`` asks for quick mode; a ValueError naming it when it is not one of
    1/true/yes/on or 0/false/no/off."""
    raw = os.environ.get(QUICK_ENV, "")
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"{QUICK_ENV}={raw!r} is not understood: set it to 1 (quick mode) or 0 "
                     f"(full mode), or unset it.")


def pick(full: T, quick: T) -> T:
    """Return ``quick`` in quick mode and ``full`` otherwise."""
    return quick if quick_mode() else full


def mode_banner() -> str:
    """One line for a notebook's setup cell; empty string in full mode."""
    if quick_mode():
        return (f"QUICK MODE ({QUICK_ENV}=1): experiments are shrunk to run fast; "
                f"numbers are rough. Unset {QUICK_ENV} for real measurement.")
    return ""
