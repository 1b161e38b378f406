"""Course datasets (JPEG decode: CPU-heavy; in-memory array: light; latency: storage-bound) and
the two baseline transforms, importable so workers unpickle them under every start method.

Every dataset keeps its data in NumPy arrays (one buffer + offsets, never a Python list of
objects), so reading it in a forked worker does not copy pages ("copy-on-read").
"""
from __future__ import annotations

import functools
import math
import numbers
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, Union

import cv2
import numpy as np
import psutil
import torch
from torch.utils.data import Dataset

from .checks import check_fraction, check_index, check_int, check_seconds, check_transform
from .config import pick
from .image_ops import check_hwc

__all__ = [
    "sample_photo", "decode_jpeg", "ram_budget_bytes", "RamBudgetError", "JpegDataset",
    "ArrayDataset", "LatencyDataset", "CommonRecipeTransform", "ToTensorUint8",
]

PHOTO_NAME = "grace_hopper.jpg"
_N_CLASSES = 10
_MB = 1e6


def _as_shape(name: str, value: Any, *, where: str) -> tuple[int, ...]:
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        value = (value,)
    try:
        dims = tuple(value)
    except TypeError:
        raise TypeError(f"{where}: {name} must be a tuple of positive ints such as (3, 224, 224), "
                        f"got {value!r}.") from None
    if not dims:
        raise ValueError(f"{where}: {name}=() is empty; pass a shape such as (3, 224, 224).")
    out = []
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, numbers.Integral) or int(d) < 1:
            raise ValueError(f"{where}: {name}={value!r} must contain only positive ints, "
                             f"e.g. (3, 224, 224).")
        out.append(int(d))
    return tuple(out)


def _photo_path() -> Path:
    import matplotlib  # local import: only needed here, keeps ``import course_utils.data`` light
    candidates = []
    try:
        import matplotlib.cbook as cbook  # lazy, as above
        candidates.append(Path(cbook.get_sample_data(PHOTO_NAME, asfileobj=False)))
    except Exception:  # older/newer matplotlib may resolve sample data differently
        pass
    candidates.append(Path(matplotlib.get_data_path()) / "sample_data" / PHOTO_NAME)
    for path in candidates:
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"sample_photo(): matplotlib's sample photograph {PHOTO_NAME!r} is not in "
        f"{', '.join(str(p) for p in candidates)}; reinstall matplotlib, or use ImageFolderDataset.")


@functools.lru_cache(maxsize=1)
def _photo_bgr() -> np.ndarray:
    path = _photo_path()
    # np.fromfile + imdecode (rather than cv2.imread) also works for non-ASCII paths on Windows.
    img = cv2.imdecode(np.fromfile(str(path), dtype=np.uint8), cv2.IMREAD_COLOR)
    if img is None:
        raise ValueError(f"sample_photo(): OpenCV could not decode {path}; the file may be "
                         f"damaged. Reinstall matplotlib.")
    img.flags.writeable = False
    return img


def sample_photo() -> np.ndarray:
    """A real photograph: matplotlib's ``grace_hopper.jpg`` as an (H, W, 3) uint8 **BGR** array
    (OpenCV's channel order), a fresh copy of the per-process cache."""
    return _photo_bgr().copy()


def decode_jpeg(buf: Union[bytes, bytearray, memoryview, np.ndarray]) -> np.ndarray:
    """Decode encoded image bytes (JPEG, PNG, ...) with OpenCV into an (H, W, 3) uint8 **RGB**
    array: the decode step every :class:`JpegDataset` fetch pays."""
    if isinstance(buf, np.ndarray):
        if buf.dtype != np.uint8:
            raise TypeError(f"decode_jpeg(buf): buf must hold uint8 bytes, got dtype {buf.dtype}.")
        arr = buf.reshape(-1)
    elif isinstance(buf, (bytes, bytearray, memoryview)):
        arr = np.frombuffer(buf, dtype=np.uint8)
    else:
        raise TypeError(f"decode_jpeg(buf): buf must be bytes or a uint8 NumPy array, got "
                        f"{type(buf).__name__}.")
    if arr.size == 0:
        raise ValueError("decode_jpeg(buf): buf is empty; pass the bytes of an encoded image.")
    img = cv2.imdecode(arr, cv2.IMREAD_COLOR)
    if img is None:
        raise ValueError(f"decode_jpeg(buf): OpenCV could not decode these {arr.size} bytes; "
                         f"they are not a complete JPEG/PNG image.")
    return cv2.cvtColor(img, cv2.COLOR_BGR2RGB)


