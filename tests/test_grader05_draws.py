"""Exercise 05's judging code (course_utils.grading.ex05_augment): the value checks
(_check_values) on scripted answers whose flips and brightness factors are chosen by hand, so each
threshold (flip share 0.2..0.8, factor range +-2e-3, "evenly": 1 -+ b/2 and a mean within 0.12,
one draw: 1e-4) is tried just inside and just outside; the read-back (_fit, _analyse), the output
checks (_basic: 1 + 1e-3, -1e-3), the batching rule (_check_batched, with the call counts made
up) and the 'meta' device's error mapping (_check_meta), each called directly."""
from __future__ import annotations

import pytest
import torch

from course_utils.grading import ex05_augment as ex05
from course_utils.grading.checker import ExerciseFailed
from course_utils.grading.ex05_augment import make_test_batch
from _helpers import teaches
from course_utils.grading.checker import describe

CPU = torch.device("cpu")


def scripted(flip_count=None, factors=None, *, flips_follow_p=True, scale_with_b=True):
    """An answer that mirrors the first ``flip_count`` samples and scales sample i by
    ``factors[i]`` at brightness 0.4 (default: 0.6..1.4, spread out) and by the default spread
    scaled to the brightness asked for otherwise; ``scale_with_b=False``: the same factors
    whatever the brightness. Both are rolled by the generator's seed, so another seed differs."""
    def answer(batch, flip_p=0.5, brightness=0.4, generator=None):
        n = batch.shape[0]
        seed = generator.initial_seed() if generator is not None else 0
        k = n // 2 if flip_count is None else flip_count
        if flips_follow_p:
            k = 0 if flip_p == 0 else n if flip_p == 1 else k
        flip = torch.arange(n) < k
        default = 0.6 + 0.8 * (torch.arange(n, dtype=torch.float64) * 7 % n) / (n - 1)
        if factors is not None and (brightness == 0.4 or not scale_with_b):
            f = torch.tensor(factors, dtype=torch.float64)       # as given
        else:
            f = 1 + (default - 1) * brightness / 0.4 if scale_with_b else default
        flip, f = flip.roll(seed), f.roll(seed)
        out = torch.where(flip.view(-1, 1, 1, 1), batch.flip(3), batch)
        return (out * f.to(batch.dtype).view(-1, 1, 1, 1)).clamp(0, 1)
    return answer


def values(answer, n=64):
    return ex05._check_values(answer, CPU, n=n, side=12, seed=0)


def problem(answer, n=64):
    with pytest.raises(ExerciseFailed) as info:
        values(answer, n)
    assert info.value.expected and info.value.hint, str(info.value)     # seen: where it is shown
    return info.value


def spread(n, low, high, rest):
    """n factors: low, high and n - 2 of ``rest``."""
    return [low, high] + [rest] * (n - 2)


# ---- the test batch -------------------------------------------------------------------------

def test_the_test_batch_values_by_hand():
    x = make_test_batch(3, 4)
    # 0.05 + 0.3 * w/3 + 0.15 * h/3 + 0.05 * i/2 + 0.01 * c
    assert float(x[2, 1, 3, 0]) == pytest.approx(0.05 + 0.15 + 0.05 + 0.01)
    assert float(x[0, 0, 0, 1]) == pytest.approx(0.05 + 0.1)
    assert float(x[1, 2, 1, 0]) == pytest.approx(0.05 + 0.05 + 0.025 + 0.02)
    assert torch.all(x[..., 2:] == 0.95) and x.shape == (3, 3, 4, 4)
    assert make_test_batch(2, 4, dtype=torch.float16).dtype == torch.float16
    assert float(make_test_batch(64, 12)[..., :-2].max()) <= 0.57 + 1e-6   # the dark part


# ---- what _check_values reads back ----------------------------------------------------------

def test_a_scripted_right_answer_is_read_back_exactly():
    n = 64
    factors = [0.6 + 0.8 * ((i * 7) % n) / (n - 1) for i in range(n)]
    found = values(scripted(flip_count=20))
    assert found["flipped"] == 20 and found["n"] == 64
    assert found["factor_min"] == pytest.approx(0.6, abs=1e-5)
    assert found["factor_max"] == pytest.approx(1.4, abs=1e-5)
    assert found["factor_mean"] == pytest.approx(sum(factors) / n, abs=1e-5)


