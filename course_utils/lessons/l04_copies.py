"""Lesson 04's copy modes and bandwidth sweep result, which the notebook's ``%%writefile``
modules, ``gpu-check`` and :mod:`.l04_reference` share (the lesson writes the timing loop, the
sweep and the naive-vs-honest copy in its cells): :data:`H2D_MODES`, the three host-to-device
copies, and :class:`BandwidthSweep`. Bandwidth is GB/s, decimal (1 GB = 1e9 bytes).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import NamedTuple

__all__ = ["CopyMode", "H2D_MODES", "MODES", "BandwidthSweep", "fmt_bytes"]

KIB, MIB, GIB = 1024, 1024**2, 1024**3


class CopyMode(NamedTuple):
    """``dst.copy_(src, non_blocking=non_blocking)`` with ``src`` in pinned or pageable memory."""

    pinned: bool
    non_blocking: bool

    @property
    def label(self) -> str:
        """``"pinned, non_blocking"``, ``"pageable, blocking"``, ..."""
        return (f"{'pinned' if self.pinned else 'pageable'}, "
                f"{'non_blocking' if self.non_blocking else 'blocking'}")


#: The three host-to-device copies: pageable blocking (``tensor.to(device)``), pinned blocking
#: (pinning alone) and pinned ``non_blocking=True`` (what non_blocking adds on top).
H2D_MODES: Mapping[str, CopyMode] = {
    "pageable": CopyMode(pinned=False, non_blocking=False),
    "pinned_blocking": CopyMode(pinned=True, non_blocking=False),
    "pinned_non_blocking": CopyMode(pinned=True, non_blocking=True),
}
#: The sweep's sources: the three host-to-device copies and device-to-device (for scale).
MODES = (*H2D_MODES, "device")


def fmt_bytes(n: float) -> str:
    """A size in bytes as text in binary units: ``"16 MiB"``, ``"1.5 KiB"``, ``"512 B"``."""
    for unit, size in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if n >= size:
            value = n / size
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{int(n)} B"


@dataclass
class BandwidthSweep:
    """Copy bandwidth per source (:data:`MODES`) and size, measured side by side: ``gbps[mode][i]``
    GB/s at ``sizes_bytes[i]`` (None where not measured, ``notes[mode]`` says why);
    ``gbps_range[mode][i]``: [low, high] GB/s at the 75th and 25th percentile of the times."""

    device: str
    sizes_bytes: list[int]
    gbps: dict[str, list[float | None]]
    labels: dict[str, str] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)
    settings: dict = field(default_factory=dict)
    gbps_range: dict[str, list] = field(default_factory=dict)

    def _values(self, mode: str) -> list:
        if mode not in MODES:
            raise ValueError(f"mode={mode!r} is not one of {', '.join(MODES)}.")
        return self.gbps.get(mode, [])

    def measured(self, mode: str) -> bool:
        """Whether ``mode`` was measured at any size."""
        return any(v is not None for v in self._values(mode))

    def best(self, mode: str) -> tuple[int, float] | None:
        """(size in bytes, GB/s) of the fastest copy of ``mode``, or None if not measured."""
        pairs = [(s, v) for s, v in zip(self.sizes_bytes, self._values(mode)) if v is not None]
        return max(pairs, key=lambda p: p[1]) if pairs else None

    def best_h2d(self) -> tuple[str, int, float] | None:
        """(mode, size, GB/s) of the fastest host-to-device copy measured."""
        found = [(m, *b) for m in H2D_MODES if (b := self.best(m)) is not None]
        return max(found, key=lambda t: t[2]) if found else None

    def best_pinned(self) -> tuple[str, int, float] | None:
        """(mode, size, GB/s) of the fastest copy from pinned memory, blocking or not."""
        found = [(m, *b) for m, how in H2D_MODES.items() if how.pinned and (b := self.best(m))]
        return max(found, key=lambda t: t[2]) if found else None

    def pinned_fraction_of_best(self) -> float | None:
        """Best pinned GB/s / best host-to-device GB/s (gpu-check's >= 0.9 target); None when
        pinned copies were not measured (no accelerator)."""
        pinned, best = self.best_pinned(), self.best_h2d()
        if pinned is None or best is None or best[2] <= 0:
            return None
        return pinned[2] / best[2]

    def ratios(self, mode: str, baseline: str) -> list[tuple[int, float]]:
        """[(size in bytes, GB/s of ``mode`` / GB/s of ``baseline``)] at every size where both
        were measured, smallest first (empty when one of them was not measured)."""
        return [(s, v / b) for s, v, b in zip(self.sizes_bytes, self._values(mode),
                                              self._values(baseline))
                if v is not None and b is not None and b > 0]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping) -> "BandwidthSweep":
        """A sweep saved with :meth:`to_dict` (e.g. reference results); unknown keys ignored."""
        if not isinstance(data, Mapping):
            raise TypeError(f"data must be a dict made by BandwidthSweep.to_dict(), got "
                            f"{type(data).__name__}.")
        missing = [k for k in ("device", "sizes_bytes", "gbps") if k not in data]
        if missing:
            raise ValueError(f"data lacks {missing}: pass a dict made by BandwidthSweep.to_dict().")
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})
