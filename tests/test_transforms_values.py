"""course_utils.transforms and course_utils.image_ops on hand-worked pixels: the resize's
half-up rounding and (width, height) order, the crop's box on a non-square image, the
normalisation constants, the tolerance verdict on both sides of both limits, the per-channel
grey levels of output_difference, the flip draw on both sides of flip_p, and the per-process
seeding of PerProcessRandom."""
from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
import torch

from course_utils import device as device_mod
from course_utils import transforms
from course_utils.image_ops import check_hwc, rgb_triple
from course_utils.transforms import (OutputDifference, PerProcessRandom, PipelineParams,
                                     ReferenceTransform, Stage, ToFloat32, Uint8Transform,
                                     center_crop, crop_box, exact_pipeline, normalize_batch,
                                     numpy_normalize, numpy_resize, numpy_to_chw,
                                     opencv_normalize, opencv_resize, opencv_to_chw,
                                     output_difference, pipeline_stages, resized_hw,
                                     run_pipeline, torch_center_crop, torch_from_image,
                                     torch_normalize, torch_resize)

pytestmark = pytest.mark.timeout(60)


# --- geometry -------------------------------------------------------------------------------------

def test_resized_hw_truncates_the_longer_side():
    # 2 x 3 to shorter 3: 3 * 3 / 2 = 4.5 -> 4 (truncated; rounding half up would give 5)
    assert resized_hw(2, 3, 3) == (3, 4)
    assert resized_hw(3, 2, 3) == (4, 3)
    # 3 x 5 to 7: 7 * 5 / 3 = 11.67 -> 11 (rounding would give 12)
    assert resized_hw(3, 5, 7) == (7, 11) and resized_hw(5, 3, 7) == (11, 7)
    assert resized_hw(4, 4, 2) == (2, 2)
    assert PipelineParams(resize=7, crop=7).resized_hw(5, 3) == (11, 7)


def test_crop_box_on_a_non_square_image_and_its_bounds():
    # (10 - 4) / 2 = 3, (20 - 4) / 2 = 8
    assert crop_box(10, 20, 4) == (3, 8)
    assert crop_box(20, 10, 4) == (8, 3)
    # 4 fits exactly in 4 rows; 5 does not fit in 4 rows nor in 4 columns
    assert crop_box(4, 9, 4) == (0, 2)              # (9 - 4) / 2 = 2.5 -> 2 (half to even)
    with pytest.raises(ValueError, match="larger than the image"):
        crop_box(4, 9, 5)
    with pytest.raises(ValueError, match="larger than the image"):
        crop_box(9, 4, 5)
    assert PipelineParams(resize=8, crop=4).crop_box(10, 20) == (3, 8)


def test_center_crop_takes_the_middle_rows_and_columns():
    img = np.arange(6 * 8 * 3, dtype=np.uint8).reshape(6, 8, 3)
    out = center_crop(img, 2)                         # top (6-2)/2 = 2, left (8-2)/2 = 3
    assert np.array_equal(out, img[2:4, 3:5])
    t = torch_center_crop(torch_from_image(img), 2)
    assert torch.equal(t, torch.from_numpy(img[2:4, 3:5]).permute(2, 0, 1))


def test_numpy_resize_rounds_half_up():
    """A row 0, 2 widened to 4 columns: half-pixel centres at -0.25, 0.25, 0.75, 1.25 of the
    source, clipped to 0..1: 0, 0.5, 1.5, 2 -> rounded half up 0, 1, 2, 2 (truncation would give
    0, 0, 1, 2 and half-to-even 0, 0, 2, 2)."""
    img = np.zeros((1, 2, 3), np.uint8)
    img[0, 1] = 2
    out = numpy_resize(img, (1, 4))
    assert out.dtype == np.uint8 and out[0, :, 0].tolist() == [0, 1, 2, 2]
    f = numpy_resize(img.astype(np.float32), (1, 4))
    assert f.dtype == np.float32 and f[0, :, 1].tolist() == [0.0, 0.5, 1.5, 2.0]
    # rows too: a column 0, 2 made 4 rows tall
    col = np.zeros((2, 1, 3), np.uint8)
    col[1, 0] = 2
    assert numpy_resize(col, (4, 1))[:, 0, 2].tolist() == [0, 1, 2, 2]


