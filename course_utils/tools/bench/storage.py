"""Images as files on disk, the way learners keep them: :func:`write_image_folder` (the
``ImageFolder`` layout), read cold (:func:`evict_from_page_cache`) or packed: :class:`PackedStore`,
the FFCV idea, every image decoded and resized once into one uint8 file read back through
``np.memmap`` (workers unpickle its dataset, so it lives in the package)."""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Sequence, Union

import cv2
import numpy as np
import torch
from torch.utils.data import Dataset

from course_utils.checks import check_folder, check_int
from course_utils.data import JpegDataset

PathLike = Union[str, os.PathLike]
MARKER = ".course_folder.json"
FOLDER_HINT = ("pass a folder of class sub-folders of JPEG files (ImageFolder layout), e.g. "
               "course_utils.tools.bench.storage.write_image_folder(JpegDataset()).")
# JPEG start-of-frame markers (baseline, extended, progressive, lossless, ... ; not DHT/JPG/DAC)
_SOF_MARKERS = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
_REDUCED = ((8, cv2.IMREAD_REDUCED_COLOR_8), (4, cv2.IMREAD_REDUCED_COLOR_4), (2, cv2.IMREAD_REDUCED_COLOR_2))


def write_image_folder(base: JpegDataset, root: PathLike | None = None) -> Path:
    """Write ``base``'s JPEG bytes as ``root/c<label>/<index:06d>.jpg``; return the folder (default
    ``<temp dir>/feed-the-gpu/jpegs-<settings>``, reused when it holds the same dataset). Files are
    fsynced (their pages can be evicted) into a sibling folder renamed into place: no half folders."""
    if not isinstance(base, JpegDataset):
        raise TypeError(f"base must be a course JpegDataset (its .encoded(i) bytes are written), "
                        f"got {type(base).__name__}.")
    settings = {"n": base.n, "seed": base.seed, "quality": base.quality,
                "min_side": base.min_side, "max_side": base.max_side, "nbytes": base.nbytes}
    if root is None:
        name = "jpegs-" + "-".join(f"{k}{v}" for k, v in settings.items())
        root = Path(tempfile.gettempdir()) / "feed-the-gpu" / name
    root = Path(root).expanduser()
    marker = root / MARKER
    if marker.exists() and json.loads(marker.read_text()) == settings:
        return root
    if root.exists() and any(root.iterdir()):
        raise FileExistsError(f"root={str(root)!r} is not empty (or holds another dataset's "
                              f"folder); pass a new or empty folder.")
    root.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=root.name + ".writing-", dir=root.parent))
    try:
        for label in np.unique(base.labels):
            (staging / f"c{int(label)}").mkdir()
        for i in range(base.n):
            path = staging / f"c{int(base.labels[i])}" / f"{i:06d}.jpg"
            with open(path, "wb") as fh:
                fh.write(base.encoded(i).tobytes())
                fh.flush()
                os.fsync(fh.fileno())
        (staging / MARKER).write_text(json.dumps(settings))
        if root.exists():
            root.rmdir()
        try:
            os.rename(staging, root)
        except OSError:   # another process finished the same folder first
            if not (marker.exists() and json.loads(marker.read_text()) == settings):
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return root


def image_files(root: PathLike) -> list[Path]:
    """Every ``.jpg``/``.jpeg`` file under ``root`` (recursive), sorted by path."""
    root = check_folder(root, "root", FOLDER_HINT)
    return sorted(p for p in root.rglob("*") if p.suffix.lower() in (".jpg", ".jpeg") and p.is_file())


def folder_files_and_labels(root: PathLike) -> tuple[list[str], list[int]]:
    """The JPEG files under ``root`` (sorted) and their labels, numbered as ``ImageFolder``
    numbers its classes (sorted sub-folder names)."""
    files = image_files(root)
    index = {name: k for k, name in enumerate(sorted({f.parent.name for f in files}))}
    return [str(f) for f in files], [index[f.parent.name] for f in files]


