"""Course datasets and the two baseline transforms.

Everything here is importable, so DataLoader workers can unpickle it under every start method
(``fork``, ``forkserver``, ``spawn``). Nothing happens at import time.

Datasets
    :class:`JpegDataset`        real JPEG bytes (crops of a photograph that ships with matplotlib),
                                decoded with OpenCV on every fetch: the CPU-heavy case.
    :class:`ArrayDataset`       a synthetic in-memory array, refused when it would not fit in RAM:
                                the light case.
    :class:`LatencyDataset`     sleeps per sample (and once per process at start-up): the
                                storage/network-bound case.

(A folder of the learner's own images is :class:`course_utils.image_folder.ImageFolderDataset`.)

Every dataset keeps its data in NumPy arrays (one buffer + offsets, never a Python list of
objects), so reading it in a forked worker does not copy pages ("copy-on-read").

Transforms (picklable classes, not lambdas)
    :class:`CommonRecipeTransform` resize, then per-sample ``float32 / 255``, CHW tensor
                                   (the usual recipe, our baseline).
    :class:`ToTensorUint8`         resize, keep ``uint8``, CHW tensor (the tuned variant).
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

from .checks import check_index, check_int, check_seconds, check_transform
from .config import pick

__all__ = [
    "sample_photo", "decode_jpeg", "ram_budget_bytes", "RamBudgetError", "JpegDataset",
    "ArrayDataset", "LatencyDataset", "CommonRecipeTransform", "ToTensorUint8",
]

PHOTO_NAME = "grace_hopper.jpg"
_N_CLASSES = 10
_MB = 1e6


# --------------------------------------------------------------------------------------------
# small validation helpers (errors name the argument and say what to do)
# --------------------------------------------------------------------------------------------

def _as_shape(name: str, value: Any, *, where: str) -> tuple[int, ...]:
    """Return ``value`` as a tuple of positive ints, or raise naming ``name``."""
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



# --------------------------------------------------------------------------------------------
# the photograph and JPEG decoding
# --------------------------------------------------------------------------------------------

def _photo_path() -> Path:
    """Path of matplotlib's shipped sample photograph (``grace_hopper.jpg``)."""
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
        f"sample_photo(): matplotlib's sample photograph {PHOTO_NAME!r} was not found (looked in "
        f"{', '.join(str(p) for p in candidates)}). Reinstall matplotlib from pip or conda-forge "
        f"(its sample data ships with the package), or use ImageFolderDataset on your own images.")


@functools.lru_cache(maxsize=1)
def _photo_bgr() -> np.ndarray:
    """Decoded photograph, cached once per process, read-only."""
    path = _photo_path()
    # np.fromfile + imdecode (rather than cv2.imread) also works for non-ASCII paths on Windows.
    img = cv2.imdecode(np.fromfile(str(path), dtype=np.uint8), cv2.IMREAD_COLOR)
    if img is None:
        raise ValueError(f"sample_photo(): OpenCV could not decode {path}; the file may be "
                         f"damaged. Reinstall matplotlib.")
    img.flags.writeable = False
    return img


def sample_photo() -> np.ndarray:
    """A real photograph: matplotlib's ``grace_hopper.jpg`` as an (H, W, 3) uint8 **BGR** array.

    BGR is OpenCV's channel order (use ``img[..., ::-1]`` or ``cv2.cvtColor`` for RGB). The
    decoded image is cached per process; each call returns a fresh copy you may modify.
    """
    return _photo_bgr().copy()


def decode_jpeg(buf: Union[bytes, bytearray, memoryview, np.ndarray]) -> np.ndarray:
    """Decode encoded image bytes (JPEG, PNG, ...) with OpenCV into an (H, W, 3) uint8 **RGB** array.

    This is the decode step every :class:`JpegDataset` fetch pays: ``cv2.imdecode`` (BGR)
    followed by a BGR -> RGB channel swap.
    """
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


# --------------------------------------------------------------------------------------------
# RAM budget
# --------------------------------------------------------------------------------------------

class RamBudgetError(MemoryError, ValueError):
    """An in-memory dataset would need more RAM than the budget allows (nothing was allocated).

    A subclass of both MemoryError and ValueError, so either ``except`` catches it.
    """