class RamBudgetError(MemoryError, ValueError):
    """An in-memory dataset would need more RAM than the budget allows (nothing was allocated)."""


def ram_budget_bytes(fraction: float = 0.25) -> int:
    """Bytes a course dataset may allocate: ``fraction`` of the RAM available right now."""
    fraction = check_fraction("fraction", fraction, "ram_budget_bytes")
    return int(psutil.virtual_memory().available * fraction)


def _make_variant(photo: np.ndarray, rng: np.random.Generator, min_side: int,
                  max_side: int) -> np.ndarray:
    """One randomised BGR variant of ``photo``: crop, resize, colour change, flips. Draws the
    same number of random values whatever the outcome, so image k depends only on the seed."""
    h0, w0 = photo.shape[:2]
    # crop box: 25-100 % of the area, aspect ratio 3/4..4/3 (like RandomResizedCrop)
    area = rng.uniform(0.25, 1.0) * h0 * w0
    ratio = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
    cw = int(min(w0, max(8, round(math.sqrt(area * ratio)))))
    ch = int(min(h0, max(8, round(math.sqrt(area / ratio)))))
    fx, fy = rng.random(2)
    x0 = int(fx * (w0 - cw + 1))
    y0 = int(fy * (h0 - ch + 1))
    # output size: longest side uniform in [min_side, max_side]
    longest = int(rng.integers(min_side, max_side + 1))
    scale = longest / max(cw, ch)
    out_w = max(1, int(round(cw * scale)))
    out_h = max(1, int(round(ch * scale)))
    # colour: per-channel gain, gamma and brightness (one LUT), sometimes a hue rotation
    gains = rng.uniform(0.75, 1.25, size=3)
    gamma = rng.uniform(0.8, 1.25)
    brightness = rng.uniform(-25.0, 25.0)
    hue_on, hue_shift = rng.random() < 0.3, int(rng.integers(1, 180))
    hflip, vflip = rng.random() < 0.5, rng.random() < 0.1

    crop = photo[y0:y0 + ch, x0:x0 + cw]
    # bilinear either way: this is data generation, not the pipeline being measured
    img = cv2.resize(crop, (out_w, out_h), interpolation=cv2.INTER_LINEAR)
    levels = (np.arange(256, dtype=np.float64) / 255.0) ** gamma * 255.0
    lut = np.clip(levels[:, None] * gains[None, :] + brightness, 0, 255)
    img = cv2.LUT(img, lut.round().astype(np.uint8).reshape(1, 256, 3))
    if hue_on:
        hsv = cv2.cvtColor(img, cv2.COLOR_BGR2HSV)
        hue_lut = ((np.arange(256) + hue_shift) % 180).astype(np.uint8)
        hsv[..., 0] = hue_lut[hsv[..., 0]]
        img = cv2.cvtColor(hsv, cv2.COLOR_HSV2BGR)
    if hflip and vflip:
        img = cv2.flip(img, -1)
    elif hflip:
        img = cv2.flip(img, 1)
    elif vflip:
        img = cv2.flip(img, 0)
    return img


