"""course_utils.augment: augment_batch and augment_sample on hand-made pixels (switches off with
factors given, clamping at 0 and 255, the normalisation constants made afresh), the crop box's
bounds on a non-square image, the exact flag, and that every error names the function."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from course_utils import device as device_mod
from course_utils.augment import (AugmentDraws, AugmentParams, AugmentTransform, SampleDraw,
                                  augment_batch, augment_sample, draw_batch, draw_sample)

pytestmark = pytest.mark.timeout(60)

# non-default normalisation: mean 0.2, std 0.5 on every channel -> (x / 255 - 0.2) / 0.5
P0 = dict(size=2, mean=(0.2, 0.2, 0.2), std=(0.5, 0.5, 0.5))


def _levels(out):
    """Back from normalised values to grey levels: (v * 0.5 + 0.2) * 255."""
    return out.double() * 0.5 * 255 + 0.2 * 255


def _flat(value, h=2, w=2):
    return np.full((h, w, 3), value, np.uint8)


def _both(img, draw, p):
    batch = torch.from_numpy(img).permute(2, 0, 1)[None].contiguous()
    return (augment_batch(batch, p, draws=AugmentDraws.from_samples([draw]))[0],
            augment_sample(img, draw, p))


def test_normalisation_uses_the_params_mean_and_std_with_a_fresh_cache(monkeypatch):
    monkeypatch.setattr(device_mod, "_CONSTANTS", {})
    p = AugmentParams(brightness=0.0, contrast=0.0, **P0)
    # 102 grey levels: (102 / 255 - 0.2) / 0.5 = (0.4 - 0.2) / 0.5 = 0.4
    for out in _both(_flat(102), SampleDraw(0, 0, 2, 2, False, 1.0, 1.0), p):
        assert torch.allclose(out, torch.full((3, 2, 2), 0.4), atol=1e-5)


def test_contrast_blends_with_the_grey_mean_with_a_fresh_cache(monkeypatch):
    """Pixels R=200, G=100, B=0 everywhere: grey mean 0.2989*200 + 0.587*100 = 118.48; contrast
    0.5: R = 0.5 * 200 + 0.5 * 118.48 = 159.24, G = 109.24, B = 59.24."""
    monkeypatch.setattr(device_mod, "_CONSTANTS", {})
    img = np.zeros((2, 2, 3), np.uint8)
    img[..., 0], img[..., 1] = 200, 100
    p = AugmentParams(brightness=0.0, contrast=0.5, **P0)
    for out in _both(img, SampleDraw(0, 0, 2, 2, False, 1.0, 0.5), p):
        assert _levels(out[:, 0, 0]).tolist() == pytest.approx([159.24, 109.24, 59.24], abs=0.01)


def test_switched_off_brightness_and_contrast_ignore_the_given_factors():
    p = AugmentParams(brightness=0.0, contrast=0.0, **P0)
    for out in _both(_flat(102), SampleDraw(0, 0, 2, 2, False, 2.0, 0.5), p):
        assert torch.allclose(out, torch.full((3, 2, 2), 0.4), atol=1e-5)


@pytest.mark.parametrize("level, params, draw", [
    # 0 and 200 levels, brightness 1.5: 0 stays 0 (not 1), 300 is clamped to 255
    (200, {"brightness": 0.5, "contrast": 0.0}, SampleDraw(0, 0, 2, 2, False, 1.5, 1.0)),
    # 0 and 250 levels, mean grey (0.2989+0.587+0.114) * 125 = 124.99; contrast 3: 0 -> -249.98
    # -> 0 and 250 -> 500.02 -> 255
    (250, {"brightness": 0.0, "contrast": 3.0}, SampleDraw(0, 0, 2, 2, False, 1.0, 3.0)),
], ids=["brightness", "contrast"])
def test_brightness_and_contrast_clamp_at_zero_and_255(level, params, draw):
    img = np.zeros((2, 2, 3), np.uint8)
    img[:, 1] = level
    for out in _both(img, draw, AugmentParams(**params, **P0)):
        lv = _levels(out)
        assert lv[:, :, 0].flatten().tolist() == pytest.approx([0.0] * 6, abs=1e-3)
        assert lv[:, :, 1].flatten().tolist() == pytest.approx([255.0] * 6, abs=1e-3)


def test_flip_mirrors_left_right_only():
    img = np.zeros((2, 2, 3), np.uint8)
    img[0, 0], img[1, 1] = 51, 204
    p = AugmentParams(brightness=0.0, contrast=0.0, **P0)
    plain = _both(img, SampleDraw(0, 0, 2, 2, False, 1.0, 1.0), p)
    flipped = _both(img, SampleDraw(0, 0, 2, 2, True, 1.0, 1.0), p)
    for a, b in zip(plain, flipped):
        assert torch.allclose(b, a.flip(-1), atol=1e-5) and not torch.allclose(b, a.flip(-2), atol=1e-3)


def test_generator_draws_use_the_params():
    """augment_batch(generator=g) draws with the params given (flip_p 1, scale 1: the whole
    image, mirrored), as draw_batch with the same seed does."""
    img = np.arange(4 * 6 * 3, dtype=np.uint8).reshape(4, 6, 3)
    batch = torch.from_numpy(img).permute(2, 0, 1)[None].expand(3, 3, 4, 6).contiguous()
    p = AugmentParams(size=4, scale=(1.0, 1.0), ratio=(1.5, 1.5), flip_p=1.0, brightness=0.3,
                      contrast=0.3)
    out = augment_batch(batch, p, generator=torch.Generator().manual_seed(4))
    draws = draw_batch(3, 4, 6, p, generator=torch.Generator().manual_seed(4))
    assert draws.flip.all() and (draws.width == 6).all() and (draws.height == 4).all()
    assert torch.equal(out, augment_batch(batch, p, draws=draws))


def test_draws_are_moved_to_the_batchs_device(monkeypatch):
    moved = []
    real = AugmentDraws.to
    monkeypatch.setattr(AugmentDraws, "to", lambda self, dev: moved.append(dev) or real(self, dev))
    d = AugmentDraws.from_samples([SampleDraw(0, 0, 4, 4, False, 1.0, 1.0)])
    augment_batch(torch.zeros(1, 3, 4, 4, dtype=torch.uint8), AugmentParams(size=2), draws=d)
    assert moved == [torch.device("cpu")]
    monkeypatch.undo()
    on_meta = AugmentDraws.from_samples([SampleDraw(0, 0, 4, 4, False, 1.0, 1.0)], device="meta")
    assert on_meta.device.type == "meta" and on_meta.flip.device.type == "meta"


def test_exact_is_off_by_default_and_passed_through_the_transform():
    """Upscaling 3 x 5 pixels to 8 x 8: the uint8 resize rounds, the exact one does not."""
    img = np.random.default_rng(1).integers(0, 256, (3, 5, 3), dtype=np.uint8)
    p = AugmentParams(size=8, scale=(1.0, 1.0), ratio=(5 / 3, 5 / 3), flip_p=0.0,
                      brightness=0.0, contrast=0.0)
    draw = SampleDraw(0, 0, 3, 5, False, 1.0, 1.0)
    exact, rounded = augment_sample(img, draw, p, exact=True), augment_sample(img, draw, p, exact=False)
    assert not torch.allclose(exact, rounded, atol=1e-4)
    assert torch.equal(augment_sample(img, draw, p), rounded)
    t = AugmentTransform(p, seed=0, exact=True)
    assert t.exact is True and AugmentTransform(p, seed=0).exact is False
    assert torch.equal(t(img), exact)                 # the only box: the whole image
    assert torch.equal(AugmentTransform(p, seed=0)(img), rounded)
    assert t.draw(3, 5) == SampleDraw(0, 0, 3, 5, False, 1.0, 1.0)


def test_crop_box_bounds_on_a_non_square_image():
    img = np.zeros((10, 30, 3), np.uint8)
    p = AugmentParams(size=2)
    ok = [SampleDraw(9, 29, 1, 1, False, 1, 1), SampleDraw(0, 20, 10, 10, False, 1, 1),
          SampleDraw(0, 0, 10, 30, False, 1, 1)]
    for d in ok:
        assert augment_sample(img, d, p).shape == (3, 2, 2)
    bad = [SampleDraw(5, 0, 10, 1, False, 1, 1),      # t + h = 15 > 10 rows (< 30 columns)
           SampleDraw(0, 25, 1, 10, False, 1, 1),     # l + w = 35 > 30
           SampleDraw(0, 0, 0, 5, False, 1, 1), SampleDraw(0, 0, 5, 0, False, 1, 1),
           SampleDraw(-1, 0, 5, 5, False, 1, 1), SampleDraw(0, -1, 5, 5, False, 1, 1)]
    for d in bad:
        with pytest.raises(ValueError, match="^augment_sample: the crop box"):
            augment_sample(img, d, p)


@pytest.mark.parametrize("call, start", [
    (lambda: AugmentParams(size=0), "AugmentParams: size"),
    (lambda: AugmentParams(attempts=0), "AugmentParams: attempts"),
    (lambda: AugmentParams(scale=(0.0, 1.0)), "AugmentParams: scale"),
    (lambda: AugmentParams(ratio=(2, 1)), "AugmentParams: ratio"),
    (lambda: AugmentParams(ratio=3), "AugmentParams: ratio must be a pair"),
    (lambda: AugmentParams(flip_p=2), "AugmentParams: flip_p"),
    (lambda: AugmentParams(brightness=11), "AugmentParams: brightness"),
    (lambda: AugmentParams(contrast=10.5), "AugmentParams: contrast"),
    (lambda: AugmentParams(mean=(0, 0)), "AugmentParams: mean"),
    (lambda: AugmentParams(std=(1, 0, 1)), "AugmentParams: std"),
    (lambda: draw_batch(0, 4, 4), "draw_batch: n"),
    (lambda: draw_batch(1, 4, 4, params=3), "draw_batch: params"),
    (lambda: draw_sample(0, 4), "draw_sample: height"),
    (lambda: draw_sample(4, 0), "draw_sample: width"),
    (lambda: draw_sample(4, 4, params=3), "draw_sample: params"),
    (lambda: augment_batch(torch.zeros(2, 3, 4, 4)), "augment_batch: batch"),
    (lambda: augment_batch(torch.zeros(0, 3, 4, 4, dtype=torch.uint8)), "augment_batch: batch is empty"),
    (lambda: augment_batch(torch.zeros(1, 3, 4, 4, dtype=torch.uint8), params=3), "augment_batch: params"),
    (lambda: augment_batch(torch.zeros(1, 3, 4, 4, dtype=torch.uint8), draws=[1]), "augment_batch: draws must"),
    (lambda: augment_sample(np.zeros((4, 4, 3), np.float32), SampleDraw(0, 0, 4, 4, False, 1, 1)),
     "augment_sample: image must be uint8"),
    (lambda: augment_sample(np.zeros((4, 4, 3), np.uint8), (0, 0, 4, 4)), "augment_sample: draw must"),
    (lambda: augment_sample(np.zeros((4, 4, 3), np.uint8), SampleDraw(0, 0, 4, 4, False, 1, 1), 3),
     "augment_sample: params"),
    (lambda: AugmentTransform(params=3), "AugmentTransform: params"),
    (lambda: AugmentTransform(seed=-1), "AugmentTransform: seed"),
    (lambda: AugmentDraws.from_samples([]), "AugmentDraws.from_samples: draws is empty"),
])
def test_every_error_names_the_function(call, start):
    with pytest.raises((ValueError, TypeError)) as info:
        call()
    assert str(info.value).startswith(start), str(info.value)


def test_smallest_sizes_and_boxes_are_accepted():
    assert len(draw_batch(1, 1, 1)) == 1
    assert draw_sample(1, 1) .height == 1
    p = AugmentParams(mean=(0.0, -0.5, 0.5), contrast=10.0, size=1)
    assert p.mean == (0.0, -0.5, 0.5) and p.contrast_range == (0.0, 11.0)
    # a 1 x 1 box fits: scale 1/16 of 4 x 4, ratio 1 -> w = h = 1 (not the whole-image fallback)
    q = AugmentParams(size=1, scale=(1 / 16, 1 / 16), ratio=(1.0, 1.0), attempts=1)
    d = draw_batch(50, 4, 4, q, generator=torch.Generator().manual_seed(0))
    assert set(d.height.tolist()) == {1} and set(d.width.tolist()) == {1}
    rng = np.random.default_rng(0)
    assert {(s.height, s.width) for s in (draw_sample(4, 4, q, rng) for _ in range(20))} == {(1, 1)}


def test_fallback_width_rounding_to_zero_is_raised_to_one():
    # 4 x 100 (ratio 25 > 0.1): h = 4, w = round(4 * 0.1) = 0 -> 1, left (100 - 1) // 2 = 49
    assert AugmentParams(ratio=(0.01, 0.1)).fallback_box(4, 100) == (0, 49, 4, 1)


def test_left_is_clamped_at_the_top_of_its_range(monkeypatch):
    """u = 1.0 for top and left (torch.rand stops short of 1; the clamp keeps the box inside):
    a 2 x 2 box in 4 x 6 (scale 4/24, ratio 1): top min(floor(3), 2) = 2, left min(5, 4) = 4."""
    rows = torch.tensor([[0.0, 0.0, 1.0, 1.0, 0.9, 0.5, 0.5]])
    monkeypatch.setattr(torch, "rand", lambda *s, generator=None, device=None: rows.clone())
    d = draw_batch(1, 4, 6, AugmentParams(size=1, scale=(4 / 24, 4 / 24), ratio=(1.0, 1.0), attempts=1))
    assert (d.top.item(), d.left.item(), d.height.item(), d.width.item()) == (2, 4, 2, 2)


def test_drawn_on_the_device_asked_for_without_a_generator(monkeypatch):
    seen = []

    def rand(*size, generator=None, device=None):
        seen.append(device)
        return torch.zeros(*size, device=device)

    monkeypatch.setattr(torch, "rand", rand)
    d = draw_batch(2, 4, 4, AugmentParams(size=1), device="meta")
    assert seen == [torch.device("meta")] and d.device.type == "meta"


def test_from_samples_fixes_the_dtypes_whatever_the_values():
    """ints for the factors, 0/1 for the flip, numpy int32 for the box: int64 box, bool flip,
    float32 factors (as draw_batch gives)."""
    d = AugmentDraws.from_samples([SampleDraw(np.int32(1), np.int32(2), np.int32(3), np.int32(4), 1, 1, 2)])
    assert [getattr(d, f).dtype for f in AugmentDraws._FIELDS] == [torch.int64] * 4 + [torch.bool] + [torch.float32] * 2


def test_box_as_wide_as_the_image_fits_when_shorter(monkeypatch):
    """10 x 30, scale 0.8 (area 240), ratio 3.75: w = round(sqrt(900)) = 30 (= the width),
    h = round(sqrt(64)) = 8: it fits, top floor(0 * 3) = 0 (the centre-crop fallback would put
    the same 8 x 30 box at top (10 - 8) // 2 = 1)."""
    rows = torch.tensor([[0.5, 0.5, 0.0, 0.0, 0.9, 0.5, 0.5]])
    monkeypatch.setattr(torch, "rand", lambda *s, generator=None, device=None: rows.clone())
    p = AugmentParams(size=1, scale=(0.8, 0.8), ratio=(3.75, 3.75), attempts=1)
    d = draw_batch(1, 10, 30, p)
    assert (d.top.item(), d.left.item(), d.height.item(), d.width.item()) == (0, 0, 8, 30)


@pytest.mark.parametrize("ratio, box", [
    # 4 x 4, area 16 * 0.01 = 0.16: ratio 0.01 -> w = round(0.04) = 0, h = round(4) = 4: no fit;
    # fallback (1 > 0.01): h = 4, w = round(0.04) = 0 -> 1, left (4 - 1) // 2 = 1
    (0.01, (0, 1, 4, 1)),
    # ratio 100 -> w = 4, h = 0: no fit; fallback (1 < 100): w = 4, h = 0 -> 1, top 1
    (100.0, (1, 0, 1, 4)),
])
def test_a_box_zero_pixels_wide_or_tall_never_fits(ratio, box):
    p = AugmentParams(size=1, scale=(0.01, 0.01), ratio=(ratio, ratio), attempts=1)
    s = draw_sample(4, 4, p, np.random.default_rng(0))
    assert (s.top, s.left, s.height, s.width) == box
    d = draw_batch(3, 4, 4, p, generator=torch.Generator().manual_seed(0))
    assert (d.top.tolist(), d.left.tolist(), d.height.tolist(), d.width.tolist()) == tuple([v] * 3 for v in box)
