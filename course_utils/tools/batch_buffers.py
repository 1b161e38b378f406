"""Shared-memory batches that DataLoader workers reuse once the main process has let go of them.

The DataLoader copies a batch in plain memory into a fresh shared segment, a page fault a page;
``bench``'s loaders instead keep :data:`SLOTS` segments a worker and write each batch into a free
one (:class:`ReusedSegments`). Free is checked, never assumed: the main process watches each
batch's storage through a weak reference (:func:`_received`) and frees its slot once no tensor,
view or array of it is left; with none free the worker allocates a fresh segment. It uses a private
torch call (``UntypedStorage._new_shared``, as ``default_collate`` does): a tool, not the lessons'."""
from __future__ import annotations

import os
import threading
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils.data import get_worker_info

__all__ = ["SLOTS", "ReusedSegments", "shared_uint8", "slot_batch"]

#: Segments per worker: ``prefetch_factor`` (2) batches in flight, the one in use, one spare.
SLOTS = 4


class _Ring:
    """One worker's segments and their free flags (1: free; a shared tensor the main process
    writes, sent with the ring's first batch only)."""

    def __init__(self) -> None:
        self.pid, self.flags_sent = os.getpid(), False
        self.storages: list[torch.UntypedStorage | None] = [None] * SLOTS
        self.free = torch.ones(SLOTS, dtype=torch.uint8).share_memory_()
        # not the pid: a new worker may get a dead one's, and its stale slots would free ours
        self.key = os.urandom(8).hex()


_ring: _Ring | None = None


def shared_uint8(nbytes: int) -> tuple[torch.Tensor, int | None]:
    """A flat uint8 tensor of ``nbytes`` and its slot: in a worker a free reused segment (slot
    0..SLOTS-1) or a fresh one (None); elsewhere plain memory (None). Return the batch through
    :func:`slot_batch` so that the slot comes back."""
    global _ring
    if get_worker_info() is None:
        return torch.empty(nbytes, dtype=torch.uint8), None
    if _ring is None or _ring.pid != os.getpid():
        _ring = _Ring()
    free = _ring.free.numpy()
    for slot in range(SLOTS):
        if free[slot]:
            storage = _ring.storages[slot]
            if storage is None or storage.nbytes() < nbytes:
                storage = _ring.storages[slot] = torch.UntypedStorage._new_shared(nbytes)
            free[slot] = 0
            return torch.empty(0, dtype=torch.uint8).set_(storage, 0, (nbytes,)), slot
    return torch.empty(0, dtype=torch.uint8).set_(torch.UntypedStorage._new_shared(nbytes)), None


def slot_batch(items: tuple, slot: int | None) -> tuple:
    """The tuple ``(images, *rest)`` for ``__getitems__`` to return, ``images`` on ``slot``'s
    segment: it arrives in the main process as a plain tuple, its slot freed once it is gone."""
    return tuple(items) if slot is None else _SlotBatch(items, slot)


class ReusedSegments:
    """Put before a :class:`~course_utils.pipelines.BatchedDecode` subclass in the bases
    (``class D(ReusedSegments, BatchedJpegDataset)``): the same batches, on reused segments."""

    size: int

    def new_batch(self, n: int) -> tuple[torch.Tensor, Any, Any]:
        """An empty (n, size, size, 3) uint8 batch on a reused segment, its NumPy view, its slot."""
        flat, slot = shared_uint8(n * self.size * self.size * 3)
        images = flat.view(n, self.size, self.size, 3)
        return images, images.numpy(), slot

    finish_batch = staticmethod(slot_batch)     # the batch tuple to return, so that its slot comes back


class _SlotBatch(tuple):
    """A batch tuple that pickles as :func:`_received` of its images, its ``rest`` by value (one
    segment fewer per batch) and its ring's key and slot."""

    def __new__(cls, items: tuple, slot: int) -> "_SlotBatch":
        batch = super().__new__(cls, items)
        batch.slot = slot
        return batch

    def __reduce__(self) -> tuple:
        assert _ring is not None       # a slot comes only from this worker's ring
        tensors = tuple(i for i, x in enumerate(self[1:]) if isinstance(x, torch.Tensor))
        rest = tuple(x.numpy() if i in tensors else x for i, x in enumerate(self[1:]))
        flags = None if _ring.flags_sent else _ring.free
        _ring.flags_sent = True
        return _received, (self[0], rest, tensors, _ring.key, flags, self.slot)


_flags: dict[str, torch.Tensor] = {}     # main process: each worker ring's free flags, by key
_MAX_RINGS = 64                          # rings remembered (workers end without saying so)
_watched: list[tuple[StorageWeakRef, str, int]] = []
_watched_lock = threading.Lock()   # batches are unpickled by the main or the pin-memory thread


def _received(images: torch.Tensor, rest: tuple, tensors: tuple[int, ...], key: str,
              flags: torch.Tensor | None, slot: int) -> tuple:
    """Main process: free the slots whose batches are gone, watch this one; the plain tuple."""
    rest = tuple(torch.from_numpy(x) if i in tensors else x for i, x in enumerate(rest))
    with _watched_lock:
        if flags is not None:
            _flags[key] = flags
            while len(_flags) > _MAX_RINGS:   # oldest first: a forgotten ring only stops reusing
                del _flags[next(iter(_flags))]
        kept = [(StorageWeakRef(images.untyped_storage()), key, slot)]
        for ref, ring, k in _watched:
            if ring in _flags and ref.expired():
                _flags[ring][k] = 1
            elif ring in _flags:
                kept.append((ref, ring, k))
        _watched[:] = kept
    return (images, *rest)
