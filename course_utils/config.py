"""Quick mode (``COURSE_QUICK=1``), read in one place: it shrinks every experiment so the suite
runs in minutes; whatever sizes one calls :func:`pick` (or :func:`quick_mode`)."""
from __future__ import annotations

import os
from typing import TypeVar

QUICK_ENV = "COURSE_QUICK"
#: What every figure title and advice table made in quick mode says (plots, advice).
QUICK_STAMP = f"QUICK MODE ({QUICK_ENV}=1): shrunk experiments, rough numbers"

T = TypeVar("T")


def quick_mode() -> bool:
    """Whether ``COURSE_QUICK`` is 1/true/yes/on (0/false/no/off or unset: not; else a ValueError)."""
    raw = os.environ.get(QUICK_ENV, "")
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on", "", "0", "false", "no", "off"):
        return value in ("1", "true", "yes", "on")
    raise ValueError(f"{QUICK_ENV}={raw!r} is not understood: set it to 1 (quick mode) or 0 "
                     f"(full mode), or unset it.")


def pick(full: T, quick: T) -> T:
    """``quick`` in quick mode, else ``full``."""
    return quick if quick_mode() else full


def mode_banner() -> str:
    """The quick-mode line of a notebook's setup cell ("" in full mode)."""
    return f"{QUICK_STAMP}; unset {QUICK_ENV} for real measurement." if quick_mode() else ""
