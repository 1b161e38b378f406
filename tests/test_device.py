"""course_utils.device: one resolve, one synchronize, one pin, one copy."""
from __future__ import annotations

import collections

import pytest
import torch

from course_utils.device import (constants_on, move_to_device, resolve_device, synchronize,
                                 synchronizer, tensors_of, try_pin)

CUDA = torch.cuda.is_available()


def test_resolve_device_names_bad_input():
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match="device='gpu0'"):
        resolve_device("gpu0")
    with pytest.raises(ValueError, match="measures"):
        resolve_device("meta")
    if not CUDA:
        with pytest.raises(ValueError, match="torch.cuda.is_available"):
            resolve_device("cuda")


def test_synchronize_and_synchronizer_on_the_cpu_do_nothing():
    synchronize("cpu")
    assert synchronizer("cpu")() is None and synchronizer(None)() is None
    with pytest.raises(ValueError, match="device="):
        synchronizer("gpu0")
    if not CUDA:
        with pytest.raises(ValueError, match="asks for CUDA"):
            synchronizer("cuda")


def test_try_pin_says_why_not_on_the_cpu():
    pinned, why = try_pin(torch.zeros(4), "cpu")
    assert pinned is None and why


Pair = collections.namedtuple("Pair", "a b")


def test_move_to_device_keeps_the_batch_shape_and_dtypes():
    batch = {"x": torch.zeros(2, dtype=torch.uint8), "pair": Pair(torch.ones(1), [torch.ones(1)]),
             "name": "a"}
    moved = move_to_device(batch, "cpu")
    assert moved["x"].dtype == torch.uint8 and moved["name"] == "a"
    assert isinstance(moved["pair"], Pair) and isinstance(moved["pair"].b, list)
    assert len(list(tensors_of(moved))) == 3


def test_move_to_device_copies_asynchronously_only_from_pinned_memory(monkeypatch):
    seen = []

    class Probe(torch.Tensor):
        def to(self, *args, **kwargs):
            seen.append(kwargs.get("non_blocking"))
            return torch.Tensor.to(torch.Tensor(self), *args, **kwargs)

    t = torch.zeros(3).as_subclass(Probe)
    move_to_device(t, "cpu")                        # pageable: non_blocking would be a no-op
    move_to_device(t, "cpu", non_blocking=True)
    assert seen == [False, True]


def test_constants_on_makes_each_constant_once_per_device(monkeypatch):
    import course_utils.device as device_module
    monkeypatch.setattr(device_module, "_CONSTANTS", {})   # a fresh cache: mutmut runs this twice
    made = []

    def make():
        made.append(1)
        return (torch.tensor([1.0, 2.0]),)

    first = constants_on("cpu", ("test-constant",), make)
    again = constants_on("cpu", ("test-constant",), make)
    assert first[0] is again[0] and len(made) == 1 and torch.equal(first[0], torch.tensor([1.0, 2.0]))
