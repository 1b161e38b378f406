"""course_utils.device and course_utils.lessons.l04_copies: which device is resolved and
waited for (the CUDA and MPS calls replaced by recorders, so their branches run here), when a
copy is asynchronous, the constants cache's size limit, and the bandwidth sweep's figures
(best, best pinned, pinned over best, ratios) on hand-made GB/s."""
from __future__ import annotations

import collections

import pytest
import torch

from course_utils import device as device_mod
from course_utils.device import (constants_on, move_to_device, resolve_device, synchronize,
                                 synchronizer, tensors_of, try_pin)
from course_utils.lessons.l04_copies import (GIB, H2D_MODES, KIB, MIB, MODES, BandwidthSweep,
                                             CopyMode, fmt_bytes)

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def fake_accelerators(monkeypatch):
    """CUDA and MPS 'available', their synchronize calls recorded instead of run."""
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda dev=None: calls.append(("cuda", dev)))
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    monkeypatch.setattr(torch.mps, "synchronize", lambda: calls.append(("mps", None)))
    return calls


# --- resolve_device -----------------------------------------------------------------------------

def test_resolve_device_none_is_the_machines_default(monkeypatch):
    monkeypatch.setattr(device_mod, "default_device", lambda: torch.device("meta"))
    assert resolve_device(None) == torch.device("meta")
    assert resolve_device() == torch.device("meta")


def test_resolve_device_meta_only_when_allowed():
    assert resolve_device("meta", allow_meta=True) == torch.device("meta")
    with pytest.raises(ValueError, match="cpu, cuda, mps only"):
        resolve_device("meta")
    with pytest.raises(ValueError, match="cpu, cuda, mps, meta only"):
        resolve_device("xpu", allow_meta=True)


def test_resolve_device_refuses_absent_accelerators(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    with pytest.raises(ValueError, match="CUDA"):
        resolve_device("cuda:0")
    with pytest.raises(ValueError, match="MPS"):
        resolve_device("mps")
    with pytest.raises(ValueError, match="not a device torch understands"):
        resolve_device(1.5)
    assert resolve_device(torch.device("cpu")) == torch.device("cpu")


def test_resolve_device_accepts_present_accelerators(fake_accelerators):
    assert resolve_device("cuda:1") == torch.device("cuda:1")
    assert resolve_device("mps") == torch.device("mps")


# --- synchronize, synchronizer -------------------------------------------------------------------

def test_synchronize_waits_for_the_device_asked_for(fake_accelerators):
    synchronize("cuda:1")
    synchronize("mps")
    synchronize("cpu")
    synchronize("meta")
    assert fake_accelerators == [("cuda", torch.device("cuda:1")), ("mps", None)]


def test_synchronizer_waits_on_cuda_and_mps_only(fake_accelerators):
    synchronizer("cuda:0")()
    synchronizer("mps")()
    assert fake_accelerators == [("cuda", torch.device("cuda:0")), ("mps", None)]
    fake_accelerators.clear()
    synchronizer("cpu")()
    synchronizer("meta")()
    assert fake_accelerators == []


def test_synchronizer_none_waits_on_cuda_only_once_initialised(fake_accelerators, monkeypatch):
    synchronizer(None)()
    assert fake_accelerators == [("cuda", None)]
    fake_accelerators.clear()
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    synchronizer(None)()
    assert fake_accelerators == []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    synchronizer(None)()
    assert fake_accelerators == []


# --- try_pin -----------------------------------------------------------------------------------

class Pinnable(torch.Tensor):
    """A tensor whose pin_memory works here (no CUDA needed) and says so."""

    def pin_memory(self, *args, **kwargs):
        return self.as_subclass(Pinnable)


class Unpinnable(torch.Tensor):
    def pin_memory(self, *args, **kwargs):
        raise RuntimeError("no pinned memory in this build")


def test_try_pin_pins_for_cuda_and_mps():
    t = torch.zeros(3).as_subclass(Pinnable)
    for dev in ("cuda", "cuda:0", "mps"):
        pinned, why = try_pin(t, dev)
        assert isinstance(pinned, Pinnable) and why == ""


def test_try_pin_says_why_when_pinning_fails():
    pinned, why = try_pin(torch.zeros(3).as_subclass(Unpinnable), "cuda")
    assert pinned is None and "no pinned memory in this build" in why


def test_try_pin_for_the_cpu_never_pins(monkeypatch):
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self, *a, **k: self)
    pinned, why = try_pin(torch.zeros(3), "cpu")
    assert pinned is None and "host-to-host" in why
    monkeypatch.setattr(torch.Tensor, "pin_memory", Unpinnable.pin_memory)
    pinned, why = try_pin(torch.zeros(3), "cpu")
    assert pinned is None and "no pinned memory in this build" in why


