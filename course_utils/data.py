"""Course datasets (JPEG decode: CPU-heavy; an in-memory array: light; latency: waiting) and the
two baseline transforms, importable so workers unpickle them under every start method. Each keeps
its data in NumPy arrays (one buffer + offsets, no Python object per sample), so a forked worker
reading it copies no pages ("copy-on-read").
"""
from __future__ import annotations

import functools
import math
import numbers
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar, Optional, Sequence, Union

import cv2
import numpy as np
import psutil
import torch
from torch.utils.data import Dataset

from .checks import check_fraction, check_index, check_int, check_seconds, check_transform
from .config import pick
from .image_ops import check_hwc

__all__ = ["sample_photo", "decode_jpeg", "ram_budget_bytes", "RamBudgetError", "JpegDataset",
           "ArrayDataset", "LatencyDataset", "CommonRecipeTransform", "ToTensorUint8"]

_N_CLASSES = 10
_MB = 1e6


def _as_shape(name: str, value: Any, where: str) -> tuple[int, ...]:
    dims = (value,) if isinstance(value, numbers.Integral) else value
    if isinstance(dims, str) or not hasattr(dims, "__iter__") or not len(dims) \
            or not all(isinstance(d, numbers.Integral) and not isinstance(d, bool) and d >= 1 for d in dims):
        raise ValueError(f"{where}: {name} must be a tuple of positive ints such as (3, 224, 224), "
                         f"got {value!r}.")
    return tuple(int(d) for d in dims)


@functools.lru_cache(maxsize=1)
def _photo_bgr() -> np.ndarray:
    import matplotlib  # lazy: only the photo needs it

    path = Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg"
    img = cv2.imdecode(np.fromfile(str(path), dtype=np.uint8), cv2.IMREAD_COLOR) if path.is_file() else None
    if img is None:
        raise FileNotFoundError(f"sample_photo(): matplotlib's sample photograph {path} is missing or "
                                f"damaged; reinstall matplotlib, or use ImageFolderDataset.")
    img.flags.writeable = False
    return img


def sample_photo() -> np.ndarray:
    """A real photograph (matplotlib's ``grace_hopper.jpg``) as a fresh (H, W, 3) uint8 **BGR**
    array (OpenCV's channel order)."""
    return _photo_bgr().copy()


def decode_jpeg(buf: Union[bytes, bytearray, memoryview, np.ndarray]) -> np.ndarray:
    """Encoded image bytes (JPEG, PNG, ...) decoded with OpenCV to an (H, W, 3) uint8 **RGB**
    array: the decode every :class:`JpegDataset` fetch pays."""
    if isinstance(buf, np.ndarray) and buf.dtype != np.uint8:
        raise TypeError(f"decode_jpeg(buf): buf must hold uint8 bytes, got dtype {buf.dtype}.")
    if not isinstance(buf, (bytes, bytearray, memoryview, np.ndarray)):
        raise TypeError(f"decode_jpeg(buf): buf must be bytes or a uint8 NumPy array, got "
                        f"{type(buf).__name__}.")
    arr = np.frombuffer(buf, dtype=np.uint8) if not isinstance(buf, np.ndarray) else buf.reshape(-1)
    if arr.size == 0:
        raise ValueError("decode_jpeg(buf): buf is empty; pass the bytes of an encoded image.")
    img = cv2.imdecode(arr, cv2.IMREAD_COLOR)
    if img is None:
        raise ValueError(f"decode_jpeg(buf): OpenCV could not decode these {arr.size} bytes; "
                         f"they are not a complete JPEG/PNG image.")
    return cv2.cvtColor(img, cv2.COLOR_BGR2RGB)


class RamBudgetError(MemoryError, ValueError):
    """An in-memory dataset would need more RAM than its budget (nothing was allocated)."""


def ram_budget_bytes(fraction: float = 0.25) -> int:
    """Bytes a course dataset may allocate: ``fraction`` of the RAM available now."""
    return int(psutil.virtual_memory().available * check_fraction("fraction", fraction, "ram_budget_bytes"))


