"""Lesson 05: batched on-device augmentation vs the per-sample CPU version."""
from __future__ import annotations

import json
import pickle

import cv2
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from course_utils.augment import (AGREE_MAX_LEVELS, AGREE_MEAN_LEVELS, AugmentDraws, AugmentParams,
                                  AugmentTransform, EXACT_MAX_LEVELS, SampleDraw, augment_batch,
                                  augment_sample, crop_grid, draw_batch, draw_sample)
from course_utils.data import sample_photo
from course_authoring.gpu_lesson05 import run_lesson05 as run_gpu_benchmarks
from course_utils.lessons.l05_measure import DecodedImages, RepeatDataset, count_torch_calls
from course_utils.lessons.l05_training import SmallCNN

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def images():
    return DecodedImages(n=6, side=64)


def _photo(h, w):
    return np.ascontiguousarray(cv2.resize(sample_photo()[:, :, ::-1], (w, h), interpolation=cv2.INTER_AREA))


def levels_difference(a, b, p):
    """Two normalised outputs apart, in grey levels (lesson 05 writes the same in its section 2)."""
    std = torch.tensor(p.std, dtype=torch.float64).view(3, 1, 1) * 255
    d = (a.detach().cpu().double() - b.detach().cpu().double()) * std
    return {"max_abs": float(d.abs().max()), "mean_abs": float(d.abs().mean())}


def draw_statistics(draws, height, width):
    """Per-sample quantities of draws (AugmentDraws or a list of SampleDraw), as float64 arrays."""
    if isinstance(draws, AugmentDraws):
        col = lambda f: getattr(draws, f).double().numpy()                          # noqa: E731
    else:
        col = lambda f: np.array([getattr(d, f) for d in draws], dtype=np.float64)  # noqa: E731
    t, l, h, w = (col(f) for f in ("top", "left", "height", "width"))
    return {"area_fraction": h * w / (height * width), "aspect": w / h,
            "top_fraction": np.where(height > h, t / np.maximum(height - h, 1), 0.5),
            "left_fraction": np.where(width > w, l / np.maximum(width - w, 1), 0.5),
            "flip": col("flip"), "brightness": col("brightness"), "contrast": col("contrast")}


def _normalise(x_hwc_float, p):
    x = torch.from_numpy(np.ascontiguousarray(x_hwc_float.transpose(2, 0, 1))).float()
    mean = torch.tensor(p.mean).view(3, 1, 1)
    std = torch.tensor(p.std).view(3, 1, 1)
    return (x / 255 - mean) / std


# --- parameters -----------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, word", [
    (dict(size=0), "size"), (dict(scale=(0.5, 0.2)), "scale"), (dict(scale=(0.1, 1.5)), "scale"),
    (dict(ratio=(0, 1)), "ratio"), (dict(flip_p=1.5), "flip_p"), (dict(brightness=-0.1), "brightness"),
    (dict(contrast="a"), "contrast"), (dict(std=(0.2, 0, 0.2)), "std"), (dict(mean=(1, 2)), "mean"),
    (dict(attempts=0), "attempts"),
])
def test_params_reject_bad_values_by_name(kwargs, word):
    with pytest.raises(ValueError, match=word):
        AugmentParams(**kwargs)


def test_params_ranges_and_fallback():
    p = AugmentParams(brightness=1.5, contrast=0.25)
    assert p.brightness_range == (0.0, 2.5) and p.contrast_range == (0.75, 1.25)
    assert AugmentParams().fallback_box(4, 400) == (0, 197, 4, 5)   # too wide: h = H, w = H * 4/3
    assert AugmentParams().fallback_box(100, 100) == (0, 0, 100, 100)


# --- draws ------------------------------------------------------------------------------------

def test_draw_batch_boxes_fit_and_types():
    d = draw_batch(500, 40, 70, generator=torch.Generator().manual_seed(0))
    assert len(d) == 500 and d.top.dtype == torch.int64 and d.flip.dtype == torch.bool
    assert d.brightness.dtype == torch.float32
    assert bool((d.top >= 0).all() and (d.left >= 0).all() and (d.height >= 1).all() and (d.width >= 1).all())
    assert bool((d.top + d.height <= 40).all() and (d.left + d.width <= 70).all())
    s = d.sample(3)
    assert isinstance(s, SampleDraw) and isinstance(s.flip, bool)
    again = AugmentDraws.from_samples(d.samples())
    assert all(torch.equal(getattr(again, f), getattr(d, f)) for f in AugmentDraws._FIELDS)


