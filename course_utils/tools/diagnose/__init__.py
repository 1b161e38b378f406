"""``python -m course_utils diagnose``: is *your* training waiting for data, and what helps?

Two ways in. ``diagnose train.py [ARGS...]`` runs the learner's script unchanged and times every
DataLoader batch it makes (:mod:`.script`, with :mod:`.probe` inside the script's process).
``diagnose MODULE:FUNCTION`` times a loop handed over as ``(loader, step)`` (:mod:`.loop`).
Both give the verdict with the same rules (:mod:`.rules`).
"""
from .loop import (Diagnosis, LoopTiming, build_loop, diagnose, load_target, rebuild, time_loop,
                   time_step_alone, warmup_steps)
from .rules import (DATA_BOUND_FRACTION, LOADER_ALONE_FACTOR, POOL_THREADS, STEP_SLOWDOWN_FACTOR,
                    DiagnoseError, loader_barely_faster, runs_own_pools, step_slowed, verdict)
from .script import ScriptDiagnosis, diagnose_script, parse_try

__all__ = ["DATA_BOUND_FRACTION", "LOADER_ALONE_FACTOR", "POOL_THREADS", "STEP_SLOWDOWN_FACTOR",
           "Diagnosis", "DiagnoseError", "LoopTiming", "ScriptDiagnosis", "build_loop",
           "diagnose", "diagnose_script", "load_target", "loader_barely_faster", "parse_try",
           "rebuild", "runs_own_pools", "step_slowed", "time_loop", "time_step_alone", "verdict",
           "warmup_steps"]
