"""course_utils.augment: the random draws (draw_batch, draw_sample) fed hand-made uniforms, so
each column of draws is pinned to its own parameter (swapping two columns is caught), and the
parameter checks on both sides of every bound."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from course_utils import augment
from course_utils.augment import AugmentDraws, AugmentParams, SampleDraw, draw_batch, draw_sample

pytestmark = pytest.mark.timeout(60)

# 10 x 30 pixels (area 300), two attempts; scale (0.1, 0.5): area = 300 * (0.1 + 0.4 u);
# ratio (0.5, 2): aspect = 0.5 * 4**u (u = 0 -> 0.5, u = 0.5 -> 1, u = 1 -> 2);
# brightness 0.4 -> factor in (0.6, 1.4); contrast 0.2 -> factor in (0.8, 1.2).
H, W = 10, 30
P = AugmentParams(size=8, scale=(0.1, 0.5), ratio=(0.5, 2.0), attempts=2, flip_p=0.5,
                  brightness=0.4, contrast=0.2)

# columns: area0, area1, aspect0, aspect1, top, left, flip, brightness, contrast
U = [
    # A: attempt 0 fits: area 90, aspect 2 -> w = round(sqrt 180) = 13, h = round(sqrt 45) = 7;
    #    attempt 1 would fit too (area 30, aspect 1 -> 5 x 5): the first one is kept.
    #    top = floor(0.9 * (10 - 7 + 1)) = 3; left = floor(0.25 * (30 - 13 + 1)) = 4;
    #    flip 0.3 < 0.5; brightness 0.6 + 0.8 * 0.75 = 1.2; contrast 0.8 + 0.4 * 0.25 = 0.9
    [0.5, 0.0, 1.0, 0.5, 0.9, 0.25, 0.3, 0.75, 0.25],
    # B: attempt 0 does not fit: area 150, aspect 0.5 -> w = 9, h = round(sqrt 300) = 17 > 10;
    #    attempt 1: area 30, aspect 1 -> w = h = round(sqrt 30) = 5;
    #    top = floor(1.0 * 6) = 6, clamped to 10 - 5 = 5; left = floor(0 * 26) = 0;
    #    flip: 0.5 < 0.5 is False; brightness 0.6 + 0 = 0.6; contrast 0.8 + 0.4 * 0.5 = 1.0
    [1.0, 0.0, 0.0, 0.5, 1.0, 0.0, 0.5, 0.0, 0.5],
    # C: neither attempt fits (both 9 x 17): the centre crop of the fallback: the image is
    #    wider (30 / 10 = 3) than ratio 2 allows: h = 10, w = 10 * 2 = 20, top 0, left (30-20)//2 = 5;
    #    flip: 0.4999 < 0.5; brightness 0.6 + 0.8 = 1.4; contrast 0.8 + 0.4 * 0.75 = 1.1
    [1.0, 1.0, 0.0, 0.0, 0.9, 0.9, 0.4999, 1.0, 0.75],
]


@pytest.fixture
def fake_rand(monkeypatch):
    """torch.rand returns the rows given, after checking the shape asked for."""
    asked = []

    def install(rows):
        table = torch.tensor(rows, dtype=torch.float32)

        def rand(*size, generator=None, device=None):
            asked.append((tuple(size), generator, device))
            assert tuple(size) == tuple(table.shape), (size, table.shape)
            return table.clone().to(device or "cpu")

        monkeypatch.setattr(torch, "rand", rand)
        return asked

    return install


def test_draw_batch_reads_each_parameter_from_its_own_column(fake_rand):
    asked = fake_rand(U)
    d = draw_batch(3, H, W, P)
    assert asked[0][0] == (3, 2 * 2 + 5)         # one row of 9 uniforms per sample
    assert d.height.tolist() == [7, 5, 10]
    assert d.width.tolist() == [13, 5, 20]
    assert d.top.tolist() == [3, 5, 0]
    assert d.left.tolist() == [4, 0, 5]
    assert d.flip.tolist() == [True, False, True]
    assert d.brightness.tolist() == pytest.approx([1.2, 0.6, 1.4], abs=1e-6)
    assert d.contrast.tolist() == pytest.approx([0.9, 1.0, 1.1], abs=1e-6)
    assert d.top.dtype == d.height.dtype == torch.int64 and d.flip.dtype == torch.bool


def test_draw_batch_swapped_columns_give_other_draws(fake_rand):
    """The same row with top/left and brightness/contrast exchanged gives other values."""
    row = list(U[0])
    row[4], row[5] = row[5], row[4]
    row[7], row[8] = row[8], row[7]
    fake_rand([row])
    d = draw_batch(1, H, W, P)
    # top = floor(0.25 * 4) = 1, left = floor(0.9 * 18) = 16; brightness 0.6 + 0.8 * 0.25 = 0.8,
    # contrast 0.8 + 0.4 * 0.75 = 1.1
    assert (d.top.item(), d.left.item()) == (1, 16)
    assert d.brightness.item() == pytest.approx(0.8) and d.contrast.item() == pytest.approx(1.1)


def test_draw_batch_area_and_aspect_of_one_attempt_go_together(fake_rand):
    """Attempt 1's area with attempt 1's aspect: area 300 * 0.5 = 150 and aspect 0.5 * 4**0.75
    = 1.4142 -> w = round(sqrt(212.1)) = 15, h = round(sqrt(106.07)) = 10 (fits; attempt 0,
    area 150 aspect 0.5, does not)."""
    fake_rand([[1.0, 1.0, 0.0, 0.75, 0.0, 0.0, 0.9, 0.5, 0.5]])
    d = draw_batch(1, H, W, P)
    assert (d.height.item(), d.width.item()) == (10, 15)
    assert (d.top.item(), d.left.item(), bool(d.flip.item())) == (0, 0, False)
    assert d.brightness.item() == pytest.approx(1.0) and d.contrast.item() == pytest.approx(1.0)


def test_draw_batch_box_just_inside_and_just_outside_the_image(fake_rand):
    """scale 1, ratio 3 on 10 x 30: area 300 -> w = 30 (= the width), h = 10 (= the height): it
    fits, the whole image; aspect 3.2 makes w one pixel too wide, and it does not."""
    whole = AugmentParams(size=8, scale=(1.0, 1.0), ratio=(3.0, 3.0), attempts=1)
    fake_rand([[0.3, 0.3, 0.6, 0.7, 0.1, 0.2, 0.3]])
    d = draw_batch(1, H, W, whole)
    assert (d.top.item(), d.left.item(), d.height.item(), d.width.item()) == (0, 0, 10, 30)
    # aspect 3.2: w = round(sqrt(960)) = 31 > 30: falls back to the centre crop, here (ratio 3.2
    # wider than the image's 3) h = round(30 / 3.2) = round(9.375) = 9, top (10 - 9) // 2 = 0
    wider = AugmentParams(size=8, scale=(1.0, 1.0), ratio=(3.2, 3.2), attempts=1)
    fake_rand([[0.3, 0.3, 0.6, 0.7, 0.1, 0.2, 0.3]])
    d = draw_batch(1, H, W, wider)
    assert (d.top.item(), d.left.item(), d.height.item(), d.width.item()) == (0, 0, 9, 30)


def test_draw_batch_scale_is_a_share_of_the_area_not_of_a_side(fake_rand):
    """scale (0.25, 0.25), ratio 1 on 12 x 12: area 144 / 4 = 36 -> a 6 x 6 box (a share of a
    side would give 3 x 3); the position counts 12 - 6 + 1 = 7 places: floor(0.5 * 7) = 3."""
    p = AugmentParams(size=4, scale=(0.25, 0.25), ratio=(1.0, 1.0), attempts=1)
    fake_rand([[0.9, 0.1, 0.5, 0.5, 0.9, 0.1, 0.9]])
    d = draw_batch(1, 12, 12, p)
    assert (d.height.item(), d.width.item(), d.top.item(), d.left.item()) == (6, 6, 3, 3)
    assert d.brightness.item() == pytest.approx(0.68)   # default 0.4: 0.6 + 0.8 * 0.1
    assert d.contrast.item() == pytest.approx(1.32)     # default 0.4: 0.6 + 0.8 * 0.9


def test_draw_batch_brightness_above_one_starts_at_zero(fake_rand):
    """brightness 1.5: factor in (max(0, -0.5), 2.5) = (0, 2.5): u = 0.2 -> 0.5 (not -0.1)."""
    p = AugmentParams(size=4, scale=(1.0, 1.0), ratio=(1.0, 1.0), attempts=1, brightness=1.5,
                      contrast=1.5)
    fake_rand([[0.0, 0.0, 0.0, 0.0, 0.9, 0.2, 0.6]])
    d = draw_batch(1, 4, 4, p)
    assert d.brightness.item() == pytest.approx(0.5) and d.contrast.item() == pytest.approx(1.5)


def test_draw_batch_moves_to_the_device_and_uses_the_generator(fake_rand):
    asked = fake_rand(U)
    g = torch.Generator().manual_seed(0)
    d = draw_batch(3, H, W, P, generator=g, device="meta")
    assert asked[0][1] is g and asked[0][2] == torch.device("cpu")   # drawn where g lives
    assert d.device.type == "meta" and d.top.device.type == "meta" and d.contrast.device.type == "meta"
    d = draw_batch(3, H, W, P, device="cpu")
    assert asked[1][1] is None and asked[1][2] == torch.device("cpu")
    assert d.top.tolist() == [3, 5, 0]


def test_draw_batch_real_generator_stays_inside_and_covers_every_position():
    """A 6 x 6 box on 8 x 10 (scale (0.45, 0.45), ratio 1: area 36) has 3 tops and 5 lefts;
    with 400 real draws every position appears, none outside."""
    p = AugmentParams(size=4, scale=(0.45, 0.45), ratio=(1.0, 1.0), attempts=1)
    d = draw_batch(400, 8, 10, p, generator=torch.Generator().manual_seed(5))
    assert set(d.height.tolist()) == {6} and set(d.width.tolist()) == {6}
    assert set(d.top.tolist()) == {0, 1, 2} and set(d.left.tolist()) == {0, 1, 2, 3, 4}
    # independence: top and left are not drawn from one number (all 15 pairs appear)
    assert len(set(zip(d.top.tolist(), d.left.tolist()))) == 15
    assert len(set(zip(d.flip.tolist(), (d.brightness > 1).tolist()))) == 4


# --- draw_sample with a scripted generator ------------------------------------------------------

class ScriptedRng(np.random.Generator):
    """A numpy Generator whose uniform/integers/random return scripted unit values (u -> low +
    (high - low) * u; integers: low + floor(u * (high - low))) and log their arguments."""

    def __init__(self, units):
        super().__init__(np.random.PCG64(0))
        self.units = list(units)
        self.log = []

    def _next(self):
        return self.units.pop(0)

    def uniform(self, low=0.0, high=1.0, size=None):
        self.log.append(("uniform", low, high))
        return low + (high - low) * self._next()

    def integers(self, low, high=None, size=None, dtype=np.int64, endpoint=False):
        self.log.append(("integers", low, high))
        return low + int(math.floor(self._next() * (high - low)))

    def random(self, size=None, dtype=np.float64, out=None):
        self.log.append(("random",))
        return self._next()


def test_draw_sample_takes_the_first_box_that_fits_and_draws_in_order():
    # attempt 0: area 150, aspect 0.5 -> 9 x 17: does not fit in 10 rows;
    # attempt 1: area 90, aspect 2 -> w 13, h 7: fits; top in [0, 4), left in [0, 18);
    # top 0.9 -> 3, left 0.25 -> 4; flip 0.3 < 0.5; brightness 1.2; contrast 0.9
    rng = ScriptedRng([1.0, 0.0, 0.5, 1.0, 0.9, 0.25, 0.3, 0.75, 0.25])
    s = draw_sample(H, W, P, rng)
    assert s == SampleDraw(3, 4, 7, 13, True, pytest.approx(1.2), pytest.approx(0.9))
    assert rng.log[4:6] == [("integers", 0, 4), ("integers", 0, 18)]
    assert rng.log[1] == ("uniform", pytest.approx(math.log(0.5)), pytest.approx(math.log(2.0)))
    assert rng.log[0] == ("uniform", 0.1, 0.5)
    assert rng.log[7:] == [("uniform", pytest.approx(0.6), 1.4), ("uniform", pytest.approx(0.8), 1.2)]
    assert not rng.units                                             # nothing else drawn


def test_draw_sample_falls_back_after_every_attempt_fails():
    rng = ScriptedRng([1.0, 0.0, 1.0, 0.0, 0.5, 1.0, 0.0])   # two 9 x 17 boxes; flip 0.5: no
    s = draw_sample(H, W, P, rng)
    assert (s.top, s.left, s.height, s.width, s.flip) == (0, 5, 10, 20, False)
    assert (s.brightness, s.contrast) == (pytest.approx(1.4), pytest.approx(0.8))
    assert [e[0] for e in rng.log] == ["uniform"] * 4 + ["random", "uniform", "uniform"]


def test_draw_sample_box_exactly_the_image_fits():
    whole = AugmentParams(size=8, scale=(1.0, 1.0), ratio=(3.0, 3.0), attempts=1)
    rng = ScriptedRng([0.5, 0.5, 0.0, 0.0, 0.9, 0.5, 0.5])
    s = draw_sample(H, W, whole, rng)
    assert (s.top, s.left, s.height, s.width) == (0, 0, 10, 30)
    assert ("integers", 0, 1) in rng.log                     # one place only, in each direction
    wider = AugmentParams(size=8, scale=(1.0, 1.0), ratio=(3.2, 3.2), attempts=1)
    s = draw_sample(H, W, wider, ScriptedRng([0.5, 0.5, 0.9, 0.5, 0.5]))
    assert (s.top, s.left, s.height, s.width) == (0, 0, 9, 30)


def test_draw_sample_flip_threshold_both_sides():
    p = AugmentParams(size=4, scale=(1.0, 1.0), ratio=(1.0, 1.0), attempts=1, flip_p=0.25)
    below = draw_sample(4, 4, p, ScriptedRng([0.5, 0.5, 0.0, 0.0, 0.2499, 0.5, 0.5]))
    at = draw_sample(4, 4, p, ScriptedRng([0.5, 0.5, 0.0, 0.0, 0.25, 0.5, 0.5]))
    assert below.flip is True and at.flip is False


def test_draw_sample_default_rng_is_unseeded_numpy():
    s = draw_sample(8, 8, AugmentParams(size=4))
    assert isinstance(s, SampleDraw) and 0 <= s.top and s.top + s.height <= 8


# --- the parameters -------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs", [
    dict(scale=(0.0, 1.0)), dict(scale=(float("nan"), 1.0)), dict(ratio=(1.0, float("inf"))),
    dict(ratio=(float("-inf"), 1.0)), dict(scale=(0.5, 1.0001)), dict(ratio=(2.0, 1.999)),
    dict(ratio=5), dict(ratio=(1, 2, 3)), dict(ratio=("a", 2)), dict(flip_p=True),
    dict(flip_p=-0.01), dict(flip_p=1.01), dict(brightness=10.01), dict(contrast=-1e-9),
    dict(flip_p="0.5"), dict(size=True), dict(size=0), dict(attempts=0),
])
def test_params_rejected_just_outside(kwargs):
    with pytest.raises((ValueError, TypeError)):
        AugmentParams(**kwargs)


def test_params_accepted_just_inside():
    p = AugmentParams(size=1, attempts=1, scale=[1e-9, 1.0], ratio=[0.5, 0.5], flip_p=1,
                      brightness=10, contrast=0)
    assert p.scale == (1e-9, 1.0) and isinstance(p.scale, tuple) and p.ratio == (0.5, 0.5)
    assert p.flip_p == 1.0 and isinstance(p.flip_p, float)
    assert p.brightness_range == (0.0, 11.0) and p.contrast_range == (1.0, 1.0)
    q = AugmentParams(flip_p=0, brightness=0.3, contrast=0.7, mean=[0.5, 0.25, 0.0], std=[1, 2, 4])
    assert q.flip_p == 0.0 and q.mean == (0.5, 0.25, 0.0) and q.std == (1.0, 2.0, 4.0)
    assert q.brightness_range == pytest.approx((0.7, 1.3)) and q.contrast_range == pytest.approx((0.3, 1.7))
    assert q.to_dict()["contrast"] == 0.7 and q.to_dict()["scale"] == (0.08, 1.0)


def test_params_errors_name_the_setting():
    with pytest.raises(ValueError, match="scale"):
        AugmentParams(scale=(0.5, 1.5))
    with pytest.raises(ValueError, match="ratio"):
        AugmentParams(ratio=5)
    with pytest.raises(ValueError, match="flip_p"):
        AugmentParams(flip_p=True)
    with pytest.raises(ValueError, match="brightness"):
        AugmentParams(brightness=10.5)


def test_fallback_box_for_a_tall_image_and_a_tiny_one():
    """400 x 4 (tall, 4/400 < 3/4): w = 4, h = round(4 / 0.75) = 5, top (400 - 5) // 2 = 197;
    a ratio of (10, 20) on 100 x 4: h = round(0.4) = 0, raised to 1, top (100 - 1) // 2 = 49."""
    assert AugmentParams().fallback_box(400, 4) == (197, 0, 5, 4)
    assert AugmentParams(ratio=(10, 20)).fallback_box(100, 4) == (49, 0, 1, 4)
    # wide, 7 x 101: h = 7, w = round(7 * 4 / 3) = round(9.33) = 9, left (101 - 9) // 2 = 46
    assert AugmentParams().fallback_box(7, 101) == (0, 46, 7, 9)
    # inside the range: the whole image
    assert AugmentParams().fallback_box(30, 35) == (0, 0, 30, 35)


def test_params_none_means_the_defaults_and_other_types_are_refused():
    assert augment._params(None, "x") == AugmentParams()
    with pytest.raises(TypeError, match="AugmentParams"):
        augment._params({"size": 4}, "x")


def test_augment_draws_sample_and_from_samples_round_trip():
    samples = [SampleDraw(1, 2, 3, 4, True, 1.25, 0.75), SampleDraw(5, 6, 7, 8, False, 0.5, 1.5)]
    d = AugmentDraws.from_samples(samples)
    assert len(d) == 2 and d.device.type == "cpu"
    assert d.sample(1) == samples[1] and d.samples() == samples
    assert d.width.dtype == torch.int64 and d.brightness.dtype == torch.float32
    with pytest.raises(ValueError, match="empty"):
        AugmentDraws.from_samples([])
    m = d.to("meta")
    assert m.device.type == "meta" and m.contrast.device.type == "meta" and len(m) == 2
