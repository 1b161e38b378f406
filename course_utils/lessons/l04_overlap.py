"""Lesson 04's compute stand-in of a chosen length, which exercise 04's grader and gpu-check's
prefetcher step use too: :func:`calibrated_compute`, a chain of float32 matmuls
(:class:`MatmulChain`). The lesson writes its overlap measurements in its cells."""
from __future__ import annotations

import math
import statistics

import torch

from ..timing import time_op

__all__ = ["MatmulChain", "calibrated_compute"]


class MatmulChain:
    """``k`` products of two n x n float32 matrices on ``device``; a call queues them and returns
    the output tensor."""

    def __init__(self, device: torch.device, n: int, k: int = 1) -> None:
        gen = torch.Generator().manual_seed(0)
        self.a = torch.randn(n, n, generator=gen).to(device)
        self.b = torch.randn(n, n, generator=gen).to(device) / math.sqrt(n)
        self.c = torch.empty(n, n, device=device)
        self.n, self.k = n, k

    def __call__(self) -> torch.Tensor:
        for _ in range(self.k):
            torch.mm(self.a, self.b, out=self.c)
        return self.c

    def describe(self) -> str:
        """What the chain computes, e.g. ``"12 x matmul(2048x2048, float32)"``."""
        return f"{self.k} x matmul({self.n}x{self.n}, float32)"


def calibrated_compute(dev: torch.device, target_s: float, n: int | None = None,
                       max_k: int = 4000) -> MatmulChain:
    """A matmul chain taking about ``target_s`` seconds on ``dev``: one product is timed (median
    of 5, with the device synchronised), and the chain gets as many as fill ``target_s``."""
    if n is None:
        n = 2048 if dev.type == "cuda" else 256
    chain = MatmulChain(dev, n, 1)
    one = statistics.median(time_op(chain, device=dev, repeats=5, warmup=2, events=False))
    chain.k = int(min(max_k, max(1, round(target_s / max(one, 1e-7)))))
    return chain
