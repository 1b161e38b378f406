"""Tests for course_utils.data: behaviour and structure only, never speed claims."""
from __future__ import annotations

import pickle
import time
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from course_utils import data
from course_utils.data import (
    ArrayDataset,
    CommonRecipeTransform,
    JpegDataset,
    LatencyDataset,
    RamBudgetError,
    ToTensorUint8,
    decode_jpeg,
    ram_budget_bytes,
    sample_photo,
)
from course_utils.image_folder import ImageFolderDataset


@pytest.fixture(scope="module")
def jpegs() -> JpegDataset:
    return JpegDataset(40, seed=3)


# ------------------------------------------------------------------ photo and decoding

def test_sample_photo_is_a_real_bgr_photo_and_a_fresh_copy():
    img = sample_photo()
    assert img.dtype == np.uint8 and img.ndim == 3 and img.shape[2] == 3
    assert min(img.shape[:2]) >= 256
    assert img.std() > 20  # a photograph, not a flat image
    img[:] = 0
    assert sample_photo().any()  # the cached copy was not modified


def test_decode_jpeg_returns_rgb():
    bgr = np.zeros((32, 48, 3), np.uint8)
    bgr[..., 2] = 255  # pure red in OpenCV's BGR order
    ok, enc = cv2.imencode(".jpg", bgr, [cv2.IMWRITE_JPEG_QUALITY, 95])
    assert ok
    for buf in (enc, enc.tobytes(), memoryview(enc.tobytes())):
        rgb = decode_jpeg(buf)
        assert rgb.shape == (32, 48, 3) and rgb.dtype == np.uint8
        assert rgb[..., 0].mean() > 240 and rgb[..., 2].mean() < 15  # red is channel 0 in RGB


def test_decode_jpeg_bad_input():
    with pytest.raises(ValueError, match="could not decode"):
        decode_jpeg(b"not a jpeg at all")
    with pytest.raises(ValueError, match="empty"):
        decode_jpeg(b"")
    with pytest.raises(TypeError, match="buf"):
        decode_jpeg("a string")
    with pytest.raises(TypeError, match="uint8"):
        decode_jpeg(np.zeros(10, np.float32))


# ------------------------------------------------------------------ JpegDataset

def test_jpeg_dataset_storage_is_one_buffer_plus_offsets(jpegs):
    assert len(jpegs) == 40
    assert isinstance(jpegs.buffer, np.ndarray) and jpegs.buffer.dtype == np.uint8
    assert jpegs.buffer.ndim == 1 and jpegs.buffer.flags.c_contiguous
    assert jpegs.offsets.dtype == np.int64 and jpegs.offsets.shape == (41,)
    assert jpegs.offsets[0] == 0 and jpegs.offsets[-1] == jpegs.buffer.size == jpegs.nbytes
    assert np.all(np.diff(jpegs.offsets) > 0)
    # no per-sample Python objects kept on the instance
    assert not any(isinstance(v, list) for v in vars(jpegs).values())
    enc = jpegs.encoded(0)
    assert enc[0] == 0xFF and enc[1] == 0xD8  # JPEG start-of-image marker
    assert not enc.flags.writeable


def test_jpeg_dataset_items_are_varied_rgb_images_with_labels(jpegs):
    shapes = set()
    for i in range(len(jpegs)):
        img, label = jpegs[i]
        assert isinstance(img, np.ndarray) and img.dtype == np.uint8
        assert img.ndim == 3 and img.shape[2] == 3
        assert 160 <= max(img.shape[:2]) <= 512
        assert tuple(jpegs.shapes[i]) == img.shape[:2]
        assert isinstance(label, int) and label == i % 10
        shapes.add(img.shape)
    assert len(shapes) > 10  # varied sizes, not one shape
    assert jpegs[-1][1] == (len(jpegs) - 1) % 10
    with pytest.raises(IndexError):
        jpegs[len(jpegs)]
    with pytest.raises(TypeError, match="index"):
        jpegs["0"]


def test_jpeg_dataset_is_deterministic(jpegs):
    again = JpegDataset(40, seed=3)
    assert np.array_equal(again.buffer, jpegs.buffer)
    assert np.array_equal(again.offsets, jpegs.offsets)
    prefix = JpegDataset(10, seed=3)  # image k does not depend on n
    assert np.array_equal(prefix.buffer, jpegs.buffer[: jpegs.offsets[10]])
    other = JpegDataset(10, seed=4)
    assert not np.array_equal(other.buffer[: other.offsets[1]], jpegs.buffer[: jpegs.offsets[1]])


def test_jpeg_dataset_size_range_quality_and_describe():
    small = JpegDataset(12, min_side=64, max_side=64, quality=50, seed=1)
    assert all(max(small[i][0].shape[:2]) == 64 for i in range(12))
    text = small.describe()
    assert "12" in text and "MB" in text and "64-64" in text
    assert "JpegDataset(n=12" in repr(small)
    assert small.decoded_nbytes > small.nbytes  # decoded pixels outweigh the JPEG bytes