def _make_variant(photo: np.ndarray, rng: np.random.Generator, min_side: int,
                  max_side: int) -> np.ndarray:
    """One randomised BGR variant of ``photo`` (crop, resize, colour, flips). It draws the same
    random values whatever the outcome, so image k depends only on the seed."""
    h0, w0 = photo.shape[:2]
    area = rng.uniform(0.25, 1.0) * h0 * w0                     # as RandomResizedCrop draws
    ratio = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
    cw = int(min(w0, max(8, round(math.sqrt(area * ratio)))))
    ch = int(min(h0, max(8, round(math.sqrt(area / ratio)))))
    fx, fy = rng.random(2)
    x0, y0 = int(fx * (w0 - cw + 1)), int(fy * (h0 - ch + 1))
    scale = int(rng.integers(min_side, max_side + 1)) / max(cw, ch)   # the longest side
    size = (max(1, int(round(cw * scale))), max(1, int(round(ch * scale))))
    gains = rng.uniform(0.75, 1.25, size=3)
    gamma = rng.uniform(0.8, 1.25)
    brightness = rng.uniform(-25.0, 25.0)
    hue_on, hue_shift = rng.random() < 0.3, int(rng.integers(1, 180))
    hflip, vflip = rng.random() < 0.5, rng.random() < 0.1

    img = cv2.resize(photo[y0:y0 + ch, x0:x0 + cw], size, interpolation=cv2.INTER_LINEAR)
    levels = (np.arange(256, dtype=np.float64) / 255.0) ** gamma * 255.0
    lut = np.clip(levels[:, None] * gains[None, :] + brightness, 0, 255)
    img = cv2.LUT(img, lut.round().astype(np.uint8).reshape(1, 256, 3))
    if hue_on:
        hsv = cv2.cvtColor(img, cv2.COLOR_BGR2HSV)
        hsv[..., 0] = ((np.arange(256) + hue_shift) % 180).astype(np.uint8)[hsv[..., 0]]
        img = cv2.cvtColor(hsv, cv2.COLOR_HSV2BGR)
    if hflip or vflip:
        img = cv2.flip(img, -1 if hflip and vflip else 1 if hflip else 0)
    return img


class JpegDataset(Dataset):
    """``n`` real JPEGs made from one photograph and decoded with OpenCV on every fetch: random
    crops of :func:`sample_photo` (longest side ``min_side`` to ``max_side`` px), colour-shifted,
    encoded once into ONE uint8 :attr:`buffer` indexed by :attr:`offsets`. ``ds[i]`` is ``(RGB
    uint8 image or transform(image), i % 10)``; the first k images depend only on ``seed``."""

    def __init__(self, n: Optional[int] = None, *, min_side: int = 160, max_side: int = 512,
                 quality: int = 90, seed: int = 0, transform: Optional[Callable] = None,
                 progress: Optional[bool] = None) -> None:
        where = "JpegDataset"
        self.n = check_int("n", pick(full=2000, quick=200) if n is None else n, 1, where)
        self.min_side = check_int("min_side", min_side, 16, where, maximum=4096)
        self.max_side = check_int("max_side", max_side, self.min_side, where, maximum=4096)
        self.quality = check_int("quality", quality, 1, where, maximum=100)
        self.seed = check_int("seed", seed, 0, where)
        self.transform = check_transform(transform, where)

        rng = np.random.default_rng(self.seed)
        params = [int(cv2.IMWRITE_JPEG_QUALITY), self.quality]
        indices: Sequence[int] = range(self.n)
        if self.n >= 1000 if progress is None else progress:
            from tqdm import tqdm  # plain tqdm: a terminal and (as text) Jupyter
            indices = tqdm(indices, desc="encoding JPEGs", unit="img", leave=False)
        chunks: list[np.ndarray] = []
        self.shapes = np.empty((self.n, 2), dtype=np.int32)   # decoded (height, width)
        for i in indices:
            img = _make_variant(_photo_bgr(), rng, self.min_side, self.max_side)
            chunks.append(cv2.imencode(".jpg", img, params)[1].reshape(-1))
            self.shapes[i] = img.shape[:2]
        self.offsets = np.zeros(self.n + 1, dtype=np.int64)
        np.cumsum([c.size for c in chunks], out=self.offsets[1:])
        self.buffer = np.concatenate(chunks)
        self.labels = np.arange(self.n, dtype=np.int64) % _N_CLASSES

    @property
    def nbytes(self) -> int:
        """Bytes of the encoded JPEGs."""
        return int(self.buffer.nbytes)

    @property
    def decoded_nbytes(self) -> int:
        """Bytes of all images once decoded (H x W x 3 uint8)."""
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
        return (image if self.transform is None else self.transform(image)), int(self.labels[i])

    def describe(self) -> str:
        """One line: count, pixel sizes, encoded MB and mean decoded MB."""
        longest = self.shapes.max(axis=1)
        mean_dec = self.decoded_nbytes / self.n
        return (f"JpegDataset: {self.n} JPEGs (quality {self.quality}, seed {self.seed}), "
                f"longest side {int(longest.min())}-{int(longest.max())} px, "
                f"{self.nbytes / _MB:.1f} MB encoded, mean decoded image {mean_dec / _MB:.2f} MB "
                f"({mean_dec * self.n / self.nbytes:.0f}x the JPEG), transform={self.transform!r}")

    def __repr__(self) -> str:
        return (f"JpegDataset(n={self.n}, min_side={self.min_side}, max_side={self.max_side}, "
                f"quality={self.quality}, seed={self.seed}, transform={self.transform!r})")