def ram_budget_bytes(fraction: float = 0.25) -> int:
    """Bytes a course dataset may allocate: ``fraction`` of the RAM available right now.

    Available RAM is ``psutil.virtual_memory().available`` (bytes), read at call time.
    """
    if isinstance(fraction, bool) or not isinstance(fraction, numbers.Real):
        raise TypeError(f"ram_budget_bytes(fraction={fraction!r}): fraction must be a number "
                        f"in (0, 1], e.g. 0.25 for a quarter of the available RAM.")
    fraction = float(fraction)
    if not (0.0 < fraction <= 1.0):
        raise ValueError(f"ram_budget_bytes(fraction={fraction!r}): fraction must be in (0, 1], "
                         f"e.g. 0.25 for a quarter of the available RAM.")
    return int(psutil.virtual_memory().available * fraction)


# --------------------------------------------------------------------------------------------
# JpegDataset
# --------------------------------------------------------------------------------------------

def _make_variant(photo: np.ndarray, rng: np.random.Generator, min_side: int,
                  max_side: int) -> np.ndarray:
    """One randomised BGR variant of ``photo``: crop, resize, colour change, flips.

    Draws the same number of random values whatever the outcome, so image k depends only on
    the seed (the first k images are identical for every n).
    """
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
    """``n`` real JPEGs made from one photograph, decoded with OpenCV on every fetch.

    At construction every image is a random crop of :func:`sample_photo`, resized so its longest
    side is between ``min_side`` and ``max_side`` pixels, colour-shifted (per-channel gain,
    gamma, brightness, sometimes a hue rotation), sometimes flipped, and encoded once with
    ``cv2.imencode`` at JPEG ``quality``. All encoded bytes live in ONE contiguous uint8 array
    (:attr:`buffer`) indexed by an int64 :attr:`offsets` array, so reading the dataset in a
    forked worker touches no Python objects (copy-on-read safe).

    ``ds[i]`` returns ``(image, label)``: ``image`` is the decoded (H, W, 3) uint8 RGB array,
    or ``transform(image)`` when a transform is given; ``label = i % 10`` (an int).

    The same ``seed`` gives byte-identical JPEGs (for a given OpenCV build); the first k images
    do not depend on ``n``.
    """

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
        show = self.n >= 1000 if progress is None else bool(progress)
        indices: Sequence[int] = range(self.n)
        if show:
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


# --------------------------------------------------------------------------------------------
# ArrayDataset
# --------------------------------------------------------------------------------------------

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
    """A synthetic in-memory dataset: one NumPy array of shape ``(n, *shape)``, random values.

    Integer dtypes hold values 0..255 (clipped to the dtype's range), float dtypes values in
    [0, 1). The array is allocated once and filled deterministically from ``seed``.

    RAM guard: the array may use at most :func:`ram_budget_bytes` ``(ram_fraction)``. When ``n``
    is None the default (``pick(full=10000, quick=512)``) is shrunk to fit and
    :meth:`describe` says so; an explicit ``n`` that does not fit raises
    :class:`RamBudgetError` (a MemoryError and ValueError) before anything is allocated.

    ``ds[i]`` returns ``(torch.from_numpy(array[i]), i % 10)``: the tensor shares memory with
    the dataset (no copy); ``transform(tensor)`` is applied when given.
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
                            f"the share of the available RAM the array may use "
                            f"(default 0.25).") from None
        self.ram_fraction = float(ram_fraction)
        self.item_nbytes = int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize
        self.requested_n = n
        self.shrunk_from: Optional[int] = None

        fix = (f"pass a smaller n, keep dtype=np.uint8 (float32 takes 4x the bytes), use a "
               f"smaller shape, or raise ram_fraction (now {ram_fraction}) if you know the RAM is free")
        if n is None:
            default_n = pick(full=10000, quick=512)
            fits = self.budget_bytes // self.item_nbytes
            if fits < 1:
                raise RamBudgetError(
                    f"{where}: even one sample of shape {self.shape} {self.dtype} "
                    f"({self.item_nbytes:,} bytes) exceeds the RAM budget of "
                    f"{self.budget_bytes:,} bytes ({ram_fraction} of the available RAM); {fix}.")
            if default_n > fits:
                self.shrunk_from = default_n
                n = int(fits)
            else:
                n = default_n
        self.n = check_int("n", n, 1, where)
        need = self.n * self.item_nbytes
        if need > self.budget_bytes:
            raise RamBudgetError(
                f"{where}: n={self.n} samples of shape {self.shape} {self.dtype} would take "
                f"{need:,} bytes ({need / 1e9:.2f} GB), more than the RAM budget of "
                f"{self.budget_bytes:,} bytes ({self.budget_bytes / 1e9:.2f} GB = {ram_fraction} "
                f"of the available RAM); nothing was allocated. To fix it: {fix}.")

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


# --------------------------------------------------------------------------------------------
# LatencyDataset
# --------------------------------------------------------------------------------------------

class LatencyDataset(Dataset):
    """Samples that cost waiting, not CPU: a simulated slow storage or network.

    Every fetch sleeps ``latency_s`` seconds; the first fetch in each process (keyed on
    ``os.getpid()``) also sleeps ``startup_s`` seconds, as a fresh DataLoader worker pays for
    opening files or connections once. Returns ``(uint8 tensor of item_shape, i % 10)``; the
    tensor is filled with ``i % 256``, so tests can check which sample they got.
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
        return (f"LatencyDataset: {self.n} samples of {self.item_shape} uint8, "
                f"{self.latency_s * 1e3:g} ms sleep per sample, {self.startup_s:g} s start-up "
                f"once per process; at most {1 / self.latency_s:.0f} samples/s per worker"
                if self.latency_s > 0 else
                f"LatencyDataset: {self.n} samples of {self.item_shape} uint8, no per-sample "
                f"sleep, {self.startup_s:g} s start-up once per process")

    def __repr__(self) -> str:
        return (f"LatencyDataset(n={self.n}, latency_s={self.latency_s}, "
                f"startup_s={self.startup_s}, item_shape={self.item_shape})")