def test_jpeg_dataset_default_n_follows_quick_mode(monkeypatch):
    monkeypatch.setenv("COURSE_QUICK", "1")
    assert len(JpegDataset(min_side=32, max_side=48)) == 200


@pytest.mark.parametrize("kwargs, exc, name", [
    (dict(n=0), ValueError, "n"),
    (dict(n=2.5), TypeError, "n"),
    (dict(n=True), TypeError, "n"),
    (dict(n=4, min_side=300, max_side=200), ValueError, "max_side=200 is too small: max_side must be >= 300"),
    (dict(n=4, min_side=4), ValueError, "min_side"),
    (dict(n=4, quality=0), ValueError, "quality"),
    (dict(n=4, quality=101), ValueError, "quality"),
    (dict(n=4, seed=-1), ValueError, "seed"),
    (dict(n=4, transform="resize"), TypeError, "transform"),
])
def test_jpeg_dataset_rejects_bad_arguments(kwargs, exc, name):
    with pytest.raises(exc, match=name):
        JpegDataset(**kwargs)


def test_jpeg_dataset_applies_transform():
    ds = JpegDataset(4, min_side=64, max_side=128, transform=ToTensorUint8(size=32))
    x, label = ds[1]
    assert isinstance(x, torch.Tensor) and x.shape == (3, 32, 32) and x.dtype == torch.uint8
    assert label == 1


# ------------------------------------------------------------------ transforms

def test_common_recipe_transform():
    img = sample_photo()[..., ::-1].copy()
    t = CommonRecipeTransform(size=96)
    x = t(img)
    assert isinstance(x, torch.Tensor) and x.dtype == torch.float32
    assert x.shape == (3, 96, 96) and x.is_contiguous()
    assert 0.0 <= float(x.min()) and float(x.max()) <= 1.0 and float(x.max()) > 0.5
    expected = cv2.resize(img, (96, 96), interpolation=cv2.INTER_LINEAR).astype(np.float32) / 255
    assert np.allclose(x.permute(1, 2, 0).numpy(), expected)
    assert repr(t) == "CommonRecipeTransform(size=96)"
    assert repr(CommonRecipeTransform()) == "CommonRecipeTransform(size=224)"


def test_to_tensor_uint8_matches_common_recipe_up_to_scaling():
    img = sample_photo()
    u = ToTensorUint8(size=64)(img)
    f = CommonRecipeTransform(size=64)(img)
    assert u.dtype == torch.uint8 and u.shape == (3, 64, 64) and u.is_contiguous()
    assert torch.allclose(u.float() / 255, f)
    assert repr(ToTensorUint8(64)) == "ToTensorUint8(size=64)"


@pytest.mark.parametrize("cls", [CommonRecipeTransform, ToTensorUint8])
def test_transforms_reject_bad_size_and_bad_images(cls):
    with pytest.raises(ValueError, match="size"):
        cls(size=0)
    with pytest.raises(TypeError, match="size"):
        cls(size=22.5)
    t = cls(size=8)
    with pytest.raises(TypeError, match="image"):
        t(torch.zeros(3, 8, 8))
    with pytest.raises(ValueError, match="image"):
        t(np.zeros((8, 8), np.uint8))
    with pytest.raises(ValueError, match="uint8"):
        t(np.zeros((8, 8, 3), np.float32))


# ------------------------------------------------------------------ RAM budget and ArrayDataset

def test_ram_budget_bytes():
    full = ram_budget_bytes(1.0)
    quarter = ram_budget_bytes()
    assert isinstance(quarter, int) and 0 < quarter <= full
    for bad in (0, -0.1, 1.5):
        with pytest.raises(ValueError, match="fraction"):
            ram_budget_bytes(bad)
    for bad in ("0.25", None, True):
        with pytest.raises(TypeError, match="fraction"):
            ram_budget_bytes(bad)


def test_array_dataset_items_and_determinism():
    ds = ArrayDataset(n=20, shape=(3, 8, 8), seed=1)
    x, label = ds[13]
    assert isinstance(x, torch.Tensor) and x.dtype == torch.uint8 and x.shape == (3, 8, 8)
    assert label == 3
    assert ds.data.shape == (20, 3, 8, 8) and ds.nbytes == 20 * 3 * 8 * 8
    assert ds.data.std() > 10  # filled, not zeros
    assert np.array_equal(ds.data, ArrayDataset(n=20, shape=(3, 8, 8), seed=1).data)
    assert not np.array_equal(ds.data, ArrayDataset(n=20, shape=(3, 8, 8), seed=2).data)
    f = ArrayDataset(n=5, shape=(4,), dtype=np.float32)
    assert f[0][0].dtype == torch.float32 and 0 <= float(f.data.min()) and float(f.data.max()) < 1
    assert "5 samples" in f.describe()
    t = ArrayDataset(n=3, shape=(3, 4, 4), transform=torch.Tensor.float)
    assert t[0][0].dtype == torch.float32