def test_resize_sizes_are_height_then_width():
    img = np.zeros((4, 6, 3), np.uint8)
    assert numpy_resize(img, (2, 3)).shape == (2, 3, 3)
    assert opencv_resize(img, (2, 3)).shape == (2, 3, 3)
    assert tuple(torch_resize(torch_from_image(img), (2, 3)).shape) == (3, 2, 3)


# --- normalisation -------------------------------------------------------------------------------

def test_normalize_uses_each_channels_mean_and_std():
    """Pixel (102, 51, 0) with mean (0.2, 0.4, 0.1), std (0.5, 0.25, 0.2):
    R (0.4 - 0.2) / 0.5 = 0.4; G (0.2 - 0.4) / 0.25 = -0.8; B (0 - 0.1) / 0.2 = -0.5."""
    mean, std = (0.2, 0.4, 0.1), (0.5, 0.25, 0.2)
    img = np.zeros((1, 2, 3), np.uint8)
    img[..., 0], img[..., 1] = 102, 51
    want = [0.4, -0.8, -0.5]
    assert numpy_normalize(img, mean, std)[0, 0].tolist() == pytest.approx(want, abs=1e-6)
    assert opencv_normalize(img, mean, std)[0, 1].tolist() == pytest.approx(want, abs=1e-6)
    assert torch_normalize(torch_from_image(img), mean, std)[:, 0, 0].tolist() == pytest.approx(want, abs=1e-6)
    batch = torch.from_numpy(img).permute(2, 0, 1)[None].contiguous()
    p = PipelineParams(resize=2, crop=1, mean=mean, std=std)
    assert normalize_batch(batch, p)[0, :, 0, 1].tolist() == pytest.approx(want, abs=1e-6)


def test_normalize_batch_builds_its_constants_afresh(monkeypatch):
    monkeypatch.setattr(device_mod, "_CONSTANTS", {})
    p = PipelineParams(resize=2, crop=1, mean=(0.2, 0.4, 0.1), std=(0.5, 0.25, 0.2))
    batch = torch.full((1, 3, 1, 1), 51, dtype=torch.uint8)
    # 51 / 255 = 0.2: R 0, G (0.2 - 0.4) / 0.25 = -0.8, B (0.2 - 0.1) / 0.2 = 0.5
    assert normalize_batch(batch, p).flatten().tolist() == pytest.approx([0.0, -0.8, 0.5], abs=1e-6)
    out = normalize_batch(torch.zeros(2, 3, 1, 1, dtype=torch.uint8, device="meta"), p)
    assert out.device.type == "meta" and out.dtype == torch.float32
    with pytest.raises(TypeError, match="normalize_batch"):
        normalize_batch(torch.zeros(3, 1, 1, dtype=torch.uint8), p)
    with pytest.raises(TypeError, match="normalize_batch"):
        normalize_batch(torch.zeros(1, 4, 1, 1, dtype=torch.uint8), p)


def test_to_chw_keeps_uint8_and_float32():
    img = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    for fn in (numpy_to_chw, opencv_to_chw):
        u = fn(img)
        assert u.dtype == torch.uint8 and torch.equal(u, torch.from_numpy(img).permute(2, 0, 1))
        f = fn(img.astype(np.float32))
        assert f.dtype == torch.float32 and f.is_contiguous() and tuple(f.shape) == (3, 2, 3)
        assert f[2, 1, 0].item() == float(img[1, 0, 2])


def test_torch_from_image_is_a_view_even_of_a_flipped_array():
    img = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    t = torch_from_image(img)
    img[0, 0, 0] = 200
    assert t[0, 0, 0].item() == 200                  # shares memory
    flipped = img[:, ::-1]
    tf = torch_from_image(flipped)
    assert torch.equal(tf, torch.from_numpy(np.ascontiguousarray(flipped)).permute(2, 0, 1))