def test_the_share_mirrored_must_lie_between_a_fifth_and_four_fifths():
    # 20 samples: 4 is exactly 0.2 and 16 exactly 0.8, both allowed
    assert values(scripted(flip_count=4), n=20)["flipped"] == 4
    assert values(scripted(flip_count=16), n=20)["flipped"] == 16
    err = problem(scripted(flip_count=3), n=20)
    assert err.problem == "on cpu: 3 of 20 samples were mirrored with flip_p=0.5." and err.seen == "15% mirrored"
    err = problem(scripted(flip_count=17), n=20)
    assert "17 of 20 samples were mirrored" in err.problem


def test_none_or_all_mirrored_is_one_decision_for_the_batch():
    assert "none of the 20 samples were mirrored" in problem(scripted(flip_count=0), n=20).problem
    err = problem(scripted(flip_count=20), n=20)
    assert "all of the 20 samples were mirrored" in err.problem and err.seen == "20 of 20 mirrored"
    assert "about 10 of 20" in err.expected
    assert values(scripted(flip_count=1), n=4)["flipped"] == 1          # 1 of 4 = 0.25


def test_flip_p_zero_and_one_must_be_honoured():
    err = problem(scripted(flip_count=10, flips_follow_p=False), n=20)
    assert err.problem == "on cpu: with flip_p=0.0, 10 of 20 samples were mirrored."
    assert err.expected == "0 of 20 mirrored"


def test_the_factors_may_overshoot_the_range_by_two_thousandths_and_no_more():
    n = 64
    assert values(scripted(factors=spread(n, 0.5985, 1.4, 1.0)))["factor_min"] == pytest.approx(0.5985, abs=1e-5)
    assert values(scripted(factors=spread(n, 0.6, 1.4015, 1.0)))["factor_max"] == pytest.approx(1.4015, abs=1e-5)
    err = problem(scripted(factors=spread(n, 0.5975, 1.4, 1.0)))
    assert "factors outside [1 - brightness, 1 + brightness]" in err.problem
    assert err.seen == "factors from 0.598 to 1.400" and err.expected == "factors in [0.60, 1.40] for brightness=0.4"
    assert "outside" in problem(scripted(factors=spread(n, 0.6, 1.4025, 1.0))).problem


def test_the_factors_must_reach_past_half_the_range_on_both_sides():
    n = 64
    # 1 - 0.4/2 = 0.8 and 1 + 0.4/2 = 1.2
    assert values(scripted(factors=spread(n, 0.7995, 1.2, 1.0)))
    assert values(scripted(factors=spread(n, 0.7995, 1.2005, 1.0)))
    err = problem(scripted(factors=spread(n, 0.8005, 1.4, 1.0)))
    assert "do not cover [1 - brightness, 1 + brightness] evenly" in err.problem
    assert err.seen == "from 0.801 to 1.400, mean 1.003"               # (0.8005 + 1.4 + 62) / 64
    assert "evenly" in problem(scripted(factors=spread(n, 0.6, 1.1995, 1.0))).problem


def test_the_factors_mean_must_be_within_0_12_of_one_on_both_sides():
    n = 64
    # mean (0.6 + 1.4 + 62 v) / 64: v = (64 m - 2) / 62
    for mean, ok in ((1.119, True), (1.121, False), (0.881, True), (0.879, False)):
        answer = scripted(factors=spread(n, 0.6, 1.4, (64 * mean - 2) / 62))
        if ok:
            assert values(answer)["factor_mean"] == pytest.approx(mean, abs=1e-4)
        else:
            assert "evenly" in problem(answer).problem


def test_one_brightness_draw_is_told_apart_from_two_close_ones():
    n = 64
    err = problem(scripted(factors=[1.0] * (n - 1) + [1.00005], scale_with_b=False))
    assert "every sample got the same brightness factor (1.000)" in err.problem
    err = problem(scripted(factors=[1.0] * (n - 1) + [1.0003], scale_with_b=False))
    assert "same brightness factor" not in err.problem and "evenly" in err.problem