def test_array_dataset_default_n_is_quick_and_small(monkeypatch):
    monkeypatch.setenv("COURSE_QUICK", "1")
    ds = ArrayDataset(shape=(3, 16, 16))
    assert len(ds) == 512 and ds.shrunk_from is None


def test_array_dataset_refuses_an_explicit_n_over_budget():
    # the common recipe's 10000 x 3 x 224 x 224 float32 (6 GB) against a tiny budget
    with pytest.raises(RamBudgetError) as info:
        ArrayDataset(n=10000, shape=(3, 224, 224), dtype=np.float32, ram_fraction=1e-6)
    msg = str(info.value)
    assert "6,021,120,000 bytes" in msg and "budget" in msg
    assert "smaller n" in msg and "uint8" in msg and "ram_fraction" in msg
    assert isinstance(info.value, MemoryError) and isinstance(info.value, ValueError)


def test_array_dataset_shrinks_the_default_n_to_fit(monkeypatch):
    monkeypatch.setenv("COURSE_QUICK", "1")
    item = 3 * 32 * 32
    fraction = 7.5 * item / ram_budget_bytes(1.0)
    ds = ArrayDataset(shape=(3, 32, 32), ram_fraction=fraction)
    assert 1 <= len(ds) < 512 and ds.shrunk_from == 512
    assert "shrunk" in ds.describe() and "512" in ds.describe()
    with pytest.raises(RamBudgetError, match="one sample"):
        ArrayDataset(shape=(3, 32, 32), ram_fraction=item / 10 / ram_budget_bytes(1.0))


@pytest.mark.parametrize("kwargs, exc, name", [
    (dict(n=0), ValueError, "n"),
    (dict(n=4, shape=(3, 0)), ValueError, "shape"),
    (dict(n=4, shape="abc"), ValueError, "shape"),
    (dict(n=4, dtype=np.complex64), TypeError, "dtype"),
    (dict(n=4, dtype="nonsense"), TypeError, "dtype"),
    (dict(n=4, ram_fraction=2), ValueError, "fraction"),
    (dict(n=4, transform=3), TypeError, "transform"),
])
def test_array_dataset_rejects_bad_arguments(kwargs, exc, name):
    kwargs.setdefault("shape", (3, 4, 4))
    with pytest.raises(exc, match=name):
        ArrayDataset(**kwargs)


# ------------------------------------------------------------------ LatencyDataset

def test_latency_dataset_items():
    ds = LatencyDataset(n=7, latency_s=0.0, item_shape=(2, 3))
    x, label = ds[5]
    assert x.dtype == torch.uint8 and x.shape == (2, 3) and int(x[0, 0]) == 5 and label == 5
    assert len(ds) == 7 and "7 samples" in ds.describe()


def test_latency_dataset_sleeps_startup_once_per_process(monkeypatch):
    ds = LatencyDataset(n=4, latency_s=0.01, startup_s=0.2)
    sleeps: list[float] = []
    monkeypatch.setattr(data.time, "sleep", sleeps.append)
    ds[0]
    ds[1]
    assert sleeps == [0.2, 0.01, 0.01]
    # a fresh process (another pid, as in a new DataLoader worker) pays the start-up again
    monkeypatch.setattr(data.os, "getpid", lambda: -12345)
    sleeps.clear()
    ds[2]
    ds[3]
    assert sleeps == [0.2, 0.01, 0.01]


def test_latency_dataset_startup_real_time_lower_bounds():
    ds = LatencyDataset(n=4, latency_s=0.0, startup_s=0.3)
    t0 = time.perf_counter()
    ds[0]
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    ds[1]
    second = time.perf_counter() - t0
    assert first >= 0.3
    assert second < 0.3


@pytest.mark.parametrize("kwargs, exc, name", [
    (dict(latency_s=-0.001), ValueError, "latency_s"),
    (dict(latency_s=float("nan")), ValueError, "latency_s"),
    (dict(latency_s="5ms"), TypeError, "latency_s"),
    (dict(startup_s=-1), ValueError, "startup_s"),
    (dict(n=0), ValueError, "n"),
    (dict(item_shape=(3, -1)), ValueError, "item_shape"),
])
def test_latency_dataset_rejects_bad_arguments(kwargs, exc, name):
    with pytest.raises(exc, match=name):
        LatencyDataset(**kwargs)


# ------------------------------------------------------------------ ImageFolderDataset

