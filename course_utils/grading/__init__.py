"""The graders: ``check("03.choose_workers", answer)`` and one grader per exercise.

* :mod:`course_utils.grading.checker` - :func:`check`, the registry, :class:`ExerciseFailed`,
  :class:`CheckResult` and what every grader shares (refusing the course's own helper);
* ``ex00_measure_first`` ... ``ex08_find_the_stall`` - one module per exercise, named like the
  exercise notebook (``exercises/03_num_workers.ipynb``: ``ex03_num_workers``);
* :mod:`course_utils.grading.grade` - grading whole notebooks through nbval, with
  :mod:`~course_utils.grading.kernels` and the pytest plugins ``_nbval_kernels`` and
  ``_nbval_report``; :mod:`~course_utils.grading.cli` - its command,
  ``python -m course_utils grade NOTEBOOK``.

Graders import the core and the tools; neither imports them. ``from course_utils.grading import
check, ExerciseFailed`` is what the exercises use; importing this package loads no grader (they
are loaded when ``check`` is first asked for).
"""
from __future__ import annotations

import importlib
from typing import Any

__all__ = ["CheckResult", "ExerciseFailed", "check"]

_LAZY = {"CheckResult": ".checker", "ExerciseFailed": ".checker", "check": ".checker"}


def __getattr__(name: str) -> Any:
    """:func:`check` and its exception on first use (PEP 562): the package stays light."""
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name], __name__), name)
    globals()[name] = value
    return value
