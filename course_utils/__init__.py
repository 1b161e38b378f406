"""course_utils — the helper package of the "Feed the GPU" course.

Everything the notebooks use is importable from here by name (no star imports in the
notebooks), and everything a DataLoader worker runs is defined in this package so it works
under the ``spawn`` start method. Importing the package changes nothing: no thread settings,
no seeding, no printing.
"""
from __future__ import annotations

from .augment import (AugmentParams, AugmentTransform, augment_batch, compare_training,
                      measure_augment_throughput)
from .bench import (Comparison, DataWait, Measurement, batch_size_of, compare, measure,
                    measure_data_wait, measure_loader)
from .config import QUICK_ENV, mode_banner, pick, quick_mode
from .data import (ArrayDataset, CommonRecipeTransform, ImageFolderDataset, JpegDataset,
                   LatencyDataset, ToTensorUint8, ram_budget_bytes, sample_photo)
from .distributed import (Budget, DdpMeasurement, DistributedError, DistributedRun, IndexDataset,
                          ShardingReport, budget, launch, measure_ddp, sharding_report,
                          simulate_ranks)
from .grading import CheckResult, ExerciseFailed, check
from .machine import (AcceleratorInfo, CpuInfo, DoctorReport, accelerator, cpu_info,
                      default_device, doctor, machine_summary, start_method, usable_cpus)
from .oversubscription import (GridResult, OpenCVHeavyTransform, env_after_vs_before_import,
                               fork_cv2_demo, opencv_heavy_dataset, plot_grid, run_grid)
from .pipelines import (BenchmarkResult, TransformedDataset, common_recipe_loader, run_benchmark,
                        tuned_loader)
from .plots import figure_title, plot_curve, plot_measurements
from .scaling import (BatchedArrayDataset, RecordArrayDataset, RecordListDataset, WorkerMemory,
                      WorkerSweep, default_worker_counts, describe_curve, find_knee, keep_batch,
                      plot_sweeps, plot_worker_memory, sweep_workers, time_epochs, worker_memory,
                      worker_startup_time)
from .transfer import (DevicePrefetcher, bandwidth_sweep, cuda_in_forked_worker, measure_overlap,
                       mismeasured_copy, pin_memory_cost, uint8_vs_float32)
from .threads import (ThreadPools, WorkerThreadLimiter, limit_threads, make_worker_init,
                      pools_in_workers, thread_pools)
from .tuning import LoaderSettings, Trial, TuningResult, tune_loader
from .transforms import (PipelineParams, ReferenceTransform, ToFloat32, Uint8Transform,
                         exact_pipeline, normalize_batch, numpy_pipeline, opencv_pipeline,
                         output_difference, torch_pipeline)

__version__ = "0.1.0"

__all__ = [
    "AcceleratorInfo", "ArrayDataset", "CheckResult", "CommonRecipeTransform", "Comparison",
    "CpuInfo", "DataWait", "DoctorReport", "ExerciseFailed", "ImageFolderDataset", "JpegDataset",
    "LatencyDataset", "Measurement", "QUICK_ENV", "ThreadPools", "ToTensorUint8",
    "WorkerThreadLimiter", "accelerator", "batch_size_of", "check", "compare", "cpu_info",
    "default_device", "doctor", "figure_title", "limit_threads", "machine_summary",
    "make_worker_init", "measure", "measure_data_wait", "measure_loader", "mode_banner", "pick",
    "plot_curve", "plot_measurements", "pools_in_workers", "quick_mode", "ram_budget_bytes",
    "sample_photo", "start_method", "thread_pools", "usable_cpus",
    # pipelines (the benchmark)
    "BenchmarkResult", "TransformedDataset", "common_recipe_loader", "run_benchmark", "tuned_loader",
    # lesson 01
    "PipelineParams", "ReferenceTransform", "ToFloat32", "Uint8Transform", "exact_pipeline",
    "normalize_batch", "numpy_pipeline", "opencv_pipeline", "output_difference", "torch_pipeline",
    # lesson 02
    "GridResult", "OpenCVHeavyTransform", "env_after_vs_before_import", "fork_cv2_demo",
    "opencv_heavy_dataset", "plot_grid", "run_grid",
    # lesson 04
    "DevicePrefetcher", "bandwidth_sweep", "cuda_in_forked_worker", "measure_overlap",
    "mismeasured_copy", "pin_memory_cost", "uint8_vs_float32",
    # lesson 06
    "LoaderSettings", "Trial", "TuningResult", "tune_loader",
    # lesson 05
    "AugmentParams", "AugmentTransform", "augment_batch", "compare_training",
    "measure_augment_throughput",
    # lesson 03
    "BatchedArrayDataset", "RecordArrayDataset", "RecordListDataset", "WorkerMemory", "WorkerSweep",
    "default_worker_counts", "describe_curve", "find_knee", "keep_batch", "plot_sweeps",
    "plot_worker_memory", "sweep_workers", "time_epochs", "worker_memory", "worker_startup_time",
    # lesson 07
    "Budget", "DdpMeasurement", "DistributedError", "DistributedRun", "IndexDataset",
    "ShardingReport", "budget", "launch", "measure_ddp", "sharding_report", "simulate_ranks",
]