def _write(path, bgr_colour, size=(20, 30)):
    path.parent.mkdir(parents=True, exist_ok=True)
    img = np.zeros((*size, 3), np.uint8)
    img[:] = bgr_colour
    assert cv2.imwrite(str(path), img)


@pytest.fixture()
def image_folder(tmp_path):
    _write(tmp_path / "cats" / "a.png", (255, 0, 0))  # pure blue in BGR
    _write(tmp_path / "cats" / "b.jpg", (0, 0, 255))
    _write(tmp_path / "dogs" / "c.PNG", (0, 255, 0))
    _write(tmp_path / "dogs" / "deep" / "d.bmp", (10, 20, 30))
    (tmp_path / "dogs" / "notes.txt").write_text("not an image")
    _write(tmp_path / ".ipynb_checkpoints" / "e.png", (0, 0, 0))  # hidden: skipped
    return tmp_path


def test_image_folder_dataset_finds_labels_and_decodes_rgb(image_folder):
    ds = ImageFolderDataset(image_folder)
    assert len(ds) == 4
    assert ds.classes == ["cats", "deep", "dogs"]  # immediate parent folder names, sorted
    assert [Path(p).name for p in ds.paths] == ["a.png", "b.jpg", "c.PNG", "d.bmp"]
    assert [ds[i][1] for i in range(4)] == [0, 0, 2, 1]
    img, _ = ds[0]
    assert img.shape == (20, 30, 3) and img.dtype == np.uint8
    assert tuple(img[0, 0]) == (0, 0, 255)  # blue is channel 2 in RGB
    assert "4 images" in ds.describe()
    t = ImageFolderDataset(image_folder, transform=ToTensorUint8(size=16))
    assert t[2][0].shape == (3, 16, 16)
    only_png = ImageFolderDataset(image_folder, extensions=("png",))
    assert len(only_png) == 2


def test_image_folder_dataset_flat_folder_has_label_zero(tmp_path):
    for name in ("x.jpg", "y.png"):
        _write(tmp_path / name, (1, 2, 3))
    ds = ImageFolderDataset(str(tmp_path))
    assert [ds[i][1] for i in range(len(ds))] == [0, 0]


def test_image_folder_dataset_errors(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(FileNotFoundError, match="no such folder; pass the folder that holds"):
        ImageFolderDataset(missing)
    a_file = tmp_path / "file.jpg"
    a_file.write_bytes(b"x")
    with pytest.raises(NotADirectoryError, match="not a folder"):
        ImageFolderDataset(a_file)
    empty = tmp_path / "empty"
    (empty / "sub").mkdir(parents=True)
    (empty / "sub" / "readme.txt").write_text("hi")
    with pytest.raises(ValueError, match=r"no images found.*\.jpg.*\.webp"):
        ImageFolderDataset(empty)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "bad.jpg").write_bytes(b"\xff\xd8 this is not really a jpeg")
    ds = ImageFolderDataset(broken)
    with pytest.raises(ValueError, match="bad.jpg"):
        ds[0]
    with pytest.raises(ValueError, match="extensions"):
        ImageFolderDataset(broken, extensions=("",))


# ------------------------------------------------------------------ pickling and real workers

def test_everything_pickles(image_folder):
    objects = [
        JpegDataset(5, min_side=32, max_side=64, transform=CommonRecipeTransform(32)),
        ArrayDataset(n=4, shape=(3, 4, 4)),
        LatencyDataset(n=3, latency_s=0.0),
        ImageFolderDataset(image_folder, transform=ToTensorUint8(8)),
        CommonRecipeTransform(64),
        ToTensorUint8(64),
    ]
    for obj in objects:
        clone = pickle.loads(pickle.dumps(obj))
        assert type(clone) is type(obj)
        if isinstance(obj, torch.utils.data.Dataset):
            assert len(clone) == len(obj)
            a, b = obj[1][0], clone[1][0]
            assert (torch.equal(a, b) if isinstance(a, torch.Tensor) else np.array_equal(a, b))
        else:
            assert clone == obj


@pytest.mark.timeout(90)
def test_spawn_dataloader_with_common_recipe():
    ds = JpegDataset(24, min_side=64, max_side=160, transform=CommonRecipeTransform(size=48))
    loader = DataLoader(ds, batch_size=8, num_workers=2, multiprocessing_context="spawn",
                        timeout=60)
    batches = list(loader)
    assert len(batches) == 3
    for k, (x, y) in enumerate(batches):
        assert x.shape == (8, 3, 48, 48) and x.dtype == torch.float32
        assert 0.0 <= float(x.min()) and float(x.max()) <= 1.0
        assert y.dtype == torch.int64
        assert y.tolist() == [i % 10 for i in range(8 * k, 8 * k + 8)]
    assert torch.allclose(batches[0][0][3], ds[3][0])
