"""Reference results measured on a real GPU, shipped with the course as JSON files, so that a
CPU-only learner sees what a GPU measured *beside* their own figures.

They are written only by ``python -m course_authoring gpu-check`` on a CUDA machine, never by
hand: one JSON object per ``REFERENCE_DIR / f"{name}.json"`` with :data:`REQUIRED_KEYS`
(``measured_at`` an ISO date, ``machine`` from :func:`describe_machine`).
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from .machine import accelerator, cpu_info, machine_summary
from .measurement import jsonable

__all__ = ["REFERENCE_DIR", "REQUIRED_KEYS", "LESSON04", "LESSON05", "SUMMARY", "REFERENCE_NAMES",
           "MalformedReference", "describe_machine", "save_reference", "load_reference",
           "reference_path", "available_references", "missing_reference_text"]

#: Where the shipped reference results live (package data of course_utils).
REFERENCE_DIR: Path = Path(__file__).resolve().parent / "reference_results"

#: Names of the reference files the course writes and reads.
LESSON04 = "lesson04_transfer"      # course_authoring.gpu_lesson04.run_lesson04
LESSON05 = "lesson05_augment"       # course_authoring.gpu_lesson05.run_lesson05
SUMMARY = "gpu_check_summary"       # course_authoring.gpu_check.summarize: every step, the targets
#: Every reference file gpu-check writes: exactly these ``<name>.json`` go into
#: REFERENCE_DIR (other JSON that a GPU run writes, such as tune's, does not belong there).
REFERENCE_NAMES = (LESSON04, LESSON05, SUMMARY)

#: Keys every reference file must have.
REQUIRED_KEYS = ("name", "measured_at", "machine", "results")

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class MalformedReference(ValueError):
    """A reference file exists but is not valid JSON of the documented shape."""


def _check_name(name: Any) -> str:
    if not isinstance(name, str) or not _NAME_RE.match(name) or name.endswith(".json"):
        raise ValueError(f"name must be a plain file stem such as 'lesson04_transfer' (letters, "
                         f"digits, '_', '-', '.'; no folder, no '.json'), got {name!r}.")
    return name


def _dir(directory: str | os.PathLike | None) -> Path:
    return REFERENCE_DIR if directory is None else Path(directory)


def reference_path(name: str, directory: str | os.PathLike | None = None) -> Path:
    """The path of reference ``name`` (``<directory or REFERENCE_DIR>/<name>.json``)."""
    return _dir(directory) / f"{_check_name(name)}.json"


def describe_machine() -> dict:
    """The machine the results were measured on, as a JSON-friendly dict (on CUDA it initialises
    CUDA and allocates nothing)."""
    acc = accelerator()
    cpu = cpu_info()
    cudnn = None
    if acc.kind == "cuda":
        try:
            cudnn = torch.backends.cudnn.version()
        except Exception:  # pragma: no cover - depends on the build
            cudnn = None
    return {
        "accelerator": acc.kind,
        "gpu_name": acc.name if acc.kind != "cpu" else None,
        "gpu_memory_bytes": acc.memory_bytes,
        "gpu_count": acc.count if acc.kind != "cpu" else 0,
        "torch_version": str(torch.__version__),
        "cuda_version": getattr(torch.version, "cuda", None),
        "cudnn_version": cudnn,
        "cpu_count": cpu.usable,
        "cpu_count_logical": cpu.logical,
        "platform": f"{platform.system()} {platform.machine()}",
        "python": platform.python_version(),
        "summary": machine_summary(),
    }


def save_reference(name: str, data: Mapping, *, machine: Mapping,
                   directory: str | os.PathLike | None = None,
                   measured_at: str | None = None) -> Path:
    """Write ``{"name", "measured_at", "machine", "results": data}`` to ``<name>.json`` (NaN/inf
    become null; ``measured_at`` defaults to today) via a temporary file, so a crash never leaves
    half a file. Returns the path written."""
    _check_name(name)
    if not isinstance(data, Mapping):
        raise TypeError(f"data must be a dict of results, got {type(data).__name__}.")
    if not isinstance(machine, Mapping) or not machine:
        raise TypeError("machine must be a non-empty dict describing the machine "
                        "(use course_utils.reference.describe_machine()).")
    if measured_at is None:
        measured_at = _dt.date.today().isoformat()
    else:
        try:
            _dt.date.fromisoformat(str(measured_at)[:10])
        except ValueError:
            raise ValueError(f"measured_at must be an ISO date like '2025-01-31', "
                             f"got {measured_at!r}.") from None
    doc = {"name": name, "measured_at": str(measured_at), "machine": jsonable(dict(machine)),
           "results": jsonable(dict(data))}
    path = reference_path(name, directory)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=2, sort_keys=False, allow_nan=False) + "\n",
                   encoding="utf-8")
    os.replace(tmp, path)
    return path


def load_reference(name: str, directory: str | os.PathLike | None = None) -> dict | None:
    """The reference document ``name``, or None when none was measured yet; a
    :class:`MalformedReference` naming the file when it is not of the documented shape."""
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


def available_references(directory: str | os.PathLike | None = None) -> list[str]:
    """Names of the reference files present (sorted; empty when none were measured yet)."""
    folder = _dir(directory)
    if not folder.is_dir():
        return []
    return sorted(p.stem for p in folder.glob("*.json"))


def missing_reference_text(name: str) -> str:
    """What a lesson prints when reference ``name`` has not been measured yet."""
    return (f"No reference GPU results have been measured yet ({name}.json is not in "
            f"course_utils/reference_results/). They are produced on a CUDA machine by\n"
            f"    python -m course_authoring gpu-check\n"
            f"and never typed by hand. Meanwhile, the figures below are what THIS machine measured.")