def test_draw_batch_is_reproducible_with_a_generator():
    a = draw_batch(50, 32, 32, generator=torch.Generator().manual_seed(1))
    b = draw_batch(50, 32, 32, generator=torch.Generator().manual_seed(1))
    c = draw_batch(50, 32, 32, generator=torch.Generator().manual_seed(2))
    assert torch.equal(a.brightness, b.brightness) and torch.equal(a.top, b.top)
    assert not torch.equal(a.brightness, c.brightness)


def test_switches_are_honoured():
    p = AugmentParams(flip_p=0.0, brightness=0.0, contrast=0.0)
    d = draw_batch(200, 32, 32, p, generator=torch.Generator().manual_seed(0))
    assert not bool(d.flip.any()) and bool((d.brightness == 1).all()) and bool((d.contrast == 1).all())
    d = draw_batch(200, 32, 32, AugmentParams(flip_p=1.0), generator=torch.Generator().manual_seed(0))
    assert bool(d.flip.all())
    rng = np.random.default_rng(0)
    assert all(draw_sample(32, 32, AugmentParams(flip_p=1.0), rng).flip for _ in range(50))


def test_fallback_when_no_box_fits():
    p = AugmentParams(scale=(0.9, 1.0))
    d = draw_batch(20, 4, 400, p, generator=torch.Generator().manual_seed(0))
    assert set(d.top.tolist()) == {0} and set(d.height.tolist()) == {4} and set(d.width.tolist()) == {5}
    assert set(d.left.tolist()) == {197}
    s = draw_sample(4, 400, p, np.random.default_rng(0))
    assert (s.top, s.left, s.height, s.width) == (0, 197, 4, 5)


@pytest.mark.parametrize("call, word", [
    (lambda: draw_batch(0, 8, 8), "n must"), (lambda: draw_batch(4, 0, 8), "height"),
    (lambda: draw_batch(4, 8, 8, generator="g"), "generator"),
    (lambda: draw_sample(8, 8, rng=np.random.RandomState(0)), "rng"),
    (lambda: augment_batch(torch.zeros(2, 3, 8, 8)), "uint8"),
    (lambda: augment_batch(torch.zeros(2, 8, 8, 3, dtype=torch.uint8)), "channels"),
    (lambda: augment_batch(np.zeros((2, 3, 8, 8), np.uint8)), "torch.Tensor"),
    (lambda: augment_batch(torch.zeros(2, 3, 8, 8, dtype=torch.uint8), draws=draw_batch(3, 8, 8)), "draws holds 3"),
    (lambda: augment_batch(torch.zeros(2, 3, 8, 8, dtype=torch.uint8), params=dict(size=4)), "AugmentParams"),
    (lambda: augment_sample(torch.zeros(8, 8, 3, dtype=torch.uint8), SampleDraw(0, 0, 8, 8, False, 1, 1)), "NumPy"),
    (lambda: augment_sample(np.zeros((8, 8, 3), np.uint8), SampleDraw(4, 0, 8, 8, False, 1, 1)), "does not fit"),
    (lambda: AugmentTransform(seed=-1), "seed"),
])
def test_bad_input_gives_a_clear_error(call, word):
    with pytest.raises((ValueError, TypeError), match=word):
        call()


# --- values -----------------------------------------------------------------------------------

def test_identity_box_only_normalises():
    p = AugmentParams(size=24, brightness=0.0, contrast=0.0)
    img = _photo(24, 24)
    batch = torch.from_numpy(img).permute(2, 0, 1)[None].contiguous()
    draws = AugmentDraws.from_samples([SampleDraw(0, 0, 24, 24, False, 1.0, 1.0)])
    out = augment_batch(batch, p, draws=draws)[0]
    assert levels_difference(out, _normalise(img.astype(np.float32), p), p)["max_abs"] < 1e-3
    flipped = augment_batch(batch, p, draws=AugmentDraws.from_samples([SampleDraw(0, 0, 24, 24, True, 1.0, 1.0)]))[0]
    assert torch.allclose(flipped, out.flip(-1), atol=1e-5)