def test_rgb_triple_and_check_hwc_bounds():
    assert rgb_triple("mean", (0, -1, 2), "w", positive=False) == (0.0, -1.0, 2.0)
    assert rgb_triple("std", (1e-9, 1, 2), "w", positive=True)[0] == 1e-9
    with pytest.raises(ValueError, match="> 0"):
        rgb_triple("std", (0.0, 1, 2), "w", positive=True)
    with pytest.raises(ValueError, match="finite"):
        rgb_triple("mean", (0, float("nan"), 2), "w", positive=False)
    with pytest.raises(ValueError, match="three finite"):
        rgb_triple("mean", (0, 1, 2, 3), "w", positive=False)
    with pytest.raises(TypeError, match="^w: mean must be three numbers"):
        rgb_triple("mean", 5, "w", positive=False)
    f = np.zeros((2, 2, 3), np.float32)
    assert check_hwc(f, "w") is f
    with pytest.raises(ValueError, match="uint8, got float32"):
        check_hwc(f, "w", uint8_only=True)


# --- params, stages ----------------------------------------------------------------------------

def test_params_crop_equal_to_resize_and_flip_p_bounds():
    assert PipelineParams(resize=5, crop=5).crop == 5
    with pytest.raises(ValueError, match="crop=6 is larger than resize=5"):
        PipelineParams(resize=5, crop=6)
    assert PipelineParams(flip_p=0).flip_p == 0.0 and isinstance(PipelineParams(flip_p=1).flip_p, float)
    for bad in (True, -0.01, 1.01, "0.5"):
        with pytest.raises(ValueError, match="flip_p"):
            PipelineParams(flip_p=bad)
    p = PipelineParams(mean=[0.1, 0.2, 0.3], std=[1, 2, 3])
    assert p.mean == (0.1, 0.2, 0.3) and p.std == (1.0, 2.0, 3.0)


def test_pipeline_stages_in_order():
    names = lambda b, **k: [n for n, _ in pipeline_stages(b, **k)]       # noqa: E731
    assert names("numpy") == ["resize", "crop", "normalize", "to CHW"]
    assert names("opencv", flip=True) == ["resize", "crop", "flip", "normalize", "to CHW"]
    assert names("torch", flip=True, normalize=False) == ["to tensor", "resize", "crop", "flip", "to CHW"]
    with pytest.raises(ValueError, match="backend='jax'"):
        pipeline_stages("jax")
    with pytest.raises(ValueError, match="not a numpy stage"):
        Stage("numpy", "to tensor")
    assert repr(Stage("torch", "to tensor")) == "Stage('torch', 'to tensor')"


def test_stages_use_the_params_sizes_on_a_non_square_image():
    p = PipelineParams(resize=4, crop=3, mean=(0.2, 0.2, 0.2), std=(0.5, 0.5, 0.5))
    img = np.full((6, 9, 3), 102, np.uint8)
    for backend in ("numpy", "opencv", "torch"):
        out = run_pipeline(backend, img, params=p)
        assert tuple(out.shape) == (3, 3, 3)
        assert torch.allclose(out, torch.full((3, 3, 3), 0.4), atol=1e-5)   # (0.4 - 0.2) / 0.5
        x = img
        for name, stage in pipeline_stages(backend, p):
            x = stage(x)
            if name == "resize":
                shape = tuple(x.shape[-2:]) if isinstance(x, torch.Tensor) else x.shape[:2]
                assert shape == (4, 6)                                         # 4 * 9 / 6 = 6
    u8 = run_pipeline("torch", img, params=p, normalize=False)
    assert u8.dtype == torch.uint8 and int(u8[0, 0, 0]) == 102


def test_run_pipeline_and_exact_pipeline_flip_only_when_asked():
    img = np.zeros((4, 4, 3), np.uint8)
    img[:, 0] = 255
    p = PipelineParams(resize=4, crop=4)
    for fn in (exact_pipeline, lambda i, f, q: run_pipeline("numpy", i, f, q)):
        plain, flipped = fn(img, False, p), fn(img, True, p)
        assert plain[0, 0, 0] > plain[0, 0, 3] and flipped[0, 0, 3] > flipped[0, 0, 0]
    assert run_pipeline("numpy", img, 1, p)[0, 0, 3] > run_pipeline("numpy", img, 0, p)[0, 0, 3]


# --- the tolerance verdict -------------------------------------------------------------------------

