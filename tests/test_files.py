"""Image folders on disk, JPEG headers, the page cache and the packed store (structure, not speed)."""
from __future__ import annotations

import json
import os
import pickle

import cv2
import numpy as np
import pytest

from course_utils.data import JpegDataset, sample_photo
from course_utils.tools.bench import storage
from course_utils.tools.bench.storage import (PackedStore, evict_from_page_cache, image_files,
                                              jpeg_size, reduced_decode_flag, write_image_folder)


@pytest.fixture(scope="module")
def base():
    return JpegDataset(12, progress=False)


def test_folder_has_imagefolder_layout_and_the_same_bytes(base, tmp_path):
    root = write_image_folder(base, tmp_path / "jpegs")
    paths = image_files(root)
    assert len(paths) == 12
    assert sorted({p.parent.name for p in paths}) == sorted(f"c{k}" for k in set(base.labels.tolist()))
    for p in paths:
        i = int(p.stem)
        assert p.read_bytes() == base.encoded(i).tobytes()
        assert p.parent.name == f"c{base.labels[i]}"
    assert json.loads((root / storage.MARKER).read_text())["n"] == 12
    assert write_image_folder(base, root) == root          # reused, not rewritten
    assert not [p for p in root.parent.iterdir() if ".writing-" in p.name]


def test_folder_refuses_another_dataset_or_a_full_folder(base, tmp_path):
    root = write_image_folder(base, tmp_path / "a")
    with pytest.raises(FileExistsError, match="another dataset"):
        write_image_folder(JpegDataset(3, progress=False), root)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not empty"):
        write_image_folder(base, tmp_path / "full")
    with pytest.raises(TypeError, match="JpegDataset"):
        write_image_folder([b"\xff\xd8"], tmp_path / "b")


def test_jpeg_size_reads_the_header(base):
    for i in range(len(base)):
        assert jpeg_size(base.encoded(i)) == tuple(int(v) for v in base.shapes[i])
        assert jpeg_size(base.encoded(i).tobytes()) == tuple(int(v) for v in base.shapes[i])
    assert jpeg_size(b"not a jpeg") is None
    assert jpeg_size(b"\xff\xd8\xff") is None


def test_reduced_decode_keeps_the_target_size():
    big = cv2.resize(sample_photo(), (1000, 800))
    ok, enc = cv2.imencode(".jpg", big)
    assert reduced_decode_flag(enc, 224) == cv2.IMREAD_REDUCED_COLOR_2     # 800 / 2 >= 224 > 800 / 4
    assert reduced_decode_flag(enc, 101) == cv2.IMREAD_REDUCED_COLOR_4     # 800 / 8 < 101
    assert reduced_decode_flag(enc, 100) == cv2.IMREAD_REDUCED_COLOR_8
    assert reduced_decode_flag(enc, 900) == cv2.IMREAD_COLOR
    assert reduced_decode_flag(b"junk", 10) == cv2.IMREAD_COLOR
    assert min(cv2.imdecode(enc, reduced_decode_flag(enc, 224)).shape[:2]) >= 224


def test_eviction_and_reads(base, tmp_path, monkeypatch):
    paths = image_files(write_image_folder(base, tmp_path / "c"))
    assert sum(p.stat().st_size for p in paths) == base.nbytes
    assert evict_from_page_cache(paths) is hasattr(os, "posix_fadvise")
    monkeypatch.delattr(os, "posix_fadvise", raising=False)
    assert evict_from_page_cache(paths) is False


def test_packed_store_round_trip(base, tmp_path):
    store = PackedStore.write(base, tmp_path / "p.npy", size=32)
    assert store.nbytes >= 12 * 32 * 32 * 3
    mapped, in_ram = store.dataset(), store.dataset(in_memory=True)
    images, labels = mapped.__getitems__([5, 0, 3])
    assert images.shape == (3, 3, 32, 32) and images.dtype.is_floating_point is False
    assert labels.tolist() == [int(base.labels[i]) for i in (5, 0, 3)]
    assert np.array_equal(images.numpy(), in_ram.__getitems__([5, 0, 3])[0].numpy())
    rgb = cv2.cvtColor(cv2.resize(cv2.imdecode(base.encoded(5), reduced_decode_flag(base.encoded(5), 32)), (32, 32),
                                  interpolation=cv2.INTER_AREA), cv2.COLOR_BGR2RGB)
    assert np.array_equal(images[0].permute(1, 2, 0).numpy(), rgb)
    shipped = pickle.loads(pickle.dumps(mapped))       # what a spawn worker receives
    assert shipped._images is None and len(shipped) == 12
    assert np.array_equal(shipped[5][0].numpy(), images[0].numpy())
    with pytest.raises(FileNotFoundError, match="PackedStore.write"):
        PackedStore(tmp_path / "missing.npy")
