"""Workers reuse a batch's shared memory only once the main process has let go of it."""
from __future__ import annotations

import os
import pickle

import pytest
import torch
from torch.utils.data import DataLoader

from course_utils.data import JpegDataset, ToTensorUint8
from course_utils.pipelines import BatchedJpegDataset, keep_batch
from course_utils.threads import make_worker_init
from course_utils.tools import batch_buffers
from course_utils.tools.bench.run import ReusedJpegBatches

SIZE, BATCH = 32, 4


@pytest.fixture(scope="module")
def base():
    return JpegDataset(48, progress=False)


def _loader(base, **kw):
    return DataLoader(ReusedJpegBatches(base, SIZE), batch_size=BATCH, shuffle=False,
                      collate_fn=keep_batch, num_workers=2, worker_init_fn=make_worker_init(1), **kw)


def _expected(base, index):
    return ToTensorUint8(SIZE)(base[index][0])


def test_kept_batches_are_never_overwritten(base):
    kept = list(_loader(base))                      # the loop holds every batch: no slot is free
    assert len(kept) == len(base) // BATCH
    for b, (images, labels) in enumerate(kept):
        assert type(images) is torch.Tensor and type(labels) is torch.Tensor
        assert labels.tolist() == [int(base.labels[b * BATCH + i]) for i in range(BATCH)]
        for i in (0, BATCH - 1):
            assert torch.equal(images[i], _expected(base, b * BATCH + i)), (b, i)


def test_a_batch_kept_among_dropped_ones_survives(base):
    kept = {}
    for b, (images, _) in enumerate(_loader(base, persistent_workers=True)):
        if b % 4 == 1:
            kept[b] = images[1:2]                   # a view keeps the whole segment
    for b, view in kept.items():
        assert torch.equal(view[0], _expected(base, b * BATCH + 1)), b


@pytest.mark.skipif(torch.multiprocessing.get_sharing_strategy() != "file_descriptor",
                    reason="segments are told apart by their file's inode")
def test_dropped_batches_reuse_their_segments(base):
    segments = set()
    loader = _loader(base)
    for images, _ in loader:
        fd, _ = images.untyped_storage()._share_fd_cpu_()
        segments.add(os.fstat(fd).st_ino)
        del images
    # 2 workers x SLOTS segments at most, for 12 batches
    assert len(segments) <= 2 * batch_buffers.SLOTS < len(loader)


def test_outside_a_worker_the_batch_is_plain(base):
    flat, slot = batch_buffers.shared_uint8(12)
    assert slot is None and flat.shape == (12,) and not flat.is_shared()
    batch = ReusedJpegBatches(base, SIZE).__getitems__([0, 1])
    assert type(batch) is tuple
    assert type(pickle.loads(pickle.dumps(batch))) is tuple


def test_the_lessons_loader_sends_fresh_memory_and_the_same_values(base):
    """The core's loader keeps no segments; the reused one gives equal batches."""
    plain = DataLoader(BatchedJpegDataset(base, SIZE), batch_size=BATCH, shuffle=False,
                       collate_fn=keep_batch, num_workers=1)
    for (a, la), (b, lb) in zip(plain, _loader(base)):
        assert torch.equal(a, b) and torch.equal(la, lb)
        assert a.is_shared() and a.stride() == b.stride()