@pytest.mark.parametrize("max_abs, mean, ok", [
    (1.0, 0.0, True), (1.0009, 0.0, True), (1.0011, 0.0, False),
    (0.5, 0.25, True), (0.5, -0.25, True), (0.5, 0.2501, False), (0.5, -0.2501, False),
])
def test_within_tolerance_both_sides_of_both_limits(max_abs, mean, ok):
    d = OutputDifference(max_abs_levels=max_abs, mean_levels=mean, mean_abs_levels=abs(mean))
    assert d.within_tolerance is ok
    assert ("OUT OF TOLERANCE" in str(d)) is (not ok)


def test_within_tolerance_uses_the_given_limits():
    d = OutputDifference(2.0, 0.4, 0.4, max_allowed=2.0, mean_allowed=0.5)
    assert d.within_tolerance
    assert not OutputDifference(2.0, 0.4, 0.4, max_allowed=1.9, mean_allowed=0.5).within_tolerance
    assert not OutputDifference(2.0, 0.4, 0.4, max_allowed=2.0, mean_allowed=0.3).within_tolerance


def test_output_difference_in_grey_levels_per_channel():
    """a - b = 0.01 in R, -0.02 in G, 0 in B with std (0.2, 0.4, 0.1): 0.01 * 0.2 * 255 = 0.51
    levels, -0.02 * 0.4 * 255 = -2.04, 0: max |d| 2.04, mean (0.51 - 2.04 + 0) / 3 = -0.51,
    mean |d| (0.51 + 2.04) / 3 = 0.85."""
    p = PipelineParams(std=(0.2, 0.4, 0.1))
    a = torch.zeros(3, 2, 2)
    b = torch.zeros(3, 2, 2)
    a[0] += 0.01
    b[1] += 0.02
    d = output_difference(a, b, p)
    assert d.max_abs_levels == pytest.approx(2.04) and d.mean_levels == pytest.approx(-0.51)
    assert d.mean_abs_levels == pytest.approx(0.85)
    assert output_difference(b, a, p).mean_levels == pytest.approx(0.51)          # a - b, not b - a
    d4 = output_difference(a[None].numpy(), b[None].numpy(), p)
    assert d4.max_abs_levels == pytest.approx(2.04)
    empty = output_difference(torch.zeros(0, 3, 2, 2), torch.zeros(0, 3, 2, 2))
    assert (empty.max_abs_levels, empty.mean_levels, empty.mean_abs_levels) == (0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="same pipeline"):
        output_difference(a, b[:, :1], p)
    with pytest.raises(ValueError, match=r"\(3, H, W\)"):
        output_difference(torch.zeros(4, 2, 2), torch.zeros(4, 2, 2))
    with pytest.raises(ValueError, match=r"\(3, H, W\)"):
        output_difference(torch.zeros(3, 2), torch.zeros(3, 2))
    with pytest.raises(TypeError, match="b must be a tensor"):
        output_difference(a, [1, 2])


# --- random flips, per process ------------------------------------------------------------------------

class Scripted(np.random.Generator):
    def __init__(self, values):
        super().__init__(np.random.PCG64(0))
        self.values = list(values)
        self.draws = 0

    def random(self, size=None, dtype=np.float64, out=None):
        self.draws += 1
        return self.values.pop(0)


def _with_rng(t, rng):
    t._rng, t._pid = rng, os.getpid()
    return t


def test_draw_flip_both_sides_of_flip_p_and_no_draw_at_0_and_1():
    t = _with_rng(ReferenceTransform(params=PipelineParams(flip_p=0.3)), Scripted([0.2999, 0.3]))
    assert t.draw_flip() is True and t.draw_flip() is False
    for p, want in ((0.0, False), (1.0, True)):
        rng = Scripted([0.5])
        t = _with_rng(ReferenceTransform(params=PipelineParams(flip_p=p)), rng)
        assert t.draw_flip() is want and rng.draws == 0


