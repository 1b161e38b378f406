"""Lesson 04's compute stand-in (course_utils/lessons/l04_overlap.py), timed by a stand-in clock:
the chain gets as many products as fill the target (rounded, at least 1, at most max_k), one
product timed as the median of 5 after 2 warm-ups; the chain is seeded, scaled and computes a @ b
into its own output."""
from __future__ import annotations

import math

import pytest
import torch

from course_utils.lessons import l04_overlap as L


def fake_clock(monkeypatch, seconds):
    calls = []

    def time_op(fn, *, device, repeats, warmup, events):
        calls.append(dict(device=device, repeats=repeats, warmup=warmup, events=events, n=fn.n, k=fn.k))
        return seconds
    monkeypatch.setattr(L, "time_op", time_op)
    return calls


@pytest.mark.parametrize("times, target, k", [
    ([0.003, 0.001, 0.002, 0.010, 0.002], 0.05, 25),    # median 0.002 (not the mean 0.0036): 25
    ([0.004] * 5, 0.05, 12),                              # 12.5 rounds to 12
    ([0.5] * 5, 0.05, 1),                                 # less than one product: still 1
    ([1e-9] * 5, 0.05, 4000)])                            # capped at max_k
def test_the_chain_holds_as_many_products_as_fill_the_target(monkeypatch, times, target, k):
    calls = fake_clock(monkeypatch, times)
    chain = L.calibrated_compute(torch.device("cpu"), target)
    assert chain.k == k and chain.n == 256                # 256 x 256 off CUDA
    assert calls == [dict(device=torch.device("cpu"), repeats=5, warmup=2, events=False, n=256, k=1)]


def test_a_size_and_a_cap_given_are_used(monkeypatch):
    fake_clock(monkeypatch, [1e-6] * 5)
    chain = L.calibrated_compute(torch.device("cpu"), 1.0, n=16, max_k=7)
    assert (chain.n, chain.k) == (16, 7) and chain.describe() == "7 x matmul(16x16, float32)"


def test_the_chain_is_seeded_scaled_and_computes_into_its_output():
    chain = L.MatmulChain(torch.device("cpu"), 32)
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(32, 32, generator=gen)
    b = torch.randn(32, 32, generator=gen) / math.sqrt(32)
    assert chain.k == 1 and torch.equal(chain.a, a) and torch.equal(chain.b, b)
    out = chain()
    assert out is chain.c and out.shape == (32, 32) and torch.allclose(out, a @ b, atol=1e-5)
    chain.k = 3                                          # the same product, three times over
    assert torch.allclose(chain(), a @ b, atol=1e-5)