# --------------------------------------------------------------------------------------------
# transforms
# --------------------------------------------------------------------------------------------

def _check_image(image: Any, where: str) -> np.ndarray:
    if not isinstance(image, np.ndarray):
        raise TypeError(f"{where}: image must be an (H, W, 3) uint8 NumPy array (as the course "
                        f"datasets return), got {type(image).__name__}.")
    if image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"{where}: image must have shape (H, W, 3), got {image.shape}.")
    if image.dtype != np.uint8:
        raise ValueError(f"{where}: image must be uint8, got {image.dtype}.")
    return image


def _check_size(obj: Any, where: str) -> None:
    object.__setattr__(obj, "size", check_int("size", obj.size, 1, where, maximum=8192))


@dataclass(frozen=True)
class CommonRecipeTransform:
    """The common recipe: resize, then per-sample ``float32 / 255``, then a CHW tensor.

    ``cv2.resize`` to ``size`` x ``size`` (bilinear), ``image.astype(np.float32) / 255``,
    ``torch.from_numpy(...).permute(2, 0, 1).contiguous()``. Output: (3, size, size) float32
    in [0, 1], four times the bytes of the uint8 image, made per sample in the worker.
    """

    size: int = 224

    def __post_init__(self) -> None:
        _check_size(self, "CommonRecipeTransform")

    def __call__(self, image: np.ndarray) -> torch.Tensor:
        image = _check_image(image, "CommonRecipeTransform")
        img = cv2.resize(image, (self.size, self.size), interpolation=cv2.INTER_LINEAR)
        x = img.astype(np.float32) / 255
        return torch.from_numpy(x).permute(2, 0, 1).contiguous()


@dataclass(frozen=True)
class ToTensorUint8:
    """The tuned variant: resize, keep ``uint8``, CHW tensor (convert to float later, in batch).

    ``cv2.resize`` to ``size`` x ``size`` (bilinear), then
    ``torch.from_numpy(img).permute(2, 0, 1).contiguous()``. Output: (3, size, size) uint8.
    """

    size: int = 224

    def __post_init__(self) -> None:
        _check_size(self, "ToTensorUint8")

    def __call__(self, image: np.ndarray) -> torch.Tensor:
        image = _check_image(image, "ToTensorUint8")
        img = cv2.resize(image, (self.size, self.size), interpolation=cv2.INTER_LINEAR)
        return torch.from_numpy(img).permute(2, 0, 1).contiguous()