def test_brightness_and_contrast_formulas():
    p = AugmentParams(size=16, brightness=0.5, contrast=0.5)
    img = _photo(16, 16)
    batch = torch.from_numpy(img).permute(2, 0, 1)[None].contiguous()
    out = augment_batch(batch, p, draws=AugmentDraws.from_samples([SampleDraw(0, 0, 16, 16, False, 1.3, 0.7)]))[0]
    x = np.clip(img.astype(np.float64) * 1.3, 0, 255)
    m = (x.reshape(-1, 3).mean(0) * np.array([0.2989, 0.587, 0.114])).sum()
    x = np.clip((x - m) * 0.7 + m, 0, 255)
    assert levels_difference(out, _normalise(x.astype(np.float32), p), p)["max_abs"] < 0.01


def _mixed_draws(h, w, n, seed):
    """Random draws plus hand-picked ones: upscaling a tiny box, the full image, flips, edges."""
    p = AugmentParams(size=32)
    rng = np.random.default_rng(seed)
    draws = [draw_sample(h, w, p, rng) for _ in range(n)]
    draws += [SampleDraw(0, 0, h, w, True, 1.4, 0.6), SampleDraw(h - 5, w - 7, 5, 7, False, 0.6, 1.4),
              SampleDraw(1, 2, 3, 3, True, 1.0, 1.0)]
    return p, draws


@pytest.mark.parametrize("h, w", [(48, 48), (40, 72)])
def test_batched_equals_per_sample_for_fixed_draws(h, w):
    img = _photo(h, w)
    p, draws = _mixed_draws(h, w, 12, seed=h)
    batch = torch.from_numpy(img).permute(2, 0, 1)[None].expand(len(draws), 3, h, w).contiguous()
    gpu_style = augment_batch(batch, p, draws=AugmentDraws.from_samples(draws))
    exact = torch.stack([augment_sample(img, d, p, exact=True) for d in draws])
    fast = torch.stack([augment_sample(img, d, p) for d in draws])
    assert gpu_style.shape == (len(draws), 3, 32, 32) and gpu_style.dtype == torch.float32
    diff_exact = levels_difference(gpu_style, exact, p)
    assert diff_exact["max_abs"] <= EXACT_MAX_LEVELS, diff_exact
    diff = levels_difference(gpu_style, fast, p)
    assert diff["max_abs"] <= AGREE_MAX_LEVELS and diff["mean_abs"] <= AGREE_MEAN_LEVELS, diff


def test_crop_grid_maps_the_box_with_half_pixel_centres():
    draws = AugmentDraws.from_samples([SampleDraw(2, 4, 8, 16, False, 1, 1)])
    g = crop_grid(draws, 20, 40, 4)
    x = ((g[0, 0, :, 0] + 1) * 40 - 1) / 2          # back to input pixels
    assert torch.allclose(x, torch.tensor([5.5, 9.5, 13.5, 17.5]), atol=1e-4)
    y = ((g[0, :, 0, 1] + 1) * 20 - 1) / 2
    assert torch.allclose(y, torch.tensor([2.5, 4.5, 6.5, 8.5]), atol=1e-4)


def test_per_sample_randomness_and_reproducibility(images):
    batch = images.batch(1).expand(16, -1, -1, -1).contiguous()      # 16 copies of one image
    p = AugmentParams(size=32)
    out = augment_batch(batch, p, generator=torch.Generator().manual_seed(0))
    assert len({round(float(o.sum()), 3) for o in out}) == 16           # every copy augmented differently
    again = augment_batch(batch, p, generator=torch.Generator().manual_seed(0))
    assert torch.equal(out, again)


