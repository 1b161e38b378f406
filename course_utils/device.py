"""The device: resolve it, wait for it (lesson 00 shows why a GPU timing needs the wait), pin
memory for it, copy batches and small constants to it."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable, Iterator

import torch

from .machine import default_device

__all__ = ["resolve_device", "synchronize", "synchronizer", "try_pin", "move_to_device",
           "tensors_of", "constants_on"]


def resolve_device(device: Any = None, *, allow_meta: bool = False) -> torch.device:
    """``torch.device`` for ``device`` (None: the machine's accelerator, else the CPU); a
    ValueError when it is not here. ``allow_meta`` accepts 'meta' (the grader on CPU machines)."""
    if device is None:
        return default_device()
    try:
        dev = torch.device(device)
    except (TypeError, RuntimeError) as exc:
        raise ValueError(f"device={device!r} is not a device torch understands: use None (the "
                         f"machine's accelerator), 'cpu', 'cuda', 'cuda:0' or 'mps'.") from exc
    allowed = ("cpu", "cuda", "mps") + (("meta",) if allow_meta else ())
    if dev.type not in allowed:
        raise ValueError(f"device={device!r}: this course measures {', '.join(allowed)} only.")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} asks for CUDA but torch.cuda.is_available() is False "
                         f"here: use device=None (picks what this machine has) or 'cpu'.")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device={device!r} asks for Apple MPS, which is not available here: "
                         f"use device=None or 'cpu'.")
    return dev


def synchronize(device: Any) -> None:
    """Wait until every queued operation on ``device`` is done (nothing to wait for on CPU)."""
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    elif dev.type == "mps":
        torch.mps.synchronize()


def synchronizer(device: Any) -> Callable[[], None]:
    """A function that waits for the work queued on ``device`` (checked as :func:`resolve_device`,
    'meta' allowed), or does nothing; ``None``: CUDA only when already initialised."""
    if device is None:
        cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        return torch.cuda.synchronize if cuda else (lambda: None)
    dev = resolve_device(device, allow_meta=True)
    return (lambda: synchronize(dev)) if dev.type in ("cuda", "mps") else (lambda: None)


def try_pin(tensor: torch.Tensor, device: Any) -> tuple[torch.Tensor | None, str]:
    """(pinned copy of ``tensor``, "") where ``device`` can use pinned memory, else (None, why)."""
    dev = torch.device(device)
    if dev.type not in ("cuda", "mps"):
        try:
            torch.empty(1).pin_memory()
        except RuntimeError as exc:
            return None, f"pin_memory() on this machine raises: {exc}"
        return None, "the device is the CPU: a pinned source would be a host-to-host copy"
    try:
        return tensor.pin_memory(), ""
    except RuntimeError as exc:  # e.g. an MPS build without pinned memory
        return None, f"pin_memory() raised: {exc}"


def move_to_device(batch: Any, device: Any, *, non_blocking: bool | None = None) -> Any:
    """Every tensor in ``batch`` (nested tuples, lists, dicts, namedtuples) on ``device``, dtypes
    kept; ``non_blocking=None`` copies asynchronously where that can overlap: from pinned memory."""
    if isinstance(batch, torch.Tensor):
        asynchronous = batch.is_pinned() if non_blocking is None else non_blocking
        return batch.to(device, non_blocking=asynchronous)
    if isinstance(batch, Mapping):
        return {k: move_to_device(v, device, non_blocking=non_blocking) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        moved = [move_to_device(v, device, non_blocking=non_blocking) for v in batch]
        return type(batch)(*moved) if hasattr(batch, "_fields") else type(batch)(moved)  # namedtuple
    return batch


def tensors_of(batch: Any) -> Iterator[torch.Tensor]:
    """Every tensor in ``batch`` (nested tuples, lists, dicts), in order."""
    if isinstance(batch, torch.Tensor):
        yield batch
    elif isinstance(batch, (Mapping, list, tuple)):
        for v in batch.values() if isinstance(batch, Mapping) else batch:
            yield from tensors_of(v)


# Small constants, on each device once: ``torch.tensor(..., device='cuda')`` inside a step is a
# blocking copy from pageable memory, a hidden synchronisation with the GPU's queue.
_CONSTANTS: dict[tuple, tuple[torch.Tensor, ...]] = {}
_MAX_CONSTANTS = 16


def constants_on(device: Any, key: tuple,
                 make: Callable[[], tuple[torch.Tensor, ...]]) -> tuple[torch.Tensor, ...]:
    """The tensors ``make()`` builds (on the CPU), moved to ``device`` the first time ``key`` is
    asked for there, and the same tensors every later time (a few entries are kept)."""
    full_key = (str(torch.device(device)), *key)
    hit = _CONSTANTS.get(full_key)
    if hit is None:
        if len(_CONSTANTS) > _MAX_CONSTANTS:
            _CONSTANTS.clear()
        hit = tuple(t.to(device) for t in make())
        _CONSTANTS[full_key] = hit
    return hit