def test_reference_and_uint8_transforms_apply_the_drawn_flip():
    img = np.zeros((4, 4, 3), np.uint8)
    img[:, 0] = 255
    p = PipelineParams(resize=4, crop=4, flip_p=0.5)
    t = _with_rng(ReferenceTransform("numpy", p), Scripted([0.1, 0.9]))
    assert torch.equal(t(img), run_pipeline("numpy", img, True, p))
    assert torch.equal(t(img), run_pipeline("numpy", img, False, p))
    u = _with_rng(Uint8Transform("torch", p), Scripted([0.1]))
    out = u(img)
    assert out.dtype == torch.uint8 and int(out[0, 0, 3]) == 255 and int(out[0, 0, 0]) == 0
    assert ToFloat32()(out)[0, 0, 3].item() == pytest.approx(1.0)


def test_per_process_random_seeding(monkeypatch):
    """Main process: seed s -> default_rng([s]); in a worker: [s, worker seed % 2**63]; no seed:
    [torch.initial_seed()]. A new process id makes a new generator."""
    first = lambda entropy: np.random.default_rng(entropy).random()        # noqa: E731
    r = PerProcessRandom(7)
    assert r._generator().random() == first([7])
    g = r._generator()
    assert r._generator() is g
    monkeypatch.setattr(os, "getpid", lambda: -5)                        # another process
    assert r._generator() is not g and r._pid == -5

    class Info:
        seed = 2**63 + 11

    monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: Info())
    assert PerProcessRandom(7)._generator().random() == first([7, 11])
    monkeypatch.setattr(torch, "initial_seed", lambda: 99)
    assert PerProcessRandom(None)._generator().random() == first([99])
    state = r.__getstate__()
    assert state["_rng"] is None and state["_pid"] is None and state["seed"] == 7
    with pytest.raises(ValueError, match="^MyT: seed"):
        PerProcessRandom(-1, owner="MyT")


# --- errors name the function; defaults; views and copies ------------------------------------------

from course_utils.transforms import (numpy_hflip, numpy_pipeline, opencv_pipeline,  # noqa: E402
                                     torch_hflip, torch_pipeline, torch_to_chw)


@pytest.mark.parametrize("call, start", [
    (lambda: exact_pipeline(np.zeros((4, 4, 3), np.float32)), "exact_pipeline: image must be uint8"),
    (lambda: exact_pipeline(np.zeros((4, 4, 3), np.uint8), params=3), "exact_pipeline: params"),
    (lambda: output_difference(torch.zeros(3, 1, 1), torch.zeros(3, 1, 1), params=3), "output_difference: params"),
    (lambda: output_difference([1], torch.zeros(3, 1, 1)), "output_difference: a must be a tensor or array of normalised values, got list"),
    (lambda: normalize_batch(torch.zeros(1, 3, 1, 1), params=3), "normalize_batch: params"),
    (lambda: normalize_batch([1]), "normalize_batch: batch must be an (N, 3, H, W) tensor, got list"),
    (lambda: normalize_batch(torch.zeros(3, 1, 1)), "normalize_batch: batch must be an (N, 3, H, W) tensor, got torch.Size([3, 1, 1])"),
    (lambda: torch_resize([1], (2, 2)), "torch_resize: x must be a (3, H, W) torch.Tensor (see torch_from_image), got list"),
    (lambda: torch_center_crop(torch.zeros(4, 4), 2), "torch_center_crop: x"),
    (lambda: torch_to_chw(torch.zeros(4, 4)), "torch_to_chw: x"),
    (lambda: torch_normalize(torch.zeros(4, 4)), "torch_normalize: x"),
    (lambda: numpy_hflip(np.zeros((4, 4))), "numpy_hflip: image"),
    (lambda: numpy_normalize(np.zeros((4, 4))), "numpy_normalize: image"),
    (lambda: opencv_normalize(np.zeros((4, 4))), "opencv_normalize: image"),
    (lambda: opencv_to_chw(np.zeros((4, 4))), "opencv_to_chw: image"),
    (lambda: torch_from_image(np.zeros((4, 4))), "torch_from_image: image"),
    (lambda: ToFloat32()([1]), "ToFloat32: x must be a torch.Tensor, got list"),
])
def test_every_error_names_the_function(call, start):
    with pytest.raises((ValueError, TypeError)) as info:
        call()
    assert str(info.value).startswith(start), str(info.value)


