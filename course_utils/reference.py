"""Reference results measured on a real GPU and shipped as JSON, so that a CPU-only learner sees
what a GPU measured beside their own figures. Written only by ``python -m course_authoring
gpu-check`` on a CUDA machine: one object per ``REFERENCE_DIR / f"{name}.json"`` with
:data:`REQUIRED_KEYS` (``measured_at`` an ISO date, ``machine`` from :func:`describe_machine`).
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
from collections.abc import Mapping
from pathlib import Path

import torch

from .machine import accelerator, cpu_info, machine_summary
from .measurement import jsonable

__all__ = ["REFERENCE_DIR", "REQUIRED_KEYS", "LESSON04", "LESSON05", "SUMMARY", "REFERENCE_NAMES",
           "MalformedReference", "describe_machine", "save_reference", "load_reference",
           "reference_path", "missing_reference_text"]

#: Where the shipped reference results live (package data of course_utils).
REFERENCE_DIR: Path = Path(__file__).resolve().parent / "reference_results"
LESSON04 = "lesson04_transfer"      # course_authoring.gpu_lesson04.run_lesson04
LESSON05 = "lesson05_augment"       # course_authoring.gpu_lesson05.run_lesson05
SUMMARY = "gpu_check_summary"       # course_authoring.gpu_check.summarize: every step, the targets
#: Every file gpu-check writes into REFERENCE_DIR (tune's JSON, for one, does not belong there).
REFERENCE_NAMES = (LESSON04, LESSON05, SUMMARY)
#: Keys every reference file has.
REQUIRED_KEYS = ("name", "measured_at", "machine", "results")


class MalformedReference(ValueError):
    """A reference file exists but is not valid JSON of the documented shape."""


def reference_path(name: str, directory: str | os.PathLike | None = None) -> Path:
    """``<directory or REFERENCE_DIR>/<name>.json``; ``name`` must be a plain file stem."""
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name) \
            or name.endswith(".json"):
        raise ValueError(f"name must be a plain file stem such as 'lesson04_transfer' (letters, "
                         f"digits, '_', '-', '.'; no folder, no '.json'), got {name!r}.")
    return Path(directory or REFERENCE_DIR) / f"{name}.json"


def describe_machine() -> dict:
    """The machine results were measured on, JSON-friendly (on CUDA it initialises CUDA)."""
    acc, cpu = accelerator(), cpu_info()
    gpu = acc.kind != "cpu"
    return {"accelerator": acc.kind, "gpu_name": acc.name if gpu else None,
            "gpu_memory_bytes": acc.memory_bytes, "gpu_count": acc.count if gpu else 0,
            "torch_version": str(torch.__version__), "cuda_version": torch.version.cuda,
            "cudnn_version": torch.backends.cudnn.version() if acc.kind == "cuda" else None,
            "cpu_count": cpu.usable, "cpu_count_logical": cpu.logical,
            "platform": f"{platform.system()} {platform.machine()}",
            "python": platform.python_version(), "summary": machine_summary()}


def save_reference(name: str, data: Mapping, *, machine: Mapping,
                   directory: str | os.PathLike | None = None) -> Path:
    """Write ``{"name", "measured_at": today, "machine", "results": data}`` to ``<name>.json``
    (NaN and inf as null) through a temporary file, so a crash never leaves half a file."""
    path = reference_path(name, directory)
    doc = {"name": name, "measured_at": _dt.date.today().isoformat(),
           "machine": jsonable(dict(machine)), "results": jsonable(dict(data))}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def load_reference(name: str, directory: str | os.PathLike | None = None) -> dict | None:
    """Reference ``name``, or None while none was measured; a :class:`MalformedReference`
    naming the file when it is not of the documented shape."""
    path = reference_path(name, directory)
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise MalformedReference(f"{path} is not valid JSON ({exc}). Delete it, or produce it again "
                                 f"with 'python -m course_authoring gpu-check' on a CUDA machine.") from None
    if not isinstance(doc, dict):
        raise MalformedReference(f"{path} must hold a JSON object, found {type(doc).__name__}.")
    missing = [k for k in REQUIRED_KEYS if k not in doc]
    if missing:
        raise MalformedReference(f"{path} lacks {', '.join(missing)} (it needs {', '.join(REQUIRED_KEYS)}); "
                                 f"produce it again with 'python -m course_authoring gpu-check'.")
    if not isinstance(doc["machine"], dict) or not isinstance(doc["results"], dict):
        raise MalformedReference(f"{path}: 'machine' and 'results' must be JSON objects.")
    return doc


def missing_reference_text(name: str) -> str:
    """What a lesson prints while reference ``name`` has not been measured."""
    return (f"No reference GPU results have been measured yet ({name}.json is not in "
            f"course_utils/reference_results/). They are produced on a CUDA machine by\n"
            f"    python -m course_authoring gpu-check\n"
            f"and never typed by hand. Meanwhile, the figures below are what THIS machine measured.")
