"""The loaders learners run, as they are written, and the course's, on the same JPEG files
(``ImageFolder`` layout); workers unpickle these datasets, so they live in the package."""
from __future__ import annotations

import cv2
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset
from torchvision import datasets, transforms

from course_utils.checks import check_folder, check_int
from course_utils.image_ops import IMAGENET_MEAN, IMAGENET_STD
from course_utils.machine import usable_cpus
from course_utils.pipelines import BatchedDecode, keep_batch
from course_utils.threads import make_worker_init

from ..batch_buffers import ReusedSegments
from .storage import FOLDER_HINT, PathLike, folder_files_and_labels, reduced_decode_flag

# IMREAD_COLOR_RGB (OpenCV >= 4.10) decodes straight to RGB: it replaces the IMREAD_COLOR bit
# (both are an error) and keeps a reduced-scale bit (tests/test_recipes.py checks)
_DECODE_RGB = cv2.IMREAD_COLOR_RGB if hasattr(cv2, "IMREAD_COLOR_RGB") else None


def _folder(root: PathLike) -> str:
    return str(check_folder(root, "root", FOLDER_HINT))


def seed_recipe_loader(root: PathLike, *, batch_size: int = 64, size: int = 224) -> DataLoader:
    """The seed recipe's loader over the JPEG folder ``root`` (the recipe this course started
    from; run it inside :class:`recipe_process_settings`). Batches: float32 (N, 3, size, size) in [0, 1]."""
    transform = transforms.Compose([transforms.Resize((size, size)), transforms.ToTensor()])
    dataset = datasets.ImageFolder(_folder(root), transform)
    return DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=4, pin_memory=True)


def imagenet_recipe_loader(root: PathLike, *, batch_size: int = 64, size: int = 224) -> DataLoader:
    """pytorch/examples' ImageNet training loader, as written, over the JPEG folder ``root``.
    Only its batch size (256 in ``imagenet/main.py``) is a parameter. Batches: float32 (N, 3, size,
    size), normalised with the ImageNet mean and std."""
    normalize = transforms.Normalize(mean=IMAGENET_MEAN, std=IMAGENET_STD)
    train_dataset = datasets.ImageFolder(
        _folder(root),
        transforms.Compose([
            transforms.RandomResizedCrop(size),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            normalize,
        ]))
    return DataLoader(train_dataset, batch_size=batch_size, shuffle=True, num_workers=4, pin_memory=True)


class _JpegFiles(Dataset):
    """Every JPEG file under ``root``, labelled as ``ImageFolder`` labels them."""

    def __init__(self, root: PathLike) -> None:
        files, labels = folder_files_and_labels(root)
        if not files:
            raise ValueError(f"{type(self).__name__}: root={str(root)!r} has no .jpg/.jpeg files; pass a "
                             f"folder of JPEG files.")
        self.paths = np.array(files)      # no Python objects: copy-on-read safe
        self.labels = np.array(labels, dtype=np.int64)

    def __len__(self) -> int:
        return int(self.paths.shape[0])

    def _read(self, index: int) -> np.ndarray:
        return np.fromfile(str(self.paths[index]), dtype=np.uint8)


class BatchedJpegFiles(_JpegFiles, ReusedSegments, BatchedDecode):
    """The course's tuned dataset on files: ``__getitems__`` returns (N x 3 x size x size uint8,
    labels) in channels_last memory on reused shared segments (``collate_fn=keep_batch``);
    ``reduced``: decode at the smallest scale that keeps ``size``."""

    def __init__(self, root: PathLike, size: int = 224, *, reduced: bool = True) -> None:
        super().__init__(root)
        self.size = check_int("size", size, 1, "BatchedJpegFiles")
        self.reduced = bool(reduced)

    def _decode_into(self, index: int, out: np.ndarray) -> None:
        raw, side, rgb = self._read(index), (self.size, self.size), _DECODE_RGB is not None
        flag = reduced_decode_flag(raw, self.size) if self.reduced else cv2.IMREAD_COLOR
        image = cv2.imdecode(raw, (flag & ~cv2.IMREAD_COLOR) | _DECODE_RGB if rgb else flag)
        if image is None:
            raise ValueError(f"BatchedJpegFiles: OpenCV could not decode {self.paths[index]!s}.")
        if rgb:                          # OpenCV >= 4.10 decoded straight to RGB
            cv2.resize(image, side, dst=out, interpolation=cv2.INTER_LINEAR)
        else:
            small = cv2.resize(image, side, interpolation=cv2.INTER_LINEAR)
            cv2.cvtColor(small, cv2.COLOR_BGR2RGB, dst=out)

    def _labels(self, indices: list[int]) -> torch.Tensor:
        return torch.as_tensor(self.labels[np.asarray(indices)], dtype=torch.int64)


class DecodeOnlyFiles(_JpegFiles):
    """Read and decode each file at full size, nothing more: ``__getitems__`` returns
    (pixels decoded per image, labels), so no batch is built or sent. The decode ceiling."""

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        pixels = [cv2.imdecode(self._read(index), cv2.IMREAD_COLOR).size for index in indices]
        return torch.tensor(pixels), torch.as_tensor(self.labels[np.asarray(indices)])


def files_loader(dataset: Dataset, *, batch_size: int = 64, num_workers: int | None = None,
                 shuffle: bool = True) -> DataLoader:
    """A DataLoader over a batched dataset (``collate_fn=keep_batch``): by default one worker per
    usable CPU, each pool at 1 thread in them, ``pin_memory`` only with CUDA."""
    workers = usable_cpus() if num_workers is None else check_int(
        "num_workers", num_workers, 0, "files_loader", " Pass None for the usable CPUs.")
    return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, collate_fn=keep_batch,
                      num_workers=workers, pin_memory=torch.cuda.is_available(),
                      worker_init_fn=make_worker_init(1) if workers else None)


def tuned_files_loader(root: PathLike, *, batch_size: int = 64, size: int = 224,
                       num_workers: int | None = None) -> DataLoader:
    """The course's tuned pipeline over the JPEG folder ``root`` (lessons 01-03: batched fetch,
    reduced-scale decode, uint8 batches; crops, flips and floats later, on the device)."""
    return files_loader(BatchedJpegFiles(root, size), batch_size=batch_size, num_workers=num_workers)
