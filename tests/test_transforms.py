"""The reference pipeline, three ways: equal within the stated tolerance; transforms work in workers."""
from __future__ import annotations

import pickle
import subprocess
import sys

import cv2
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from course_utils.data import JpegDataset, decode_jpeg
from course_utils.transforms import (BACKENDS, IMAGENET_MEAN, IMAGENET_STD, MAX_DIFF_LEVELS,
                                     MEAN_DIFF_LEVELS, OutputDifference, PipelineParams,
                                     ReferenceTransform, Stage, ToFloat32, Uint8Transform,
                                     center_crop, crop_box, exact_pipeline, normalize_batch,
                                     numpy_hflip, numpy_normalize, numpy_pipeline, numpy_resize,
                                     numpy_to_chw, opencv_hflip, opencv_normalize, opencv_pipeline,
                                     opencv_resize, opencv_to_chw, output_difference,
                                     pipeline_stages, resized_hw, run_pipeline, torch_center_crop,
                                     torch_from_image, torch_hflip, torch_normalize, torch_pipeline,
                                     torch_resize, torch_to_chw)

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def images():
    ds = JpegDataset(n=12, seed=3, progress=False)
    return [ds[i][0] for i in range(len(ds))]


def _rand(h, w, seed=0):
    return np.random.default_rng(seed).integers(0, 256, size=(h, w, 3), dtype=np.uint8)


# ---- parameters ----------------------------------------------------------------------------

def test_params_defaults_and_geometry():
    p = PipelineParams()
    assert (p.resize, p.crop, p.mean, p.std, p.flip_p) == (256, 224, IMAGENET_MEAN, IMAGENET_STD, 0.5)
    assert p.resized_hw(300, 400) == (256, 341)       # int(256 * 400 / 300) = 341
    assert p.resized_hw(400, 300) == (341, 256)
    assert p.resized_hw(100, 100) == (256, 256)       # upscaling too
    assert resized_hw(480, 640, 240) == (240, 320)
    assert p.crop_box(256, 341) == (16, 58)           # round(117 / 2) = 58 (half to even)
    assert crop_box(224, 224, 224) == (0, 0)
    assert hash(p) == hash(PipelineParams())          # frozen, hashable, picklable
    assert pickle.loads(pickle.dumps(p)) == p


