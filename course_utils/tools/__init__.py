"""The products built on the core: ``python -m course_utils tune | diagnose | bench``, the DDP
launcher, and the example scripts ``diagnose`` runs on.

* :mod:`course_utils.tools.tune` - the tuner (lesson 06): the search, the window it measures
  each setting with, and what it returns;
* :mod:`course_utils.tools.diagnose` - is *your* training loop waiting for data, and why;
* :mod:`course_utils.tools.bench` - the recipes learners run vs the course's pipeline, on files;
* :mod:`course_utils.tools.ddp` - the torchrun launcher (lesson 07, exercise 07) and the program
  every rank runs;
* :mod:`course_utils.tools.examples` - two learner-style training scripts (data-, compute-bound).

Tools import the core (:mod:`course_utils`), never :mod:`course_utils.grading`; the core imports
no tool. ``from course_utils.tools import tune_loader`` is lesson 06's tuner; importing this
package imports no tool beyond the core (the tuner is loaded when it is first asked for).
"""
from __future__ import annotations

import importlib
from typing import Any

__all__ = ["tune_loader"]

_LAZY = {"tune_loader": ".tune.search"}


def __getattr__(name: str) -> Any:
    """The tuner on first use (PEP 562), so that ``import course_utils.tools`` stays light."""
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name], __name__), name)
    globals()[name] = value
    return value
