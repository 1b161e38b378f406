"""course_utils, the helper package of the "Feed the GPU" course: what notebooks cannot hold
(the code DataLoader workers import, the one timing engine and its results, the device, the
machine report, plots); each lesson writes the mechanism it teaches in its own cells first. Its
tools are :mod:`course_utils.tools`, its graders :mod:`course_utils.grading`; nothing here imports
either. The names below are those notebooks import from the package itself; importing it changes
nothing (no thread settings, no seeding, no printing).
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
