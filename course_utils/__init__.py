"""course_utils — the helper package of the "Feed the GPU" course.

The package holds what the notebooks cannot: the code DataLoader workers must import (datasets,
transforms, the thread limiter: :mod:`course_utils.data`, :mod:`course_utils.threads`), the one
timing engine (:mod:`course_utils.timing`) and its results (:mod:`course_utils.measurement`), the
device helpers (:mod:`course_utils.device`), the machine report and plots. Each lesson writes the
mechanism it teaches in its own cells first; the helpers here say in their docstrings which
lesson shows them. Bigger measurement harnesses live in :mod:`course_utils.lessons`, named like
the notebooks. The tools built on this core are in :mod:`course_utils.tools`, the graders in
:mod:`course_utils.grading`; nothing here imports either.

The names below are the ones the notebooks import from the package itself; everything else is
imported from its module by name. Importing the package changes nothing: no thread settings, no
seeding, no printing.
"""
from __future__ import annotations

from .config import mode_banner, pick
from .data import ArrayDataset, CommonRecipeTransform, JpegDataset, LatencyDataset, ToTensorUint8
from .machine import accelerator, default_device, doctor, machine_summary, usable_cpus
from .measurement import compare
from .pipelines import keep_batch
from .plots import figure_title, plot_measurements
from .start_methods import start_method
from .threads import limit_threads, make_worker_init, pools_in_workers, thread_pools
from .timing import measure, measure_data_wait, measure_loader

__version__ = "0.1.0"

__all__ = [
    # lesson 00: the machine and honest timing
    "accelerator", "default_device", "doctor", "machine_summary", "mode_banner", "pick",
    "start_method", "usable_cpus", "compare", "measure", "measure_data_wait", "measure_loader",
    "figure_title", "plot_measurements",
    # datasets and transforms workers import
    "ArrayDataset", "CommonRecipeTransform", "JpegDataset", "LatencyDataset", "ToTensorUint8",
    "keep_batch",
    # lesson 02: thread pools
    "limit_threads", "make_worker_init", "pools_in_workers", "thread_pools",
]