class ArrayDataset(Dataset):
    """A synthetic in-memory dataset: one NumPy array of shape ``(n, *shape)`` filled from
    ``seed``; ``ds[i]`` is ``(torch.from_numpy(array[i]), i % 10)``, sharing its memory. The
    array gets at most :func:`ram_budget_bytes` ``(ram_fraction)``: the default ``n`` shrinks
    to fit, an explicit one that does not fit raises :class:`RamBudgetError`."""

    def __init__(self, n: Optional[int] = None, shape: Sequence[int] = (3, 224, 224),
                 dtype: Any = np.uint8, seed: int = 0, transform: Optional[Callable] = None,
                 *, ram_fraction: float = 0.25) -> None:
        where = "ArrayDataset"
        self.shape = _as_shape("shape", shape, where)
        try:
            self.dtype: Any = np.dtype(dtype)
        except TypeError:
            self.dtype = None
        if self.dtype is None or self.dtype.kind not in "uif":
            raise TypeError(f"{where}: dtype={dtype!r} is not supported; pass an integer or float "
                            f"NumPy dtype (np.uint8 is the default, np.float32 takes 4x the bytes).")
        self.seed = check_int("seed", seed, 0, where)
        self.transform = check_transform(transform, where)
        self.budget_bytes = ram_budget_bytes(ram_fraction)
        self.ram_fraction = float(ram_fraction)
        self.item_nbytes = int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize
        self.shrunk_from: Optional[int] = None
        fix = (f"Pass a smaller n, keep dtype=np.uint8 (float32 takes 4x the bytes), use a smaller "
               f"shape, or raise ram_fraction (now {ram_fraction}) if you know the RAM is free")
        if n is None:
            n, fits = pick(full=10000, quick=512), self.budget_bytes // self.item_nbytes
            if fits < 1:
                raise RamBudgetError(f"{where}: even one sample of shape {self.shape} {self.dtype} "
                                     f"({self.item_nbytes:,} bytes) exceeds the RAM budget of "
                                     f"{self.budget_bytes:,} bytes. {fix}.")
            if n > fits:
                self.shrunk_from, n = n, int(fits)
        self.n = check_int("n", n, 1, where)
        if self.n * self.item_nbytes > self.budget_bytes:
            raise RamBudgetError(
                f"{where}: n={self.n} samples of shape {self.shape} {self.dtype} would take "
                f"{self.n * self.item_nbytes:,} bytes, more than the RAM budget of "
                f"{self.budget_bytes:,} bytes ({ram_fraction} of the available RAM); nothing was "
                f"allocated. {fix}.")
        self.data = np.empty((self.n, *self.shape), dtype=self.dtype)
        rng = np.random.default_rng(self.seed)
        step = max(1, (64 << 20) // self.item_nbytes)           # ~64 MB per block, no full-size temporary
        for start in range(0, self.n, step):
            block = self.data[start:start + step]
            block[...] = (rng.integers(0, min(256, np.iinfo(self.dtype).max + 1), size=block.shape,
                                       dtype=self.dtype) if self.dtype.kind in "ui" else
                          rng.random(size=block.shape, dtype=np.float64 if self.dtype == np.float64 else np.float32))
        self.labels = np.arange(self.n, dtype=np.int64) % _N_CLASSES

    @property
    def nbytes(self) -> int:
        """Bytes of the in-memory array."""
        return int(self.data.nbytes)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[Any, int]:
        i = check_index(i, self.n, "ArrayDataset")
        x = torch.from_numpy(self.data[i])
        return (x if self.transform is None else self.transform(x)), int(self.labels[i])

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
    """Samples that cost waiting, not CPU (slow storage): every fetch sleeps ``latency_s``
    seconds, the first in each process ``startup_s`` more (opening files once). ``ds[i]`` is
    ``(uint8 tensor of item_shape filled with i % 256, i % 10)``."""

    def __init__(self, n: Optional[int] = None, latency_s: float = 0.005, startup_s: float = 0.0,
                 item_shape: Sequence[int] = (3, 32, 32)) -> None:
        where = "LatencyDataset"
        self.n = check_int("n", pick(full=2000, quick=200) if n is None else n, 1, where)
        self.latency_s = check_seconds("latency_s", latency_s, where)
        self.startup_s = check_seconds("startup_s", startup_s, where)
        self.item_shape = _as_shape("item_shape", item_shape, where)
        self._started_pid: Optional[int] = None  # the process that has paid startup_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        i = check_index(i, self.n, "LatencyDataset")
        if self._started_pid != os.getpid():
            if self.startup_s:
                time.sleep(self.startup_s)
            self._started_pid = os.getpid()
        if self.latency_s:
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


@dataclass(frozen=True)
class ToTensorUint8:
    """The tuned per-sample transform: an (H, W, 3) uint8 image, bilinear resize to ``size`` x
    ``size``, kept uint8, as a CHW tensor (converted to float later, per batch)."""

    size: int = 224
    float32: ClassVar[bool] = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", check_int("size", self.size, 1, type(self).__name__, maximum=8192))

    def __call__(self, image: np.ndarray) -> torch.Tensor:
        image = check_hwc(image, type(self).__name__, uint8_only=True)
        img = cv2.resize(image, (self.size, self.size), interpolation=cv2.INTER_LINEAR)
        if self.float32:
            img = img.astype(np.float32) / 255
        return torch.from_numpy(img).permute(2, 0, 1).contiguous()


@dataclass(frozen=True)
class CommonRecipeTransform(ToTensorUint8):
    """The common recipe: :class:`ToTensorUint8`, then per-sample ``float32 / 255`` (four times
    the bytes of the uint8 image, made per sample in the worker)."""

    float32: ClassVar[bool] = True