def test_the_brightness_argument_sets_the_range():
    n = 64
    err = problem(scripted(scale_with_b=False))                        # 0.6..1.4 at brightness 0
    assert err.problem == "on cpu: with brightness=0.0 the factors ran from 0.600 to 1.400."
    assert err.expected == "factors in [1.00, 1.00] (exactly 1: no change)"

    def narrow_at_08(spread_08):
        inner = scripted()

        def answer(batch, flip_p=0.5, brightness=0.4, generator=None):
            b = brightness if brightness < 0.5 else spread_08 / 2
            return inner(batch, flip_p, b, generator)
        return answer

    # at brightness 0.8 the factors must spread over half the range, 0.4, at least
    assert values(narrow_at_08(0.42))
    err = problem(narrow_at_08(0.38))
    assert err.problem == "on cpu: with brightness=0.8 the factors ran from 0.810 to 1.190."
    assert err.expected == "factors in [0.20, 1.80]"


def test_a_fixed_seed_inside_the_answer_fails_the_second_seed():
    def ignores_the_seed(batch, flip_p=0.5, brightness=0.4, generator=None):
        return scripted()(batch, flip_p, brightness, None)
    assert "a differently seeded generator gave exactly the same result" in problem(ignores_the_seed).problem


# ---- _fit and _analyse ------------------------------------------------------------------------

def test_fit_reads_one_factor_per_sample_from_the_dark_pixels():
    x = make_test_batch(4, 12)
    f = torch.tensor([0.7, 1.0, 1.3, 1.6]).view(-1, 1, 1, 1)
    factor, err = ex05._fit((x * f).clamp(0, 1), x)
    assert factor.tolist() == pytest.approx([0.7, 1.0, 1.3, 1.6], abs=1e-5)
    assert float(err.max()) < 1e-5
    factor, err = ex05._fit((x * f).clamp(0, 1), x.flip(3))          # against the mirror
    assert float(err.min()) > 0.1


def test_analyse_tells_which_samples_were_mirrored_within_the_tolerance():
    x = make_test_batch(4, 12)
    out = (torch.stack([x[0], x[1].flip(1), x[2], x[3].flip(1)]) * 1.2).clamp(0, 1)  # height
    mirrored = torch.tensor([False, True, False, True]).view(-1, 1, 1, 1)
    flipped, factor = ex05._analyse((torch.where(mirrored, x.flip(3), x) * 1.2).clamp(0, 1), x,
                                    2e-4, "here")
    assert flipped.tolist() == [False, True, False, True]
    assert factor.tolist() == pytest.approx([1.2] * 4, abs=1e-5)
    with pytest.raises(ExerciseFailed, match="upside down"):
        ex05._analyse(out, x, 2e-4, "here")
    noisy = (x * 1.2).clamp(0, 1) + 1e-4 * torch.linspace(-1, 1, 12)   # off by up to 1e-4
    assert ex05._analyse(noisy, x, 2e-4, "here")[1].tolist() == pytest.approx([1.2] * 4, abs=1e-3)
    with pytest.raises(ExerciseFailed) as info:
        ex05._analyse((x * 1.2).clamp(0, 1) + 3e-4 * torch.linspace(-1, 1, 12), x, 2e-4, "here")
    assert info.value.problem.startswith("here: the output is not the input flipped")
    assert info.value.seen.startswith("sample 0: not its input")


def test_analyse_names_what_was_done_instead():
    x = make_test_batch(4, 12)
    cases = [(torch.stack([x[0].flip(1).flip(2), x[1], x[2], x[3]]), "both height and width"),
             (torch.stack([x[0], x[1].flip(0), x[2], x[3]]), "colour channels reversed"),
             (torch.stack([x[0], x[1], x[0], x[3]]), "sample 2's output was made from another"),
             (torch.stack([x[0], x[1], x[2], (x[3] + 0.05).clamp(0, 1)]), "added, not multiplied"),
             (torch.stack([x[0], (x[1] * torch.tensor([0.9, 1.0, 1.1]).view(3, 1, 1)).clamp(0, 1),
                           x[2], x[3]]),
              "its own brightness factor")]
    for out, words in cases:
        with pytest.raises(ExerciseFailed) as info:
            ex05._analyse(out, x, 2e-4, "here")
        assert words in info.value.problem, (words, info.value.problem)
        assert teaches(info.value).exercise == "05.batched_flip_brightness"


# ---- _basic ------------------------------------------------------------------------------------