def test_device_is_kept_on_meta():
    batch = torch.empty(4, 3, 20, 30, dtype=torch.uint8, device="meta")
    out = augment_batch(batch, AugmentParams(size=8))
    assert out.device.type == "meta" and out.shape == (4, 3, 8, 8) and out.dtype == torch.float32


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu_for_the_same_draws(images):  # pragma: no cover - runs on a GPU machine
    p = AugmentParams(size=32)
    batch = images.batch(6)
    draws = draw_batch(6, images.side, images.side, p, generator=torch.Generator().manual_seed(0))
    on_gpu = augment_batch(batch.cuda(), p, draws=draws)
    assert on_gpu.device.type == "cuda"
    assert levels_difference(on_gpu, augment_batch(batch, p, draws=draws), p)["max_abs"] < 0.05
    g = torch.Generator(device="cuda").manual_seed(0)
    assert augment_batch(batch.cuda(), p, generator=g).device.type == "cuda"


# --- same distribution --------------------------------------------------------------------------

def _ks(a, b):
    grid = np.sort(np.concatenate([a, b]))
    fa = np.searchsorted(np.sort(a), grid, side="right") / len(a)
    fb = np.searchsorted(np.sort(b), grid, side="right") / len(b)
    return float(np.abs(fa - fb).max())


def test_batched_and_per_sample_draws_have_the_same_distribution():
    h, w, n = 60, 90, 4000
    p = AugmentParams()
    batched = draw_statistics(draw_batch(n, h, w, p, generator=torch.Generator().manual_seed(0)), h, w)
    rng = np.random.default_rng(0)
    per_sample = draw_statistics([draw_sample(h, w, p, rng) for _ in range(n)], h, w)
    for s in (batched, per_sample):
        assert abs(s["flip"].mean() - p.flip_p) < 0.04
        for key, (lo, hi) in (("brightness", p.brightness_range), ("contrast", p.contrast_range)):
            assert lo <= s[key].min() and s[key].max() <= hi
            assert s[key].min() < lo + 0.01 and s[key].max() > hi - 0.01       # the whole range is used
        assert (s["area_fraction"] <= 1).all() and (s["area_fraction"] > 0.05).all()
    assert abs(batched["flip"].mean() - per_sample["flip"].mean()) < 0.05
    for key in ("brightness", "contrast"):
        assert abs(batched[key].mean() - per_sample[key].mean()) < 0.02
    # Kolmogorov-Smirnov distance; 0.05 is above the 0.1% critical value for 4000 vs 4000 (0.044)
    for key in ("area_fraction", "aspect", "top_fraction", "left_fraction", "brightness", "contrast"):
        assert _ks(batched[key], per_sample[key]) < 0.05, key


# --- the CPU transform in workers ----------------------------------------------------------------

def test_transform_pickles_and_runs_in_workers(images):
    t = AugmentTransform(AugmentParams(size=24), seed=3)
    t(images.images[0])                                   # creates the generator
    clone = pickle.loads(pickle.dumps(t))
    assert clone._rng is None and clone.seed == 3
    a = AugmentTransform(AugmentParams(size=24), seed=3)(images.images[0])
    b = AugmentTransform(AugmentParams(size=24), seed=3)(images.images[0])
    assert torch.equal(a, b) and a.shape == (3, 24, 24) and a.dtype == torch.float32
    ds = DecodedImages(images=images.images[:1], length=8, transform=AugmentTransform(AugmentParams(size=24)))
    loader = DataLoader(ds, batch_size=4, num_workers=2, timeout=60)
    out = torch.cat([x for x, _ in loader])
    assert out.shape == (8, 3, 24, 24)
    assert len({round(float(o.sum()), 3) for o in out}) == 8   # each worker its own stream


def test_count_torch_calls_tells_batched_from_a_loop(images):
    p = AugmentParams(size=16)
    g = torch.Generator().manual_seed(0)
    _, few = count_torch_calls(augment_batch, images.batch(2), p, generator=g)
    _, many = count_torch_calls(augment_batch, images.batch(12), p, generator=g)
    assert few == many

    def loop(batch):
        return torch.stack([b.flip(-1) * 1.1 for b in batch])

    assert count_torch_calls(loop, images.batch(12))[1] > count_torch_calls(loop, images.batch(2))[1]
    with pytest.raises(TypeError, match="callable"):
        count_torch_calls(3)