class JpegDataset(Dataset):
    """``n`` real JPEGs made from one photograph, decoded with OpenCV on every fetch: random crops
    of :func:`sample_photo` (longest side ``min_side`` to ``max_side`` px), colour-shifted, encoded
    once into ONE uint8 :attr:`buffer` indexed by :attr:`offsets`. ``ds[i]`` is ``(RGB uint8 image
    or transform(image), i % 10)``; the first k images depend only on ``seed``."""

    def __init__(self, n: Optional[int] = None, *, min_side: int = 160, max_side: int = 512,
                 quality: int = 90, seed: int = 0, transform: Optional[Callable] = None,
                 progress: Optional[bool] = None) -> None:
        where = "JpegDataset"
        if n is None:
            n = pick(full=2000, quick=200)
        self.n = check_int("n", n, 1, where)
        self.min_side = check_int("min_side", min_side, 16, where, maximum=4096)
        self.max_side = check_int("max_side", max_side, 16, where, maximum=4096)
        if self.min_side > self.max_side:
            raise ValueError(f"{where}: min_side={self.min_side} is larger than "
                             f"max_side={self.max_side}; pass min_side <= max_side.")
        self.quality = check_int("quality", quality, 1, where, maximum=100)
        self.seed = check_int("seed", seed, 0, where)
        self.transform = check_transform(transform, where)

        photo = _photo_bgr()
        rng = np.random.default_rng(self.seed)
        params = [int(cv2.IMWRITE_JPEG_QUALITY), self.quality]
        indices: Sequence[int] = range(self.n)
        if self.n >= 1000 if progress is None else progress:
            from tqdm import tqdm  # plain tqdm: works in a terminal and (as text) in Jupyter
            indices = tqdm(indices, desc="encoding JPEGs", unit="img", leave=False)
        chunks: list[np.ndarray] = []  # temporary; only the concatenated buffer is kept
        shapes = np.empty((self.n, 2), dtype=np.int32)
        for i in indices:
            img = _make_variant(photo, rng, self.min_side, self.max_side)
            ok, enc = cv2.imencode(".jpg", img, params)
            if not ok:  # pragma: no cover - OpenCV always encodes a valid uint8 image
                raise RuntimeError(f"{where}: cv2.imencode failed for image {i}.")
            chunks.append(enc.reshape(-1))
            shapes[i] = img.shape[:2]
        sizes = np.fromiter((c.size for c in chunks), dtype=np.int64, count=self.n)
        self.offsets: np.ndarray = np.zeros(self.n + 1, dtype=np.int64)
        np.cumsum(sizes, out=self.offsets[1:])
        self.buffer: np.ndarray = np.concatenate(chunks)
        del chunks
        self.shapes: np.ndarray = shapes  # (n, 2) int32: decoded (height, width) of each image
        self.labels: np.ndarray = np.arange(self.n, dtype=np.int64) % _N_CLASSES

    @property
    def nbytes(self) -> int:
        """Total size of the encoded JPEG bytes, in bytes."""
        return int(self.buffer.nbytes)

    @property
    def decoded_nbytes(self) -> int:
        """Total size of all images once decoded (H*W*3 uint8), in bytes."""
        return int((self.shapes[:, 0].astype(np.int64) * self.shapes[:, 1] * 3).sum())

    def encoded(self, i: int) -> np.ndarray:
        """The JPEG bytes of sample ``i``: a read-only uint8 view into :attr:`buffer` (no copy)."""
        i = check_index(i, self.n, "JpegDataset.encoded")
        view = self.buffer[self.offsets[i]:self.offsets[i + 1]]
        view.flags.writeable = False
        return view

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[Any, int]:
        i = check_index(i, self.n, "JpegDataset")
        image = decode_jpeg(self.buffer[self.offsets[i]:self.offsets[i + 1]])
        if self.transform is not None:
            image = self.transform(image)
        return image, int(self.labels[i])

    def describe(self) -> str:
        """One line: count, pixel sizes, encoded MB and mean decoded size."""
        longest = self.shapes.max(axis=1)
        mean_dec = self.decoded_nbytes / self.n
        return (f"JpegDataset: {self.n} JPEGs (quality {self.quality}, seed {self.seed}), "
                f"longest side {int(longest.min())}-{int(longest.max())} px, "
                f"{self.nbytes / _MB:.1f} MB encoded, mean decoded image {mean_dec / _MB:.2f} MB "
                f"({mean_dec / max(1, self.nbytes / self.n):.0f}x the JPEG), "
                f"transform={self.transform!r}")

    def __repr__(self) -> str:
        return (f"JpegDataset(n={self.n}, min_side={self.min_side}, max_side={self.max_side}, "
                f"quality={self.quality}, seed={self.seed}, transform={self.transform!r})")


_ARRAY_DTYPES = tuple(np.dtype(d) for d in (
    np.uint8, np.int8, np.int16, np.int32, np.int64, np.float16, np.float32, np.float64))