def test_values_may_exceed_zero_to_one_by_a_thousandth_only():
    x = make_test_batch(2, 4)
    ok = x.clone()
    ok[0, 0, 0, 0], ok[1, 0, 0, 0] = 1.0009, -0.0009
    assert torch.equal(ex05._basic(ok, x, x.clone(), "here"), ok)
    high = x.clone()
    high[0, 0, 0, 0] = 1.0011
    with pytest.raises(ExerciseFailed, match="values go up to 1.001, above 1") as info:
        ex05._basic(high, x, x.clone(), "here")
    assert teaches(info.value).seen == f"min {float(high.min()):.3f}, max 1.001"
    low = x.clone()
    low[1, 2, 3, 0] = -0.0011
    with pytest.raises(ExerciseFailed, match="values go down to -0.001, below 0"):
        ex05._basic(low, x, x.clone(), "here")


def test_basic_checks_type_input_dtype_shape_and_finiteness():
    x = make_test_batch(2, 4)
    for out, words in ((None, "must return a tensor"), (x.double(), "float64"),
                       (x[:1], "wrong shape"), (x.clone().fill_(float("nan")), "NaN or inf")):
        with pytest.raises(ExerciseFailed, match=f"here: .*{words}") as info:
            ex05._basic(out, x, x.clone(), "here")
        assert info.value.seen == describe(out)
        if words != "NaN or inf":                          # a NaN is its own explanation
            teaches(info.value, out)
    with pytest.raises(ExerciseFailed, match="in place") as info:
        ex05._basic(x.clone(), x, x * 0.5, "here")
    assert info.value.expected and info.value.hint
    half = x.half()
    with pytest.raises(ExerciseFailed) as info:
        ex05._basic(half.float(), half, half.clone(), "here")
    assert "mixed-precision" in info.value.hint
    with pytest.raises(ExerciseFailed) as info:
        ex05._basic(x.half(), x, x.clone(), "here")
    assert "convert the random factors" in info.value.hint


# ---- _check_batched and _check_meta -----------------------------------------------------------

def fake_counts(monkeypatch, small, big):
    def count(fn, *args, **kwargs):
        batch = args[1]
        return None, small if batch.shape[0] == 8 else big
    monkeypatch.setattr(ex05, "count_torch_calls", count)


@pytest.mark.parametrize("small, big, batched", [
    (20, 30, True),     # 30 > 28 but not > 1.5 * 20 = 30
    (20, 31, False),    # 31 > 28 and > 30
    (10, 18, True),     # not > 10 + 8 (though > 15)
    (10, 19, False),
    (2, 10, True),      # > 3 but not > 10
    (40, 40, True),
])
def test_a_loop_is_more_than_eight_calls_and_half_as_many_again(monkeypatch, small, big, batched):
    fake_counts(monkeypatch, small, big)
    if batched:
        assert ex05._check_batched(lambda *a, **k: None, side=4, seed=0) == {"calls": big}
    else:
        with pytest.raises(ExerciseFailed) as info:
            ex05._check_batched(lambda *a, **k: None, side=4, seed=0)
        assert info.value.seen == f"{small} torch calls for 8 samples, {big} for 64"


def raising(exc):
    def answer(batch, flip_p=0.5, brightness=0.4, generator=None):
        raise exc
    return answer


def test_meta_errors_map_to_their_teaching_messages():
    cases = [(RuntimeError("Expected all tensors to be on the same device"), "mixes in tensors made on the CPU"),
             (RuntimeError("Cannot copy out of meta tensor; no data!"), "copies the batch to the host"),
             (NotImplementedError("numpy() on meta"), "copies the batch to the host"),
             (ValueError("boom"), "your function raised ValueError: boom")]
    for exc, words in cases:
        with pytest.raises(ExerciseFailed) as info:
            ex05._check_meta(raising(exc), n=4, side=4)
        assert words in info.value.problem, (words, info.value.problem)
        assert info.value.hint and info.value.exercise == "05.batched_flip_brightness"
    with pytest.raises(NotImplementedError):                          # the stub itself
        ex05._check_meta(raising(NotImplementedError("Exercise")), n=4, side=4)
    note = ex05._check_meta(raising(RuntimeError("aten::nonzero: data-dependent output")), n=4, side=4)
    assert note.startswith("device check on 'meta' skipped")
    note = ex05._check_meta(raising(NotImplementedError("item() cannot be called on meta tensors")),
                            n=4, side=4)
    assert "a sync" in note