# --- move_to_device, tensors_of ----------------------------------------------------------------

class Probe(torch.Tensor):
    """Records the non_blocking each copy is asked for; pinned as given."""
    log: list = []
    pinned = False

    def is_pinned(self, *args, **kwargs):
        return type(self).pinned

    def to(self, *args, **kwargs):
        Probe.log.append(kwargs.get("non_blocking"))
        return torch.Tensor.to(torch.Tensor(self), *args, **kwargs)


class PinnedProbe(Probe):
    pinned = True


Pair = collections.namedtuple("Pair", "a b")


def test_move_to_device_is_asynchronous_from_pinned_memory_by_default():
    Probe.log = []
    move_to_device(torch.zeros(1).as_subclass(PinnedProbe), "cpu")
    move_to_device(torch.zeros(1).as_subclass(Probe), "cpu")
    move_to_device(torch.zeros(1).as_subclass(PinnedProbe), "cpu", non_blocking=False)
    assert Probe.log == [True, False, False]


def test_move_to_device_passes_non_blocking_down_every_container():
    Probe.log = []
    p = lambda: torch.zeros(1).as_subclass(Probe)    # noqa: E731
    batch = {"a": [p(), (p(), Pair(p(), {"d": p()}))]}
    moved = move_to_device(batch, "meta", non_blocking=True)
    assert Probe.log == [True] * 4
    assert isinstance(moved["a"], list) and isinstance(moved["a"][1], tuple)
    pair = moved["a"][1][1]
    assert isinstance(pair, Pair) and isinstance(pair.b, dict)
    assert all(t.device.type == "meta" for t in tensors_of(moved))
    Probe.log = []
    move_to_device([PinnedProbe(torch.zeros(1))], "cpu")
    assert Probe.log == [True]


def test_move_to_device_keeps_other_values():
    batch = ("name", 3, None, torch.arange(3, dtype=torch.int16))
    moved = move_to_device(batch, "meta")
    assert moved[:3] == ("name", 3, None) and moved[3].dtype == torch.int16
    assert moved[3].device.type == "meta" and type(moved) is tuple


def test_tensors_of_walks_in_order_and_skips_other_values():
    a, b, c, d = (torch.tensor([float(i)]) for i in range(4))
    batch = [a, {"x": (b, "s", 7), "y": [c]}, Pair(d, None), "t"]
    assert [float(t) for t in tensors_of(batch)] == [0.0, 1.0, 2.0, 3.0]
    assert list(tensors_of("text")) == [] and list(tensors_of(5)) == []
    assert [float(t) for t in tensors_of(a)] == [0.0]


# --- constants_on --------------------------------------------------------------------------------

