"""The learner's own images: :class:`ImageFolderDataset` (sub-folders as classes) and the damage
check (:func:`image_damage`) that leaves truncated or fake images out before a worker meets one."""
from __future__ import annotations

import copy
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, Union

import cv2
import numpy as np
from torch.utils.data import Dataset

from .checks import check_folder, check_index, check_transform
from .data import decode_jpeg

__all__ = ["IMAGE_EXTENSIONS", "image_damage", "ImageFolderDataset"]

IMAGE_EXTENSIONS: tuple[str, ...] = (".jpg", ".jpeg", ".png", ".bmp", ".webp")
_CHECK_THREADS = 8   # image_damage runs this many files at once (OpenCV releases the GIL)


def _jpeg_is_truncated(buf: bytes) -> bool:
    """True when the JPEG in ``buf`` stops before its main image's end marker (headers walked by
    their lengths to the first start-of-scan, so an EXIF thumbnail inside one is stepped over)."""
    pos = 2
    while pos + 4 <= len(buf):
        if buf[pos] != 0xFF:
            return False                      # not a structure this reads: the decoder judges
        marker = buf[pos + 1]
        if marker == 0xFF:                    # fill byte
            pos += 1
        elif marker == 0xDA:                  # start of scan
            return buf.find(b"\xff\xd9", pos) < 0
        elif marker == 0xD9:
            return False
        elif 0xD0 <= marker <= 0xD7 or marker == 0x01:
            pos += 2
        else:
            pos += 2 + int.from_bytes(buf[pos + 2:pos + 4], "big")
    return True                               # the file ends inside its headers


def image_damage(file: Union[str, os.PathLike]) -> Optional[str]:
    """Why ``file`` cannot be used as an image, in a few words, or None when it is fine: a JPEG
    must reach its end marker and OpenCV must decode it (JPEGs at 1/8 scale, to be cheap)."""
    try:
        buf = Path(file).read_bytes()
    except OSError as exc:
        return f"cannot be read: {exc.strerror or exc}"
    if not buf:
        return "empty file"
    flag = cv2.IMREAD_COLOR
    if buf[:3] == b"\xff\xd8\xff":
        if _jpeg_is_truncated(buf):
            return "truncated JPEG"
        flag = cv2.IMREAD_REDUCED_COLOR_8
    try:
        img = cv2.imdecode(np.frombuffer(buf, dtype=np.uint8), flag)
    except cv2.error:
        img = None
    return None if img is not None and img.size else "OpenCV cannot decode it"


class ImageFolderDataset(Dataset):
    """Every image file under ``path`` (recursive, hidden ones skipped), decoded to (H, W, 3) uint8
    RGB, labelled by its parent folder's index in :attr:`classes` (``"."`` for ``path`` itself).
    ``skip_damaged=True`` leaves damaged files out, listed in :attr:`damaged` as ``(path, why)``.
    """

    def __init__(self, path: Union[str, os.PathLike], transform: Optional[Callable] = None,
                 extensions: Sequence[str] = IMAGE_EXTENSIONS, *,
                 skip_damaged: bool = False) -> None:
        where = f"ImageFolderDataset(path={str(path)!r})"
        extensions = (extensions,) if isinstance(extensions, str) else tuple(extensions)
        if not extensions or not all(isinstance(e, str) and e.strip(".") for e in extensions):
            raise ValueError(f"{where}: extensions must be file endings such as "
                             f"('.jpg', '.png'), got {extensions!r}.")
        self.extensions = tuple("." + e.lower().lstrip(".") for e in extensions)
        self.transform = check_transform(transform, "ImageFolderDataset")

        self.root = root = check_folder(path, "ImageFolderDataset: path", "pass the folder that "
                                        "holds your images.")
        files: list[Path] = []
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            files += [Path(dirpath) / name for name in filenames
                      if not name.startswith(".") and os.path.splitext(name)[1].lower() in self.extensions]
        if not files:
            raise ValueError(f"{where}: no images found ending in {', '.join(self.extensions)}; "
                             f"put your images there or pass extensions=... to match your files.")
        files.sort(key=lambda p: p.relative_to(root).as_posix())
        self.checked: bool = bool(skip_damaged)
        self.damaged: list[tuple[str, str]] = []
        if skip_damaged:
            log = cv2.utils.logging
            level = log.getLogLevel()
            log.setLogLevel(log.LOG_LEVEL_ERROR)   # damaged files are summed up in self.damaged
            try:
                with ThreadPoolExecutor(min(_CHECK_THREADS, os.cpu_count() or 1)) as pool:
                    why = list(pool.map(image_damage, files))
            finally:
                log.setLogLevel(level)
            self.damaged = [(str(p), w) for p, w in zip(files, why) if w is not None]
            files = [p for p, w in zip(files, why) if w is None]

        def class_of(p: Path) -> str:
            return "." if p.parent == root else p.parent.name

        self.classes: list[str] = sorted({class_of(p) for p in files})
        index = {c: k for k, c in enumerate(self.classes)}
        self.paths: np.ndarray = np.array([str(p) for p in files])  # fixed-width str array
        self.labels: np.ndarray = np.array([index[class_of(p)] for p in files], dtype=np.int64)

    def __len__(self) -> int:
        return int(self.paths.shape[0])

    def __getitem__(self, i: int) -> tuple[Any, int]:
        i = check_index(i, len(self), "ImageFolderDataset")
        file = str(self.paths[i])
        try:
            image = decode_jpeg(np.fromfile(file, dtype=np.uint8))
        except (OSError, ValueError, cv2.error) as exc:
            raise ValueError(f"ImageFolderDataset: could not read or decode {file!r} (sample {i}: "
                             f"{exc}); remove or convert it, or pass skip_damaged=True to leave "
                             f"damaged files out.") from exc
        return (image if self.transform is None else self.transform(image)), int(self.labels[i])

    def with_transform(self, transform: Optional[Callable]) -> "ImageFolderDataset":
        """The same files and labels (no new scan or check), read through ``transform``."""
        clone = copy.copy(self)
        clone.transform = check_transform(transform, "ImageFolderDataset.with_transform")
        return clone

    def damaged_summary(self) -> str:
        """One line: how many damaged files were skipped and the first three (relative paths)."""
        if not self.damaged:
            return "no damaged files skipped" if self.checked else "files not checked"
        shown = ", ".join(f"{os.path.relpath(p, self.root)} ({why})" for p, why in self.damaged[:3])
        more = f" and {len(self.damaged) - 3} more" if len(self.damaged) > 3 else ""
        return f"skipped {len(self.damaged)} damaged file(s): {shown}{more}"

    def describe(self) -> str:
        """One line: number of images and classes, and the folder."""
        skipped = f" ({len(self.damaged)} damaged files skipped)" if self.damaged else ""
        return (f"ImageFolderDataset: {len(self)} images in {len(self.classes)} class(es) "
                f"{self.classes[:5]}{'...' if len(self.classes) > 5 else ''} under "
                f"{str(self.root)!r}{skipped}")

    def __repr__(self) -> str:
        check = ", skip_damaged=True" if self.checked else ""
        return (f"ImageFolderDataset(path={str(self.root)!r}, transform={self.transform!r}, "
                f"extensions={self.extensions!r}{check})")