def _fill_random(out: np.ndarray, rng: np.random.Generator) -> None:
    """Fill ``out`` (first axis = samples) in chunks of ~64 MB, without a full-size temporary."""
    per_item = max(1, out[0].nbytes if out.shape[0] else 1)
    step = max(1, (64 << 20) // per_item)
    dtype = out.dtype
    for start in range(0, out.shape[0], step):
        block = out[start:start + step]
        if dtype.kind in "ui":
            info = np.iinfo(dtype)
            block[...] = rng.integers(max(0, info.min), min(256, info.max + 1),
                                      size=block.shape, dtype=dtype)
        elif dtype in (np.float32, np.float64):
            block[...] = rng.random(size=block.shape, dtype=dtype)
        else:  # float16
            block[...] = rng.random(size=block.shape, dtype=np.float32)


class ArrayDataset(Dataset):
    """A synthetic in-memory dataset: one NumPy array of shape ``(n, *shape)`` filled from
    ``seed``; ``ds[i]`` is ``(torch.from_numpy(array[i]), i % 10)``, sharing its memory.

    The array may use at most :func:`ram_budget_bytes` ``(ram_fraction)``: the default ``n`` is
    shrunk to fit, an explicit one that does not fit raises :class:`RamBudgetError`.
    """

    def __init__(self, n: Optional[int] = None, shape: Sequence[int] = (3, 224, 224),
                 dtype: Any = np.uint8, seed: int = 0, transform: Optional[Callable] = None,
                 *, ram_fraction: float = 0.25) -> None:
        where = "ArrayDataset"
        self.shape = _as_shape("shape", shape, where=where)
        try:
            self.dtype = np.dtype(dtype)
        except TypeError:
            raise TypeError(f"{where}: dtype={dtype!r} is not a NumPy dtype; pass np.uint8 "
                            f"(the default) or np.float32.") from None
        if self.dtype not in _ARRAY_DTYPES:
            raise TypeError(f"{where}: dtype={self.dtype} is not supported; pass one of "
                            f"{', '.join(str(d) for d in _ARRAY_DTYPES)} (np.uint8 is the default).")
        self.seed = check_int("seed", seed, 0, where)
        self.transform = check_transform(transform, where)
        try:
            self.budget_bytes = ram_budget_bytes(ram_fraction)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"{where}: ram_fraction={ram_fraction!r} must be a number in (0, 1], "
                            f"the share of the available RAM the array may use.") from None
        self.ram_fraction = float(ram_fraction)
        self.item_nbytes = int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize
        self.requested_n = n
        self.shrunk_from: Optional[int] = None

        fix = (f"Pass a smaller n, keep dtype=np.uint8 (float32 takes 4x the bytes), use a "
               f"smaller shape, or raise ram_fraction (now {ram_fraction}) if you know the RAM is free")
        if n is None:
            default_n = pick(full=10000, quick=512)
            fits = self.budget_bytes // self.item_nbytes
            if fits < 1:
                raise RamBudgetError(
                    f"{where}: even one sample of shape {self.shape} {self.dtype} "
                    f"({self.item_nbytes:,} bytes) exceeds the RAM budget of "
                    f"{self.budget_bytes:,} bytes. {fix}.")
            if default_n > fits:
                self.shrunk_from, n = default_n, int(fits)
            else:
                n = default_n
        self.n = check_int("n", n, 1, where)
        need = self.n * self.item_nbytes
        if need > self.budget_bytes:
            raise RamBudgetError(
                f"{where}: n={self.n} samples of shape {self.shape} {self.dtype} would take "
                f"{need:,} bytes, more than the RAM budget of {self.budget_bytes:,} bytes "
                f"({ram_fraction} of the available RAM); nothing was allocated. {fix}.")

        self.data: np.ndarray = np.empty((self.n, *self.shape), dtype=self.dtype)
        _fill_random(self.data, np.random.default_rng(self.seed))
        self.labels: np.ndarray = np.arange(self.n, dtype=np.int64) % _N_CLASSES

    @property
    def nbytes(self) -> int:
        """Size of the in-memory array, in bytes."""
        return int(self.data.nbytes)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[Any, int]:
        i = check_index(i, self.n, "ArrayDataset")
        x = torch.from_numpy(self.data[i])
        if self.transform is not None:
            x = self.transform(x)
        return x, int(self.labels[i])

    def describe(self) -> str:
        """One line: count, shape, dtype, MB used and the RAM budget (and any shrinking)."""
        text = (f"ArrayDataset: {self.n} samples of {self.shape} {self.dtype} "
                f"({self.item_nbytes / _MB:.2f} MB each, {self.nbytes / _MB:.1f} MB in RAM; "
                f"budget {self.budget_bytes / _MB:.0f} MB)")
        if self.shrunk_from is not None:
            text += (f"; shrunk from the default n={self.shrunk_from} to fit the RAM budget "
                     f"(ram_fraction={self.ram_fraction})")
        return text

    def __repr__(self) -> str:
        return (f"ArrayDataset(n={self.n}, shape={self.shape}, dtype=np.{self.dtype}, "
                f"seed={self.seed}, transform={self.transform!r})")


