"""A loader's health (lesson 09): what it keeps in flight against the limits it breaks on; the probe
measures (:func:`tensors_in`, :func:`open_fds`, :func:`shm_free`, :func:`limits`)."""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import psutil
import torch

from .rules import FIXES, GROWTH_SHARE, health


def tensors_in(batch: Any) -> tuple[int, int]:
    """(tensors, bytes) in a batch of tensors nested in tuples, lists and dicts."""
    if torch.is_tensor(batch):
        return 1, batch.nbytes
    items = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else ()
    return tuple(map(sum, zip((0, 0), *map(tensors_in, items))))


def open_fds() -> int | None:
    """Descriptors this process has open (Linux's /proc; None elsewhere)."""
    with contextlib.suppress(OSError):
        return len(os.listdir("/proc/self/fd"))
    return None


def shm_free(path: str = "/dev/shm") -> int | None:
    """Bytes free in the shared-memory filesystem (None: there is none, as on macOS)."""
    with contextlib.suppress(OSError):
        return os.statvfs(path).f_bavail * os.statvfs(path).f_frsize
    return None


def limits(cgroup: str = "/sys/fs/cgroup") -> dict:
    """The soft RLIMIT_NOFILE (None: unlimited), the sharing strategy, the memory limit in bytes and
    whose it is (cgroup v2 ``memory.max``, v1 ``memory.limit_in_bytes``, else the machine's RAM)."""
    import resource     # POSIX only: Windows has no resource module (nor the limit)
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    memory, source = psutil.virtual_memory().total, "the machine's RAM"
    for file in (Path(cgroup) / "memory.max", Path(cgroup) / "memory" / "memory.limit_in_bytes"):
        text = file.read_text().strip() if file.is_file() else ""
        if text.isdigit() and int(text) < memory:
            memory, source = int(text), "the cgroup's memory limit"
    return {"nofile": None if soft == resource.RLIM_INFINITY else soft, "memory": memory,
            "memory_of": source, "sharing": torch.multiprocessing.get_sharing_strategy()}


def _mib(n: float | None) -> str:
    return "?" if n is None else f"{n / 2**20:,.1f} MiB"


def loader_health(raw: dict) -> list[dict]:
    """Rows (``what``, ``used``, ``limit``, ``verdict``, ``said``, ``fix``) of a probe record: shared
    memory in flight, descriptors (one a tensor in flight under file_descriptor sharing), RSS growth."""
    s, lim, fds, rss = raw["settings"], raw["limits"], raw["fds"], raw["worker_rss"]
    batches = (s["num_workers"] or 0) * (s["prefetch_factor"] or 0)
    shm = None if raw["batch_bytes"] is None else batches * raw["batch_bytes"]
    by_fd = lim["sharing"] == "file_descriptor" and raw["batch_tensors"] is not None
    fd_used = (fds["at_start"] or 0) + batches * raw["batch_tensors"] if by_fd else fds["peak"]
    grew = sum(last - first for first, last in rss) if rss else None
    nofile = "none" if lim["nofile"] is None else lim["nofile"]
    return [{"what": "shared memory in flight", "used": shm, "limit": raw["shm_free"], "fix": FIXES["shm"],
             "verdict": health(shm, raw["shm_free"]), "said": f"{batches} batches (workers x "
             f"prefetch_factor) of {_mib(raw['batch_bytes'])} = {_mib(shm)}; /dev/shm has "
             f"{_mib(raw['shm_free'])} free"},
            {"what": "descriptors", "used": fd_used, "limit": lim["nofile"], "fix": FIXES["fds"],
             "verdict": health(fd_used, float("inf") if nofile == "none" else nofile),
             "said": (f"{fds['at_start']} open + {batches} batches x {raw['batch_tensors']} tensors "
                      f"(file_descriptor sharing) = {fd_used}" if by_fd else
                      f"{fd_used} open at most ({lim['sharing']} sharing)") + f"; soft limit {nofile}"},
            {"what": "workers' memory growth", "used": grew, "limit": lim["memory"], "fix": FIXES["memory"],
             "verdict": health(grew, lim["memory"], GROWTH_SHARE), "said": f"{_mib(grew)} over "
             f"{len(rss)} worker(s); {lim['memory_of']} {_mib(lim['memory'])}"}]
