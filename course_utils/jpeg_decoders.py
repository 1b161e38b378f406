"""JPEG bytes to ``(3, H, W)`` uint8 RGB tensors: TorchCodec's ``decode_jpeg`` (from 0.16, the
``codec`` extra) where it decodes on the device asked for, else torchvision's (deprecated since
0.29), else the CPU's: :func:`tensor_decoder` says which one, and why."""
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
    """The decoder in use: its ``name``, the function, ``why`` a fallback was taken (None when
    none was) and the ``device`` it decodes on (the CPU when the one asked for failed)."""
    name: str
    decode: Callable[..., Any]
    why: str | None = None
    device: str = "cpu"

    def __str__(self) -> str:
        where = "" if self.device == "cpu" else f" on {self.device}"
        return self.name + where + (f" ({self.why})" if self.why else "")


def torchvision_decode_jpeg(data: Encoded, device: Union[str, torch.device] = "cpu") -> Any:
    """torchvision's ``decode_jpeg`` in RGB, its 0.29 deprecation warning silenced."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning, message=".*TorchCodec.*")
        return tvio.decode_jpeg(list(data) if isinstance(data, (list, tuple)) else data,
                                mode=tvio.ImageReadMode.RGB, device=device)


def _torchcodec() -> tuple[str, Callable[..., Any] | None, str | None]:
    """(name, TorchCodec's decode or None, why not) as it loads here."""
    try:
        version = getattr(importlib.import_module("torchcodec"), "__version__", "0")
        decoders = importlib.import_module("torchcodec.decoders")
    except (ImportError, OSError, RuntimeError) as exc:    # not installed, built for another torch, no FFmpeg
        missing = isinstance(exc, ImportError) and "torchcodec" in str(exc)
        return "TorchCodec", None, ("TorchCodec is not installed: pip install -e .[codec]" if missing
                                    else f"TorchCodec did not load beside torch {torch.__version__}: {exc}")
    if tuple(int(p) for p in version.split("+")[0].split(".")[:2] if p.isdigit()) < TORCHCODEC_IMAGE_DECODERS:
        return f"TorchCodec {version}", None, f"TorchCodec {version} predates its image decoders (0.16)"

    def decode(data: Encoded, device: Union[str, torch.device] = "cpu") -> Any:
        return decoders.decode_jpeg(list(data) if isinstance(data, (list, tuple)) else data,
                                    mode="RGB", device=device)
    return f"TorchCodec {version}", decode, None


@lru_cache(maxsize=None)
def tensor_decoder(device: Union[str, torch.device] = "cpu") -> TensorDecoder:
    """The decoder for ``device``: TorchCodec's when it imports, is new enough and decodes a tiny
    JPEG there; else torchvision's; else (torchvision without nvJPEG, TorchCodec without CUDA)
    the CPU's, ``device="cpu"``. ``why`` gives the reason of each fallback."""
    device = str(torch.device(device))
    codec_name, codec, why = _torchcodec()
    why = None if why is None else why.splitlines()[0][:200]
    tried = ([(codec_name, codec)] if codec else []) + [(f"torchvision {torchvision.__version__}",
                                                         torchvision_decode_jpeg)]
    tiny = torch.from_numpy(cv2.imencode(".jpg", np.full((8, 8, 3), 128, np.uint8))[1].reshape(-1).copy())
    for name, decode in tried:                   # some builds load, then fail on first use
        try:                                     # (torchvision decodes on the CPU for "mps")
            if decode(tiny, device=device).device.type == torch.device(device).type:
                return TensorDecoder(name, decode, why, device)
            why = f"{name} cannot decode on {device}"
        except Exception as exc:  # noqa: BLE001 - any failure means: try the next one
            why = f"{name} failed to decode a JPEG on {device}: {str(exc).splitlines()[0][:160]}"
    if device == "cpu":                          # nothing left to fall back to: decoding will say why
        return TensorDecoder(tried[-1][0], torchvision_decode_jpeg, why)
    fallback = tensor_decoder("cpu")
    return TensorDecoder(fallback.name, fallback.decode, f"{why}; decoding on the CPU instead")


def decode_jpeg_tensors(data: Encoded, device: Union[str, torch.device] = "cpu") -> Any:
    """Decode one JPEG (a 1-D uint8 CPU tensor of its bytes) or a list of them (one call) to
    ``(3, H, W)`` uint8 RGB on :func:`tensor_decoder`'s device for ``device`` (a list in, a list out)."""
    decoder = tensor_decoder(device)
    return decoder.decode(data, device=decoder.device)