@pytest.mark.parametrize("kwargs, message", [
    (dict(resize=200, crop=224), r"crop=224 is larger than resize=200"),
    (dict(resize=0), r"resize=0 is too small: resize must be >= 1"),
    (dict(crop=2.5), r"crop must be an int >= 1"),
    (dict(mean=(0.5, 0.5)), r"mean must be three finite numbers"),
    (dict(std=(0.2, 0.0, 0.2)), r"std=.* must be > 0"),
    (dict(std="abc"), r"std must be three numbers"),
    (dict(flip_p=1.5), r"flip_p=1.5 must be a probability"),
])
def test_params_bad_values_are_clear_errors(kwargs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        PipelineParams(**kwargs)


def test_crop_larger_than_image_is_a_clear_error():
    with pytest.raises(ValueError, match="larger than the image"):
        crop_box(100, 300, 224)


# ---- resize --------------------------------------------------------------------------------

@pytest.mark.parametrize("src, dst", [((300, 400), (256, 341)), ((120, 90), (341, 256)),
                                      ((64, 64), (32, 32)), ((57, 91), (57, 91)), ((5, 7), (3, 2))])
def test_numpy_resize_is_bilinear_half_pixel_like_torch_and_opencv(src, dst):
    img = _rand(*src, seed=sum(src))
    # float input: exact bilinear, equal to torch's float kernel up to float32 rounding
    ours = numpy_resize(img.astype(np.float32), dst)
    assert ours.dtype == np.float32 and ours.shape == (*dst, 3)
    theirs = F.interpolate(torch.from_numpy(img).permute(2, 0, 1)[None].float(), size=dst,
                           mode="bilinear", align_corners=False, antialias=False)[0]
    assert np.abs(ours - theirs.permute(1, 2, 0).numpy()).max() < 0.02
    cv_float = cv2.resize(img.astype(np.float32), dst[::-1], interpolation=cv2.INTER_LINEAR)
    assert np.abs(ours - cv_float).max() < 0.02
    # uint8 input: rounded, within one grey level of OpenCV's fixed-point result
    u8 = numpy_resize(img, dst)
    assert u8.dtype == np.uint8
    assert np.abs(u8.astype(int) - np.floor(ours + 0.5).astype(int)).max() == 0
    assert np.abs(u8.astype(int) - opencv_resize(img, dst).astype(int)).max() <= 1


def test_same_size_resize_is_identity():
    img = _rand(40, 50)
    assert np.array_equal(numpy_resize(img, (40, 50)), img)
    assert np.array_equal(opencv_resize(img, (40, 50)), img)
    assert torch.equal(torch_resize(torch_from_image(img), (40, 50)), torch_from_image(img))


@pytest.mark.parametrize("fn, arg, message", [
    (numpy_resize, [[1, 2, 3]], r"numpy_resize: image must be an \(H, W, 3\) NumPy array"),
    (numpy_resize, np.zeros((4, 4), np.uint8), r"must have shape \(H, W, 3\)"),
    (numpy_resize, np.zeros((4, 4, 3), np.int64), r"must be uint8 or float32, got int64"),
    (opencv_hflip, torch.zeros(3, 4, 4), r"opencv_hflip: image must be an \(H, W, 3\) NumPy array"),
    (torch_hflip, np.zeros((4, 4, 3), np.uint8), r"torch_hflip: x must be a \(3, H, W\) torch.Tensor"),
    (torch_normalize, torch.zeros(4, 4, 3), r"must have shape \(3, H, W\)"),
    (torch_resize, torch.zeros(3, 4, 4, dtype=torch.int64), r"uint8 or float32, got \(3, 4, 4\) torch.int64"),
])
def test_bad_inputs_name_the_function_and_the_fix(fn, arg, message):
    args = (arg, (2, 2)) if fn in (numpy_resize, torch_resize) else (arg,)
    with pytest.raises((TypeError, ValueError), match=message):
        fn(*args)


# ---- the other ops -------------------------------------------------------------------------

def test_crop_flip_normalize_chw_agree_between_backends():
    img = _rand(30, 40, seed=7)
    t = torch_from_image(img)
    assert t.shape == (3, 30, 40) and t.data_ptr() == torch.from_numpy(img).data_ptr()  # a view
    crop = center_crop(img, 20)
    assert np.shares_memory(crop, img)                                     # a view too
    assert torch.equal(torch_center_crop(t, 20), torch_from_image(np.ascontiguousarray(crop)))
    flipped = img[:, ::-1]
    assert np.array_equal(numpy_hflip(img), flipped) and numpy_hflip(img).flags.c_contiguous
    assert np.array_equal(opencv_hflip(img), flipped)
    assert torch.equal(torch_hflip(t), torch_from_image(np.ascontiguousarray(flipped)))
    n_np = numpy_normalize(img)
    n_cv = opencv_normalize(img)
    n_t = torch_normalize(t)
    expected = (img.astype(np.float64) / 255 - np.array(IMAGENET_MEAN)) / np.array(IMAGENET_STD)
    for out in (n_np, n_cv, n_t.permute(1, 2, 0).numpy()):
        assert out.dtype == np.float32
        assert np.abs(out - expected).max() < 1e-5
    for chw in (numpy_to_chw(n_np), opencv_to_chw(n_cv), torch_to_chw(n_t)):
        assert chw.shape == (3, 30, 40) and chw.is_contiguous() and chw.dtype == torch.float32
        assert torch.allclose(chw, torch.from_numpy(expected.transpose(2, 0, 1)).float(), atol=1e-5)
    assert numpy_to_chw(img).dtype == torch.uint8 and opencv_to_chw(img).dtype == torch.uint8


# ---- the three pipelines -------------------------------------------------------------------

def test_three_pipelines_equal_the_exact_pipeline_within_tolerance(images):
    assert MAX_DIFF_LEVELS == 1.0 and MEAN_DIFF_LEVELS == 0.25
    for img in images:
        for flip in (False, True):
            ref = exact_pipeline(img, flip)
            assert ref.shape == (3, 224, 224) and ref.dtype == torch.float32
            outs = {"numpy": numpy_pipeline(img, flip), "opencv": opencv_pipeline(img, flip),
                    "torch": torch_pipeline(img, flip)}
            for name, out in outs.items():
                assert out.shape == (3, 224, 224) and out.dtype == torch.float32, name
                assert out.is_contiguous(), name
                diff = output_difference(out, ref)
                assert diff.within_tolerance, f"{name}: {diff}"
            # and pairwise: at most one grey level apart
            for a in BACKENDS:
                for b in BACKENDS:
                    assert output_difference(outs[a], outs[b]).max_abs_levels <= 1.001


def test_flip_changes_the_output_and_mirrors_it(images):
    img = images[0]
    for backend in BACKENDS:
        plain = run_pipeline(backend, img, False)
        mirrored = run_pipeline(backend, img, True)
        assert not torch.equal(plain, mirrored)
        assert torch.equal(plain.flip(-1), mirrored), backend   # same pixels, mirrored exactly


def test_truncation_bias_is_out_of_tolerance(images):
    """What the mean tolerance is for: astype(uint8) after a float resize is ~0.5 level low."""
    p = PipelineParams()
    img = images[1]
    resized = numpy_resize(img.astype(np.float32), p.resized_hw(*img.shape[:2])).astype(np.uint8)
    out = numpy_to_chw(numpy_normalize(center_crop(resized, p.crop)))
    diff = output_difference(out, exact_pipeline(img))
    assert diff.max_abs_levels <= 1.001 and diff.mean_levels < -0.3
    assert not diff.within_tolerance
    assert "OUT OF TOLERANCE" in str(diff)


def test_output_difference_is_in_grey_levels():
    ref = torch.zeros(3, 4, 4)
    one_level = torch.tensor([1 / (255 * s) for s in IMAGENET_STD]).view(3, 1, 1).expand(3, 4, 4)
    d = output_difference(ref + one_level, ref)
    assert isinstance(d, OutputDifference)
    assert abs(d.max_abs_levels - 1) < 1e-6 and abs(d.mean_levels - 1) < 1e-6
    assert abs(output_difference(ref.numpy(), ref).max_abs_levels) == 0   # arrays accepted
    with pytest.raises(ValueError, match="a has shape"):
        output_difference(torch.zeros(3, 4, 4), torch.zeros(3, 4, 5))
    with pytest.raises(TypeError, match="a must be a tensor or array"):
        output_difference("x", ref)


def test_stages_list_and_uint8_variant(images):
    names = [n for n, _ in pipeline_stages("torch", flip=True)]
    assert names == ["to tensor", "resize", "crop", "flip", "normalize", "to CHW"]
    assert [n for n, _ in pipeline_stages("numpy", normalize=False)] == ["resize", "crop", "to CHW"]
    img = images[2]
    for backend in BACKENDS:
        x = img
        for _, stage in pipeline_stages(backend, flip=True):
            x = stage(x)
        assert torch.equal(x, run_pipeline(backend, img, True))
        u8 = run_pipeline(backend, img, True, normalize=False)
        assert u8.dtype == torch.uint8 and u8.shape == (3, 224, 224) and u8.is_contiguous()
        stage = pipeline_stages(backend)[0][1]
        assert pickle.loads(pickle.dumps(stage)).name == stage.name


@pytest.mark.parametrize("call, message", [
    (lambda: run_pipeline("pillow", np.zeros((300, 300, 3), np.uint8)), r"backend='pillow' is not known"),
    (lambda: run_pipeline("numpy", np.zeros((300, 300, 3), np.float32)), r"must be uint8"),
    (lambda: Stage("numpy", "blur"), r"name='blur' is not a numpy stage"),
    (lambda: numpy_pipeline(np.zeros((300, 300, 3), np.uint8), params={"crop": 3}),
     r"params must be a PipelineParams"),
    (lambda: ReferenceTransform(seed=-1), r"ReferenceTransform: seed=-1 is too small"),
    (lambda: normalize_batch(torch.zeros(3, 4, 4, dtype=torch.uint8)), r"\(N, 3, H, W\)"),
])
def test_pipeline_bad_arguments(call, message):
    with pytest.raises((ValueError, TypeError), match=message):
        call()


def test_small_params_work():
    p = PipelineParams(resize=32, crop=24)
    img = _rand(50, 70)
    for backend in BACKENDS:
        out = run_pipeline(backend, img, True, p)
        assert out.shape == (3, 24, 24)
        assert output_difference(out, exact_pipeline(img, True, p), p).max_abs_levels <= 1.001


# ---- transforms ----------------------------------------------------------------------------

def test_transforms_draw_flips_from_a_seeded_generator(images):
    img = images[3]
    t = ReferenceTransform("numpy", seed=5)
    flips = [t.draw_flip() for _ in range(64)]
    assert 10 < sum(flips) < 54
    again = ReferenceTransform("numpy", seed=5)
    assert [again.draw_flip() for _ in range(64)] == flips          # reproducible in one process
    out = ReferenceTransform("opencv", seed=5)(img)
    assert out.dtype == torch.float32 and out.shape == (3, 224, 224)
    expected = opencv_pipeline(img, flips[0])
    assert torch.equal(out, expected)
    never = ReferenceTransform(params=PipelineParams(flip_p=0.0))
    always = ReferenceTransform(params=PipelineParams(flip_p=1.0))
    assert not any(never.draw_flip() for _ in range(20)) and all(always.draw_flip() for _ in range(20))
    u8 = Uint8Transform("torch", params=PipelineParams(flip_p=1.0))(img)
    assert u8.dtype == torch.uint8
    assert output_difference(normalize_batch(u8[None])[0], exact_pipeline(img, True)).within_tolerance
    assert "seed=5" in repr(t)


def test_transforms_pickle_without_their_generator():
    t = ReferenceTransform("torch", seed=1)
    t.draw_flip()
    clone = pickle.loads(pickle.dumps(t))
    assert clone._rng is None and clone.backend == "torch" and clone.seed == 1


def test_to_float32():
    x = torch.full((3, 2, 2), 255, dtype=torch.uint8)
    y = ToFloat32()(x)
    assert y.dtype == torch.float32 and torch.all(y == 1.0)
    with pytest.raises(TypeError, match="ToFloat32: x must be a torch.Tensor"):
        ToFloat32()(np.zeros(3))


class _Images(torch.utils.data.Dataset):
    def __init__(self, images, transform):
        self.images, self.transform = images, transform

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        return self.transform(self.images[i]), i


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_random_flips_in_real_workers_differ_per_worker_and_epoch(context):
    if context not in torch.multiprocessing.get_all_start_methods():
        pytest.skip(f"{context} not available")
    small = PipelineParams(resize=64, crop=48)
    ds = JpegDataset(n=24, seed=3, transform=Uint8Transform("opencv", small, seed=11), progress=False)
    plain = [run_pipeline("opencv", decode_jpeg(ds.encoded(i)), False, small, normalize=False)
             for i in range(len(ds))]
    mirrored = [x.flip(-1) for x in plain]
    loader = DataLoader(ds, batch_size=4, num_workers=2, timeout=60,
                        multiprocessing_context=context)
    epochs = []
    for _ in range(2 if context == "fork" else 1):   # spawn starts slowly: one epoch is enough
        by_worker: dict[int, list[bool]] = {0: [], 1: []}
        for k, (batch, _) in enumerate(loader):   # batch k (samples 4k..4k+3) from worker k % 2
            for j, x in enumerate(batch):
                i = 4 * k + j
                assert torch.equal(x, plain[i]) or torch.equal(x, mirrored[i])
                by_worker[k % 2].append(bool(torch.equal(x, mirrored[i])))
        flips = by_worker[0] + by_worker[1]
        assert 0 < sum(flips) < len(flips), "flips should vary across samples"
        assert by_worker[0] != by_worker[1], "each worker should draw its own stream"
        epochs.append(flips)
    if len(epochs) == 2:
        assert epochs[0] != epochs[1], "a new epoch should draw new flips"


def test_import_has_no_side_effects():
    code = ("import torch, cv2; a = (torch.get_num_threads(), cv2.getNumThreads()); "
            "import course_utils.transforms, course_utils.grading.ex01_uint8_pipeline; "
            "b = (torch.get_num_threads(), cv2.getNumThreads()); assert a == b, (a, b); print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_normalize_batch_keeps_its_constants_on_the_device_once():
    # a constant moved to the GPU inside a step is a blocking copy (a hidden sync): cached per device
    from course_utils.transforms import _normalize_constants
    params = PipelineParams()
    first = _normalize_constants(params, torch.device("cpu"))
    assert all(a is b for a, b in zip(first, _normalize_constants(params, torch.device("cpu"))))
    u8 = torch.randint(0, 256, (2, 3, 4, 4), dtype=torch.uint8)
    again = normalize_batch(u8)
    expected = (u8.float() / 255 - torch.tensor(IMAGENET_MEAN).view(3, 1, 1)) / torch.tensor(IMAGENET_STD).view(3, 1, 1)
    assert torch.allclose(again, expected, atol=1e-5)
