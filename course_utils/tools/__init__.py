"""The products built on the core: ``python -m course_utils tune | diagnose | bench`` (:mod:`.tune`,
:mod:`.diagnose`, :mod:`.bench`), the torchrun launcher (:mod:`.ddp`) and the example scripts
``diagnose`` runs (:mod:`.examples`). ``from course_utils.tools import tune_loader`` (lesson 06)
loads the tuner on first use; importing this package loads no tool."""
from __future__ import annotations

import importlib
from typing import Any

__all__ = ["tune_loader"]


def __getattr__(name: str) -> Any:
    """The tuner on first use (PEP 562)."""
    if name != "tune_loader":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = importlib.import_module(".tune.search", __name__).tune_loader
    return globals()[name]
