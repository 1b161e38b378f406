"""The graders: ``from course_utils.grading import check`` and ``check("03.choose_workers",
answer)``. :mod:`~course_utils.grading.checker` holds :func:`check` and what every grader shares;
``ex00_measure_first`` ... ``ex08_find_the_stall``, one grader per exercise notebook;
:mod:`~course_utils.grading.grade` and :mod:`~course_utils.grading.cli`, ``python -m course_utils
grade NOTEBOOK`` through nbval (with ``kernels`` and the plugin ``_nbval_kernels``). Importing
this package loads no grader: ``check`` loads them when first asked.
"""
from __future__ import annotations

import importlib
from typing import Any

__all__ = ["CheckResult", "ExerciseFailed", "check"]


def __getattr__(name: str) -> Any:
    """:func:`check` and its exception on first use (PEP 562): the package stays light."""
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(".checker", __name__), name)
    globals()[name] = value
    return value