def jpeg_size(data: bytes | np.ndarray) -> tuple[int, int] | None:
    """(height, width) from a JPEG's start-of-frame header, or None if none is found (no decode)."""
    buf = memoryview(data.reshape(-1) if isinstance(data, np.ndarray) else data)
    if len(buf) < 4 or buf[0] != 0xFF or buf[1] != 0xD8:
        return None
    i = 2
    while i + 9 < len(buf):
        if buf[i] != 0xFF:
            return None
        marker = buf[i + 1]
        if marker == 0xFF:          # fill byte
            i += 1
            continue
        length = (buf[i + 2] << 8) | buf[i + 3]
        if marker in _SOF_MARKERS:
            return (buf[i + 5] << 8) | buf[i + 6], (buf[i + 7] << 8) | buf[i + 8]
        i += 2 + length
    return None


def reduced_decode_flag(data: bytes | np.ndarray, size: int) -> int:
    """The ``cv2.imdecode`` flag that decodes at 1/8, 1/4 or 1/2 scale while the shorter side
    stays >= ``size`` pixels; ``cv2.IMREAD_COLOR`` (full size) when none fits or the header is
    unreadable. libjpeg scales during the inverse DCT, so a reduced decode is much cheaper."""
    short = min(jpeg_size(data) or (0,))
    return next((flag for factor, flag in _REDUCED if short // factor >= size), cv2.IMREAD_COLOR)


def evict_from_page_cache(paths: Sequence[PathLike]) -> bool:
    """Ask the OS to drop the cached pages of ``paths`` (``fsync``, then ``posix_fadvise
    DONTNEED``); False where Python has no ``posix_fadvise`` (macOS, Windows). A VM's host may
    still cache the disk: "cold" is measured, not assumed."""
    if not hasattr(os, "posix_fadvise"):
        return False
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return True


class PackedStore:
    """One uint8 ``.npy`` file of decoded, resized images (N x S x S x 3, RGB) and a
    ``.labels.npy``, read back as a memory-mapped gather (no decode, pages shared by every
    worker). The price: the decoded bytes on disk, and no crop of the full-size original."""

    def __init__(self, path: PathLike) -> None:
        self.path = Path(path)
        if not self.path.exists():
            raise FileNotFoundError(f"path={str(self.path)!r}: no packed store there; write one "
                                    f"with PackedStore.write(base, path, size).")

    @classmethod
    def write(cls, base: JpegDataset, path: PathLike, size: int = 224) -> "PackedStore":
        """Decode and resize every image of ``base`` once into a new store at ``path``."""
        size = check_int("size", size, 1, "PackedStore.write")
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        images = np.lib.format.open_memmap(path, mode="w+", dtype=np.uint8, shape=(len(base), size, size, 3))
        for i in range(len(base)):
            bgr = cv2.imdecode(base.encoded(i), reduced_decode_flag(base.encoded(i), size))
            small = cv2.resize(bgr, (size, size), interpolation=cv2.INTER_AREA)
            cv2.cvtColor(small, cv2.COLOR_BGR2RGB, dst=images[i])
        images.flush()
        del images
        np.save(path.with_suffix(".labels.npy"), np.asarray(base.labels, dtype=np.int64))
        return cls(path)

    @property
    def nbytes(self) -> int:
        """Size of the image file on disk, in bytes."""
        return self.path.stat().st_size

    def dataset(self, in_memory: bool = False) -> "PackedStoreDataset":
        """The store as a batched dataset: memory-mapped, or (``in_memory=True``) loaded into RAM."""
        return PackedStoreDataset(self.path, in_memory=in_memory)


class PackedStoreDataset(Dataset):
    """Batches gathered from a :class:`PackedStore`: ``__getitems__`` returns (N x 3 x S x S uint8,
    labels) in channels_last memory (``collate_fn=keep_batch``); memory-mapped in each worker, or
    (``in_memory=True``) read into RAM first: the gather a memmap is compared with."""

    def __init__(self, path: PathLike, in_memory: bool = False) -> None:
        self.path, self.in_memory = str(path), bool(in_memory)
        self.labels = np.load(Path(path).with_suffix(".labels.npy"))
        self._images: Any = np.load(self.path) if self.in_memory else None

    def _array(self) -> np.ndarray:
        if self._images is None:
            self._images = np.load(self.path, mmap_mode="r")
        return self._images

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        if not self.in_memory:
            state["_images"] = None     # each worker maps the file itself
        return state

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        batch = np.ascontiguousarray(self._array()[np.asarray(indices)])
        return (torch.from_numpy(batch).permute(0, 3, 1, 2),
                torch.as_tensor(self.labels[np.asarray(indices)], dtype=torch.int64))

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        images, labels = self.__getitems__([index])
        return images[0].contiguous(), int(labels[0])
