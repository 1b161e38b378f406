"""JPEG bytes to ``(3, H, W)`` uint8 RGB tensors: TorchCodec's ``decode_jpeg`` (from 0.16, on the
CPU and with nvJPEG on CUDA; the optional ``codec`` extra, built for this torch) where it loads,
else torchvision's (deprecated since 0.29 in TorchCodec's favour). :func:`tensor_decoder` says
which one this process uses and, for the fallback, why."""
from __future__ import annotations

import importlib
import warnings
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Sequence, Union

import cv2
import numpy as np
import torch
import torchvision
from torchvision import io as tvio

__all__ = ["TensorDecoder", "decode_jpeg_tensors", "tensor_decoder", "torchvision_decode_jpeg"]

#: the TorchCodec version that has the image decoders torchvision 0.29 points to
TORCHCODEC_IMAGE_DECODERS = (0, 16)
Encoded = Union[torch.Tensor, Sequence[torch.Tensor]]


@dataclass(frozen=True)
class TensorDecoder:
    """The JPEG decoder in use: its ``name`` (library and version), the function, and ``why``
    a fallback was taken (None when TorchCodec is the one in use)."""
    name: str
    decode: Callable[..., Any]
    why: str | None = None

    def __str__(self) -> str:
        return self.name if self.why is None else f"{self.name} ({self.why})"


def torchvision_decode_jpeg(data: Encoded, device: Union[str, torch.device] = "cpu") -> Any:
    """torchvision's ``decode_jpeg`` in RGB, its 0.29 deprecation warning silenced."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning, message=".*TorchCodec.*")
        return tvio.decode_jpeg(list(data) if isinstance(data, (list, tuple)) else data,
                                mode=tvio.ImageReadMode.RGB, device=device)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("+")[0].split(".")[:2] if part.isdigit())


@lru_cache(maxsize=1)
def tensor_decoder() -> TensorDecoder:
    """TorchCodec's ``decode_jpeg`` when it imports, is new enough and decodes a tiny JPEG here;
    else torchvision's, with the reason."""
    fallback = f"torchvision {torchvision.__version__}"
    try:
        codec = importlib.import_module("torchcodec")
        decoders = importlib.import_module("torchcodec.decoders")
    except ImportError as exc:
        why = ("TorchCodec is not installed: pip install -e .[codec]" if "torchcodec" in str(exc)
               else f"TorchCodec did not load beside torch {torch.__version__}: {exc}")
        return TensorDecoder(fallback, torchvision_decode_jpeg, why.splitlines()[0][:200])
    except (OSError, RuntimeError) as exc:       # a build for another torch, or no FFmpeg
        return TensorDecoder(fallback, torchvision_decode_jpeg,
                             f"TorchCodec did not load beside torch {torch.__version__}: "
                             f"{str(exc).splitlines()[0][:160]}")
    version = getattr(codec, "__version__", "0")
    if _version(version) < TORCHCODEC_IMAGE_DECODERS:
        return TensorDecoder(fallback, torchvision_decode_jpeg,
                             f"TorchCodec {version} predates its image decoders (0.16)")

    def decode(data: Encoded, device: Union[str, torch.device] = "cpu") -> Any:
        return decoders.decode_jpeg(list(data) if isinstance(data, (list, tuple)) else data,
                                    mode="RGB", device=device)

    try:                                         # some builds load, then fail on first use
        decode(_tiny_jpeg())
    except Exception as exc:  # noqa: BLE001 - any failure means: use torchvision's
        return TensorDecoder(fallback, torchvision_decode_jpeg,
                             f"TorchCodec {version} failed to decode a JPEG here: "
                             f"{str(exc).splitlines()[0][:160]}")
    return TensorDecoder(f"TorchCodec {version}", decode)


def _tiny_jpeg() -> torch.Tensor:
    """The bytes of an 8x8 JPEG, as a 1-D uint8 tensor."""
    _, buf = cv2.imencode(".jpg", np.full((8, 8, 3), 128, dtype=np.uint8))
    return torch.from_numpy(buf.reshape(-1).copy())


def decode_jpeg_tensors(data: Encoded, device: Union[str, torch.device] = "cpu") -> Any:
    """Decode one JPEG (a 1-D uint8 CPU tensor of its bytes) or a list of them to ``(3, H, W)``
    uint8 RGB on ``device``, with :func:`tensor_decoder`'s decoder (a list in, a list out)."""
    return tensor_decoder().decode(data, device=device)