def test_pipelines_do_not_flip_by_default_and_use_the_params_given():
    img = np.repeat((np.arange(9, dtype=np.uint8) * 28)[None, :, None], 6, 0).repeat(3, 2)  # a ramp
    p = PipelineParams(resize=4, crop=3)
    for fn in (numpy_pipeline, opencv_pipeline, torch_pipeline):
        out = fn(img, params=p)
        assert tuple(out.shape) == (3, 3, 3)
        assert torch.equal(out, fn(img, False, p)) and not torch.equal(out, fn(img, True, p))
    e = exact_pipeline(np.full((6, 9, 3), 255, np.uint8), params=PipelineParams(resize=4, crop=3, std=(0.5, 0.5, 0.5)))
    # white columns: (1 - 0.485) / 0.5 = 1.03 in R (the default std 0.229 would give 2.249)
    assert e[0, 0, 0].item() == pytest.approx(1.03, abs=1e-5)


def test_output_difference_subtracts_in_float_not_in_uint8():
    """uint8 outputs 0 and 1: a - b = -1 (not 255 wrapped) times 255 * std per channel."""
    p = PipelineParams(std=(0.2, 0.4, 0.1))
    d = output_difference(torch.zeros(3, 1, 1, dtype=torch.uint8), torch.ones(3, 1, 1, dtype=torch.uint8), p)
    # -(0.2 + 0.4 + 0.1) * 255 / 3 = -59.5; max |d| 0.4 * 255 = 102
    assert d.mean_levels == pytest.approx(-59.5) and d.max_abs_levels == pytest.approx(102.0)


def test_torch_normalize_leaves_a_float32_input_untouched():
    x = torch.full((3, 1, 1), 51.0)
    out = torch_normalize(x, (0.2, 0.2, 0.2), (0.5, 0.5, 0.5))
    assert x.flatten().tolist() == [51.0] * 3 and out.flatten().tolist() == pytest.approx([0.0] * 3, abs=1e-6)


def test_torch_from_image_keeps_a_broadcast_array_as_a_view():
    """Zero strides (np.broadcast_to) are not negative: the tensor is a view of the same memory."""
    base = np.arange(3, dtype=np.uint8)
    img = np.broadcast_to(base, (2, 2, 3))
    with warnings.catch_warnings():                      # torch warns (once): not writable
        warnings.simplefilter("ignore", UserWarning)
        t = torch_from_image(img)
    assert t.data_ptr() == base.ctypes.data and t[2, 1, 1].item() == 2


def test_last_edges_seed_zero_shorter_side_one_and_more_error_names():
    assert PerProcessRandom(0).seed == 0                     # 0 is a seed, not "no seed"
    assert resized_hw(5, 5, 1) == (1, 1) and resized_hw(6, 5, 1) == (1, 1)
    img = np.repeat((np.arange(4, dtype=np.uint8) * 60)[None, :, None], 4, 0).repeat(3, 2)
    p = PipelineParams(resize=4, crop=4)
    assert torch.equal(run_pipeline("numpy", img, params=p), run_pipeline("numpy", img, False, p))
    for call, start in ((lambda: PipelineParams(resize=0), "PipelineParams: resize"),
                        (lambda: PipelineParams(mean=(1, 2)), "PipelineParams: mean"),
                        (lambda: PipelineParams(std=(1, 0, 1)), "PipelineParams: std"),
                        (lambda: Stage("jax", "resize"), "Stage: backend"),
                        (lambda: Stage("numpy", "resize", params=3), "Stage: params"),
                        (lambda: pipeline_stages("numpy", params=3), "pipeline_stages: params"),
                        (lambda: run_pipeline("numpy", np.zeros((4, 4, 3), np.float32)), "run_pipeline('numpy'): image"),
                        (lambda: center_crop(np.zeros((4, 4)), 2), "center_crop: image"),
                        (lambda: opencv_resize(np.zeros((4, 4)), (2, 2)), "opencv_resize: image"),
                        (lambda: ReferenceTransform("jax"), "ReferenceTransform: backend"),
                        (lambda: Uint8Transform(params=3), "Uint8Transform: params")):
        with pytest.raises((ValueError, TypeError)) as info:
            call()
        assert str(info.value).startswith(start), str(info.value)