# --- datasets, model ---------------------------------------------------------------------------

def test_decoded_images(images):
    assert images.images.shape == (6, 64, 64, 3) and len(images) == 6
    x, label = images[7 % 6]
    assert x.shape == (3, 64, 64) and x.dtype == torch.uint8 and label == 1
    longer = images.view(length=20)
    assert len(longer) == 20 and longer.images is images.images
    assert torch.equal(longer[13][0], images[1][0])
    b = images.batch(8)
    assert b.shape == (8, 3, 64, 64) and torch.equal(b[6], images[0][0])
    with pytest.raises(IndexError):
        images[6]
    with pytest.raises(ValueError, match="length"):
        images.view(length=0)
    assert "64x64" in images.describe()


def test_repeat_dataset():
    r = RepeatDataset([10, 20, 30], 7)
    assert len(r) == 7 and [r[i] for i in range(7)] == [10, 20, 30, 10, 20, 30, 10]
    with pytest.raises(ValueError, match="length"):
        RepeatDataset([1], 0)


def test_small_cnn_trains_a_step():
    torch.manual_seed(0)
    model = SmallCNN(width=2)
    logits = model(torch.rand(4, 3, 32, 32))
    assert logits.shape == (4, 10)
    loss = torch.nn.functional.cross_entropy(logits, torch.tensor([0, 1, 2, 3]))
    loss.backward()
    assert torch.isfinite(loss) and all(p.grad is not None for p in model.parameters())
    with pytest.raises(ValueError, match="width"):
        SmallCNN(width=0)


# --- the GPU check ------------------------------------------------------------------------------

def test_run_gpu_benchmarks_refuses_without_cuda_and_checks_budget():
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="gpu-check"):
            run_gpu_benchmarks(10)
    with pytest.raises(ValueError, match="budget_s"):
        run_gpu_benchmarks(0, device="cpu")


def test_run_gpu_benchmarks_respects_the_budget():
    r = run_gpu_benchmarks(0.001, device="cpu", quick=True)
    assert r["training"] is None and r["skipped"]
    assert r["targets"]["augment_speedup"]["met"] is None and r["targets"]["tuned_data_wait"]["met"] is None
    json.dumps(r, allow_nan=False)


@pytest.mark.timeout(240)
def test_run_gpu_benchmarks_quick_on_cpu_runs_every_path():
    r = run_gpu_benchmarks(120, device="cpu", quick=True)
    json.dumps(r, allow_nan=False)                       # JSON-able, no NaN
    assert r["mode"] == "quick" and r["machine"]["cpu_count"] >= 1 and not r["skipped"]
    aug = r["augmentation"]
    assert len(aug["device_samples_per_s"]) == len(aug["batch_sizes"])
    assert all(v > 0 for v in aug["device_samples_per_s"] + aug["cpu_workers_samples_per_s"])
    assert set(r["training"]["pipelines"]) == {"common recipe", "tuned CPU pipeline", "GPU pipeline"}
    for row in r["training"]["pipelines"].values():
        assert 0 <= row["wait_fraction"] <= 1 and row["median_step_s"] > 0
    assert r["training"]["compute_only"]["median_step_s"] > 0
    for t in r["targets"].values():
        assert isinstance(t["met"], bool) and t["value"] is not None


def test_repeat_dataset_feeds_the_tuned_loader():
    from course_utils.data import JpegDataset
    from course_utils.pipelines import tuned_loader

    base = JpegDataset(n=3, progress=False)
    r = RepeatDataset(base, 8)
    assert list(r.labels) == [int(base.labels[i % 3]) for i in range(8)]
    assert np.array_equal(r.encoded(5), base.encoded(2))
    images, labels = next(iter(tuned_loader(r, batch_size=8, size=16, num_workers=0)))
    assert images.shape == (8, 3, 16, 16) and images.dtype == torch.uint8 and len(labels) == 8
    import pickle as _pickle
    clone = _pickle.loads(_pickle.dumps(r))
    assert np.array_equal(clone.encoded(4), base.encoded(1))
    with pytest.raises(TypeError, match="JpegDataset"):
        RepeatDataset([1, 2], 3).encoded(0)