def test_constants_on_is_per_device_and_moves_there(monkeypatch):
    monkeypatch.setattr(device_mod, "_CONSTANTS", {})
    made = []

    def make():
        made.append(1)
        return torch.tensor([1.0]), torch.tensor([2.0])

    on_meta = constants_on("meta", ("k",), make)
    on_cpu = constants_on("cpu", ("k",), make)
    assert len(made) == 2 and on_meta[0].device.type == "meta" and on_cpu[1].device.type == "cpu"
    assert float(on_cpu[1]) == 2.0 and len(on_meta) == 2
    assert constants_on(torch.device("cpu"), ("k",), make)[0] is on_cpu[0] and len(made) == 2
    constants_on("cpu", ("other",), make)
    assert len(made) == 3


def test_constants_on_keeps_up_to_seventeen_entries_then_starts_again(monkeypatch):
    monkeypatch.setattr(device_mod, "_CONSTANTS", {})
    made = []

    def maker(i):
        def make():
            made.append(i)
            return (torch.tensor([float(i)]),)
        return make

    for i in range(17):                                  # 17 entries: 16 before the 17th (no clear)
        constants_on("cpu", (i,), maker(i))
    constants_on("cpu", (0,), maker(0))
    assert made == list(range(17))                       # entry 0 still cached
    constants_on("cpu", (17,), maker(17))                # 17 > 16: the cache starts again
    constants_on("cpu", (0,), maker(0))
    assert made == list(range(18)) + [0]
    assert len(device_mod._CONSTANTS) == 2


# --- l04_copies ---------------------------------------------------------------------------------

def test_copy_modes_and_labels():
    assert H2D_MODES["pageable"] == CopyMode(pinned=False, non_blocking=False)
    assert H2D_MODES["pinned_blocking"] == CopyMode(pinned=True, non_blocking=False)
    assert H2D_MODES["pinned_non_blocking"] == CopyMode(pinned=True, non_blocking=True)
    assert MODES == ("pageable", "pinned_blocking", "pinned_non_blocking", "device")
    assert CopyMode(True, True).label == "pinned, non_blocking"
    assert CopyMode(False, False).label == "pageable, blocking"
    assert CopyMode(True, False).label == "pinned, blocking"