class LatencyDataset(Dataset):
    """Samples that cost waiting, not CPU: a simulated slow storage or network.

    Every fetch sleeps ``latency_s`` seconds; the first fetch in each process also sleeps
    ``startup_s`` seconds, as a fresh worker pays for opening files once. Returns
    ``(uint8 tensor of item_shape filled with i % 256, i % 10)``.
    """

    def __init__(self, n: Optional[int] = None, latency_s: float = 0.005, startup_s: float = 0.0,
                 item_shape: Sequence[int] = (3, 32, 32)) -> None:
        where = "LatencyDataset"
        if n is None:
            n = pick(full=2000, quick=200)
        self.n = check_int("n", n, 1, where)
        self.latency_s = check_seconds("latency_s", latency_s, where)
        self.startup_s = check_seconds("startup_s", startup_s, where)
        self.item_shape = _as_shape("item_shape", item_shape, where=where)
        self._started_pid: Optional[int] = None  # process that has paid startup_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        i = check_index(i, self.n, "LatencyDataset")
        pid = os.getpid()
        if self._started_pid != pid:
            if self.startup_s > 0:
                time.sleep(self.startup_s)
            self._started_pid = pid
        if self.latency_s > 0:
            time.sleep(self.latency_s)
        return torch.full(self.item_shape, i % 256, dtype=torch.uint8), i % _N_CLASSES

    def describe(self) -> str:
        """One line: count, per-sample latency, per-process start-up (seconds)."""
        sleep, cap = "no per-sample sleep", ""
        if self.latency_s > 0:
            sleep = f"{self.latency_s * 1e3:g} ms sleep per sample"
            cap = f"; at most {1 / self.latency_s:.0f} samples/s per worker"
        return (f"LatencyDataset: {self.n} samples of {self.item_shape} uint8, {sleep}, "
                f"{self.startup_s:g} s start-up once per process{cap}")

    def __repr__(self) -> str:
        return (f"LatencyDataset(n={self.n}, latency_s={self.latency_s}, "
                f"startup_s={self.startup_s}, item_shape={self.item_shape})")


def _check_size(obj: Any, where: str) -> None:
    object.__setattr__(obj, "size", check_int("size", obj.size, 1, where, maximum=8192))


@dataclass(frozen=True)
class CommonRecipeTransform:
    """The common recipe: bilinear resize, then per-sample ``float32 / 255``, then a CHW tensor
    (four times the bytes of the uint8 image, made per sample in the worker)."""

    size: int = 224

    def __post_init__(self) -> None:
        _check_size(self, "CommonRecipeTransform")

    def __call__(self, image: np.ndarray) -> torch.Tensor:
        image = check_hwc(image, "CommonRecipeTransform", uint8_only=True)
        img = cv2.resize(image, (self.size, self.size), interpolation=cv2.INTER_LINEAR)
        x = img.astype(np.float32) / 255
        return torch.from_numpy(x).permute(2, 0, 1).contiguous()


@dataclass(frozen=True)
class ToTensorUint8:
    """The tuned variant: bilinear resize, keep ``uint8``, CHW tensor (convert to float later,
    in batch)."""

    size: int = 224

    def __post_init__(self) -> None:
        _check_size(self, "ToTensorUint8")

    def __call__(self, image: np.ndarray) -> torch.Tensor:
        image = check_hwc(image, "ToTensorUint8", uint8_only=True)
        img = cv2.resize(image, (self.size, self.size), interpolation=cv2.INTER_LINEAR)
        return torch.from_numpy(img).permute(2, 0, 1).contiguous()
