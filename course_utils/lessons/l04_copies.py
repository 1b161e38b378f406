"""Lesson 04: what stays in the package of its copy harness, and why.

Lesson 04 writes its own timing loop, bandwidth sweep and naive-vs-honest copy in its cells
(``%%writefile lesson04_copies.py``, ``lesson04_sweep.py``, ``lesson04_naive.py``). What is
left here is imported by others and so must keep its path:

* :class:`BandwidthSweep` and :func:`_fmt_bytes`: the sweep's result, which the notebook's
  sweep returns, ``gpu-check`` saves as reference results and :mod:`.l04_reference` reads back.

The timing loop's package version, which the graders of exercises 00 and 04 time with, is
:func:`course_utils.bench.time_op`. Bandwidth is GB/s, decimal (1 GB = 1e9 bytes). Nothing
happens at import time.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

__all__ = ["MODES", "BandwidthSweep"]

KIB, MIB, GIB = 1024, 1024**2, 1024**3
#: The three copy sources of the bandwidth sweep.
MODES = ("pageable", "pinned", "device")


def _fmt_bytes(n: float) -> str:
    for unit, size in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if n >= size:
            value = n / size
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{int(n)} B"


@dataclass
class BandwidthSweep:
    """Copy bandwidth per source (:data:`MODES`) and size, measured side by side in one run.

    ``gbps[mode][i]``: GB/s at ``sizes_bytes[i]`` (None where not measured; ``notes[mode]``
    says why); ``gbps_range[mode][i]``: [low, high] GB/s at the 75th and 25th percentile of
    the times.
    """

    device: str
    sizes_bytes: list[int]
    gbps: dict[str, list[float | None]]
    labels: dict[str, str] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)
    settings: dict = field(default_factory=dict)
    gbps_range: dict[str, list] = field(default_factory=dict)

    def best(self, mode: str) -> tuple[int, float] | None:
        """(size in bytes, GB/s) of the fastest copy of ``mode``, or None if not measured."""
        if mode not in MODES:
            raise ValueError(f"mode={mode!r} is not one of {', '.join(MODES)}.")
        pairs = [(s, v) for s, v in zip(self.sizes_bytes, self.gbps.get(mode, [])) if v is not None]
        return max(pairs, key=lambda p: p[1]) if pairs else None

    def best_h2d(self) -> tuple[str, int, float] | None:
        """(mode, size, GB/s) of the fastest host-to-device copy measured (pageable or pinned)."""
        found = [(m, *b) for m in ("pageable", "pinned") if (b := self.best(m)) is not None]
        return max(found, key=lambda t: t[2]) if found else None

    def pinned_fraction_of_best(self) -> float | None:
        """Best pinned GB/s / best host-to-device GB/s (the issue's >= 0.9 target); None when
        pinned copies could not be measured (no accelerator)."""
        pinned, best = self.best("pinned"), self.best_h2d()
        if pinned is None or best is None or best[2] <= 0:
            return None
        return pinned[1] / best[2]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping) -> "BandwidthSweep":
        """Rebuild a sweep saved with :meth:`to_dict` (e.g. from reference results); keys it
        does not know are ignored."""
        if not isinstance(data, Mapping):
            raise TypeError(f"data must be a dict made by BandwidthSweep.to_dict(), got "
                            f"{type(data).__name__}.")
        missing = [k for k in ("device", "sizes_bytes", "gbps") if k not in data]
        if missing:
            raise ValueError(f"data lacks {missing}: pass a dict made by BandwidthSweep.to_dict().")
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})
