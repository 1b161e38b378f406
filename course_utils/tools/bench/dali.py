"""NVIDIA DALI beside the DataLoader: the ImageNet recipe as a DALI pipeline (lesson 05's deep
dive 11 writes it out; ``bench`` runs it as a row of its own), in this process on ``num_threads``
C++ threads, on the recipes' ImageFolder JPEGs, the random resized crop given to the decoder as a
region of interest. ``device="cpu"``: all on the CPU threads (libjpeg-turbo decodes); ``"mixed"``:
where the GPU has a hardware JPEG engine, a share ``hw_decoder_load`` of each batch's images (0.65
by default in DALI 2.4) decodes on it, the rest in nvJPEG's CUDA decoder (parsing and Huffman on
the CPU threads, the rest on the GPU); then the GPU. DALI is an optional extra (``pip install
.[dali]``, Linux x86_64 and aarch64 only): :func:`dali_missing` says why it cannot run here."""
from __future__ import annotations

import importlib
import importlib.util
import math
import platform
from typing import Any, Iterator, Sequence

import torch

from course_utils.checks import check_int
from course_utils.image_ops import IMAGENET_MEAN, IMAGENET_STD

from .storage import folder_files_and_labels

__all__ = ["DALI_DEVICES", "DaliLoader", "dali_missing", "folder_files_and_labels"]

#: where the pipeline runs: everything on the CPU, or nvJPEG decode + GPU augmentation
DALI_DEVICES = ("cpu", "mixed")


def dali_missing() -> str | None:
    """None when DALI can run here, else one sentence saying why not and what to do."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "aarch64"):
        return (f"NVIDIA DALI has wheels for Linux x86_64 and aarch64 only; this is "
                f"{platform.system()} {platform.machine()}.")
    if importlib.util.find_spec("nvidia.dali") is None:
        return "NVIDIA DALI is not installed: pip install -e .[dali] (make lab and make test do)."
    return None


class DaliLoader:
    """Batches of the ImageNet recipe from DALI, iterated like a DataLoader: ``(images, labels)``,
    float32 ``(N, 3, size, size)`` and int64 ``(N,)`` torch tensors (on the GPU for ``mixed``). The
    pipeline is built on the first ``iter()`` and kept (like ``persistent_workers=True``): each
    ``iter()`` yields ``len(self)`` batches from where the last stopped (DALI cannot restart an epoch)."""

    def __init__(self, files: Sequence[str], labels: Sequence[int], *, batch_size: int = 64,
                 size: int = 224, num_threads: int = 2, device: str = "cpu", seed: int = 0) -> None:
        if len(files) != len(labels) or not files:
            raise ValueError(f"DaliLoader: files and labels must be two lists of the same, "
                             f"non-zero length; got {len(files)} files and {len(labels)} labels.")
        if device not in DALI_DEVICES:
            raise ValueError(f"DaliLoader: device={device!r}; use 'cpu' (everything on the CPU) "
                             f"or 'mixed' (nvJPEG decode and GPU augmentation, needs CUDA).")
        self.files, self.labels = list(files), list(labels)
        self.batch_size = check_int("batch_size", batch_size, 1, "DaliLoader")
        self.size = check_int("size", size, 8, "DaliLoader")
        self.num_threads = check_int("num_threads", num_threads, 1, "DaliLoader")
        self.device, self.seed = device, seed
        self._iterator: Any = None

    def __len__(self) -> int:
        return math.ceil(len(self.files) / self.batch_size)

    def _start(self) -> Any:
        """The pipeline (lesson 05 writes the same one out) and its iterator."""
        why = dali_missing()
        if why:
            raise RuntimeError(why)
        dali, plugin = (importlib.import_module(m) for m in ("nvidia.dali", "nvidia.dali.plugin.pytorch"))
        fn, types, size = dali.fn, dali.types, self.size

        @dali.pipeline_def(batch_size=self.batch_size, num_threads=self.num_threads,
                           device_id=0 if self.device == "mixed" else None, seed=self.seed)
        def recipe() -> Any:
            # pad_last_batch: an epoch's last batch is filled with its last sample (the iterator
            # drops the padding), so the next epoch starts at a clean boundary, every file once
            jpegs, label = fn.readers.file(files=self.files, labels=self.labels,
                                           random_shuffle=True, pad_last_batch=True, name="reader")
            images = fn.decoders.image_random_crop(jpegs, device=self.device, output_type=types.RGB,
                                                   random_area=[0.08, 1.0],   # RandomResizedCrop's
                                                   random_aspect_ratio=[3 / 4, 4 / 3])
            images = fn.resize(images, resize_x=size, resize_y=size)
            images = fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW",
                                              mean=[255 * m for m in IMAGENET_MEAN],
                                              std=[255 * s for s in IMAGENET_STD],
                                              mirror=fn.random.coin_flip(probability=0.5))
            return images, label

        return plugin.DALIGenericIterator(recipe(), ["images", "labels"], reader_name="reader",
                                          last_batch_policy=plugin.LastBatchPolicy.PARTIAL, auto_reset=True)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if self._iterator is None:
            self._iterator = self._start()
        for _ in range(len(self)):
            try:
                out = next(self._iterator)
            except StopIteration:                 # an epoch ended; auto_reset began the next
                out = next(self._iterator)
            yield out[0]["images"], out[0]["labels"].reshape(-1).long()

    def __repr__(self) -> str:
        return (f"DaliLoader({len(self.files)} files, batch_size={self.batch_size}, size={self.size}, "
                f"num_threads={self.num_threads}, device={self.device!r})")