def test_meta_output_must_stay_on_meta_with_its_dtype_and_shape():
    assert ex05._check_meta(lambda b, flip_p, brightness, generator: b * 2, n=4, side=4) == ""
    for fn, words in ((lambda b, **k: torch.zeros(4, 3, 4, 4), "did not return a tensor on it"),
                      (lambda b, **k: b.half(), "dtype or shape changed"),
                      (lambda b, **k: b[:2], "dtype or shape changed")):
        with pytest.raises(ExerciseFailed, match=words) as info:
            ex05._check_meta(fn, n=4, side=4)
        assert info.value.expected and info.value.seen and info.value.exercise == "05.batched_flip_brightness"


def at_brightness(b2, factors_at_b2):
    """The scripted right answer, except that at brightness ``b2`` it scales by the factors given."""
    inner = scripted()

    def answer(batch, flip_p=0.5, brightness=0.4, generator=None):
        if brightness != b2:
            return inner(batch, flip_p, brightness, generator)
        seed = generator.initial_seed() if generator is not None else 0
        f = torch.tensor(factors_at_b2, dtype=batch.dtype).roll(seed).view(-1, 1, 1, 1)
        flip = (torch.arange(batch.shape[0]) < batch.shape[0] // 2).roll(seed).view(-1, 1, 1, 1)
        return (torch.where(flip, batch.flip(3), batch) * f).clamp(0, 1)
    return answer


@pytest.mark.parametrize("b2, low, high, ok", [
    (0.0, 0.9981, 1.0, True), (0.0, 0.9979, 1.0, False),       # the low side alone, by 2e-3
    (0.0, 1.0, 1.0019, True), (0.0, 1.0, 1.0021, False),       # the high side alone
    (0.8, 0.1981, 1.6, True), (0.8, 0.1979, 1.6, False),
    (0.8, 0.6, 1.8019, True), (0.8, 0.6, 1.8021, False),
    (0.8, 0.6, 1.01, True), (0.8, 0.6, 0.99, False)],          # at least b2 / 2 = 0.4 wide
    ids=lambda v: str(v))
def test_each_bound_of_the_range_at_another_brightness_on_its_own(b2, low, high, ok):
    n = 64
    answer = at_brightness(b2, spread(n, low, high, (low + high) / 2))
    if ok:
        assert values(answer)["n"] == n
    else:
        err = problem(answer)
        assert err.problem == f"on cpu: with brightness={b2} the factors ran from {low:.3f} to {high:.3f}."
        assert err.seen == f"{low:.3f} .. {high:.3f}"


# ---- _call: the generator handed to the answer, and the hint for a generator on another device ---

def test_the_answer_gets_a_generator_on_the_batch_s_device_seeded_as_asked():
    seen = []

    def answer(batch, flip_p=0.5, brightness=0.4, generator=None):
        seen.append((flip_p, brightness, generator and (generator.initial_seed(), generator.device.type)))
        return batch
    x = make_test_batch(2, 4)
    ex05._call(answer, x)                                  # default seed 0
    ex05._call(answer, x, 7, 0.25, 0.8)
    ex05._call(answer, x, None)
    assert seen == [(0.5, 0.4, (0, "cpu")), (0.25, 0.8, (7, "cpu")), (0.5, 0.4, None)]


@pytest.mark.parametrize("message, hinted", [
    ("Expected a 'cuda' device type for generator but found 'cpu'", True),
    ("generator: bad seed", False), ("tensors on different device", False)])
def test_a_generator_on_another_device_gets_its_own_hint(message, hinted):
    with pytest.raises(ExerciseFailed) as info:
        ex05._call(raising(RuntimeError(message)), make_test_batch(2, 4))
    err = info.value
    assert err.exercise == "05.batched_flip_brightness" and err.seen == f"input {describe(make_test_batch(2, 4))}"
    assert ("the generator lives on the batch's device" in err.hint) is hinted, err.hint


def test_an_output_on_another_device_or_below_zero_says_where_and_why():
    x = make_test_batch(2, 4)
    with pytest.raises(ExerciseFailed) as info:
        ex05._basic(torch.empty(2, 3, 4, 4, device="meta"), x, x.clone(), "here")
    err = teaches(info.value, torch.empty(2, 3, 4, 4, device="meta"))
    assert err.problem == "here: the output is on meta, the input was on cpu." and err.expected == "the output on cpu"
    low = x.clone()
    low[1, 2, 3, 0] = -0.0011
    with pytest.raises(ExerciseFailed) as info:
        ex05._basic(low, x, x.clone(), "here")
    assert teaches(info.value).expected == "values in [0, 1]" and "clamp" in info.value.hint