def test_fmt_bytes_at_each_unit_boundary():
    assert (KIB, MIB, GIB) == (1024, 1024**2, 1024**3)
    assert fmt_bytes(1023) == "1023 B" and fmt_bytes(1024) == "1 KiB" and fmt_bytes(0.5) == "0 B"
    assert fmt_bytes(MIB - 512) == "1023.5 KiB" and fmt_bytes(MIB) == "1 MiB"
    assert fmt_bytes(3 * GIB) == "3 GiB" and fmt_bytes(GIB + GIB // 4) == "1.2 GiB"
    assert fmt_bytes(GIB - 1) == "1024.0 MiB" and fmt_bytes(2.5 * MIB) == "2.5 MiB"


def _sweep():
    # sizes 1 KiB, 1 MiB, 64 MiB. pageable is fastest at 1 MiB (30 GB/s, above every pinned
    # figure); pinned_blocking's best 24 at 64 MiB; pinned_non_blocking's best 20 at 1 MiB.
    return BandwidthSweep("cuda:0", [KIB, MIB, 64 * MIB], {
        "pageable": [2.0, 30.0, 12.0],
        "pinned_blocking": [None, 18.0, 24.0],
        "pinned_non_blocking": [4.0, 20.0, None],
        "device": [None, None, None],
    })


def test_best_is_the_fastest_measured_size_of_a_mode():
    s = _sweep()
    assert s.best("pageable") == (MIB, 30.0)
    assert s.best("pinned_blocking") == (64 * MIB, 24.0)
    assert s.best("pinned_non_blocking") == (MIB, 20.0)
    assert s.best("device") is None
    assert s.measured("pageable") and not s.measured("device")
    assert BandwidthSweep("cpu", [KIB], {}).best("pageable") is None


def test_best_h2d_and_best_pinned():
    s = _sweep()
    assert s.best_h2d() == ("pageable", MIB, 30.0)
    assert s.best_pinned() == ("pinned_blocking", 64 * MIB, 24.0)   # pageable is not pinned
    # pinned over best, the right way up: 24 / 30 = 0.8 (below gpu-check's 0.9 target)
    assert s.pinned_fraction_of_best() == pytest.approx(0.8)


def test_pinned_fraction_when_pinned_is_the_best_and_when_unmeasured():
    s = BandwidthSweep("cuda:0", [KIB, MIB], {"pageable": [5.0, 10.0], "pinned_non_blocking": [25.0, 12.5]})
    assert s.best_pinned() == ("pinned_non_blocking", KIB, 25.0)
    assert s.best_h2d() == ("pinned_non_blocking", KIB, 25.0)
    assert s.pinned_fraction_of_best() == pytest.approx(1.0)
    only_pageable = BandwidthSweep("cpu", [KIB], {"pageable": [3.0], "pinned_blocking": [None]})
    assert only_pageable.best_pinned() is None and only_pageable.pinned_fraction_of_best() is None
    assert BandwidthSweep("cpu", [KIB], {}).best_h2d() is None
    zero = BandwidthSweep("cuda:0", [KIB], {"pageable": [0.0], "pinned_blocking": [0.0]})
    assert zero.pinned_fraction_of_best() is None


def test_ratios_are_mode_over_baseline_where_both_were_measured():
    s = _sweep()
    # 1 KiB: 4 / 2 = 2.0; 1 MiB: 20 / 30; 64 MiB: pinned_non_blocking not measured
    assert s.ratios("pinned_non_blocking", "pageable") == [(KIB, pytest.approx(2.0)),
                                                            (MIB, pytest.approx(20 / 30))]
    # 1 KiB: baseline None; 1 MiB 30 / 18; 64 MiB 12 / 24
    assert s.ratios("pageable", "pinned_blocking") == [(MIB, pytest.approx(30 / 18)),
                                                        (64 * MIB, pytest.approx(0.5))]
    z = BandwidthSweep("cuda:0", [KIB, MIB], {"pageable": [1.0, 2.0], "device": [0.0, 4.0]})
    assert z.ratios("pageable", "device") == [(MIB, pytest.approx(0.5))]   # 0 GB/s skipped
    assert s.ratios("device", "pageable") == []
    with pytest.raises(ValueError, match="mode="):
        s.ratios("pinned", "pageable")
    with pytest.raises(ValueError, match="mode="):
        s.best("host")


def test_from_dict_round_trip_ignores_unknown_keys_and_names_missing_ones():
    s = _sweep()
    data = s.to_dict() | {"extra": 1}
    back = BandwidthSweep.from_dict(data)
    assert back == s and back.best_pinned() == ("pinned_blocking", 64 * MIB, 24.0)
    with pytest.raises(ValueError, match="gbps"):
        BandwidthSweep.from_dict({"device": "cpu", "sizes_bytes": []})
    with pytest.raises(ValueError, match="sizes_bytes"):
        BandwidthSweep.from_dict({"device": "cpu", "gbps": {}})
    with pytest.raises(ValueError, match="device"):
        BandwidthSweep.from_dict({"sizes_bytes": [], "gbps": {}})
    with pytest.raises(TypeError, match="to_dict"):
        BandwidthSweep.from_dict([("device", "cpu")])
    partial = BandwidthSweep.from_dict({"device": "cpu", "sizes_bytes": [KIB], "gbps": {},
                                        "notes": {"pageable": "why"}})
    assert partial.notes == {"pageable": "why"} and partial.labels == {} and partial.settings == {}


def test_pinned_fraction_below_one_gbps_is_still_a_ratio():
    # best 0.5 GB/s (pageable), pinned 0.4: 0.4 / 0.5 = 0.8 (slow links are measured too)
    s = BandwidthSweep("cuda:0", [KIB], {"pageable": [0.5], "pinned_blocking": [0.4]})
    assert s.pinned_fraction_of_best() == pytest.approx(0.8)
