"""The graders: ``check`` (in ``checker``), one ``exNN_*`` grader per exercise notebook, and
``grade NOTEBOOK`` (``grade``, ``cli``, ``kernels``, ``_nbval_kernels``). Importing this package
loads no grader: ``check`` loads them when first asked."""
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
