"""`bench`: every row measured side by side in one run (structure, not speed)."""
from __future__ import annotations

import json
import math

import pytest

from course_utils.__main__ import main
from course_utils.measurement import Measurement, compare
from course_utils.tools.bench.dali import dali_missing
from course_utils.tools.bench.run import (COLD, DALI, DECODE_ONLY, IMAGENET, MEMMAP, RAM_BYTES,
                                          RAM_GATHER, SEED, SHIPPING, TARGETS, TUNED,
                                          BenchmarkResult, min_batches, run_benchmark)


@pytest.mark.timeout(300)
def test_benchmark_measures_every_row_side_by_side(tmp_path, capsys):
    n = min_batches() * 4            # every row's batches in flight and 10 timed, at batch_size=4
    result = run_benchmark(n=n, batch_size=4, repeats=1, progress=False)
    with_dali = dali_missing() is None                    # make test installs it where it can
    assert [m.label for m in result.loaders.rows] == [SEED, IMAGENET, TUNED, DECODE_ONLY, SHIPPING] + (
        [DALI] if with_dali else [])
    storage = [m.label for m in result.storage.rows]
    assert storage[:2] == [RAM_BYTES, TUNED] and storage[-2:] == [MEMMAP, RAM_GATHER]
    assert (COLD in storage) == ("dropped" in result.cold_cache)
    # every ratio is the one it names, from the same rows (an inverted ratio fails)
    rate = {m.label: m.samples_per_s for m in result.loaders.rows + result.storage.rows}
    assert result.speedup == pytest.approx(rate[TUNED] / rate[IMAGENET])
    assert result.decode_share == pytest.approx(rate[TUNED] / rate[DECODE_ONLY])
    assert result.memmap_share == pytest.approx(rate[MEMMAP] / rate[RAM_GATHER])
    if with_dali:
        assert result.dali_speedup == pytest.approx(rate[DALI] / rate[IMAGENET])
        assert "DALI ran the ImageNet recipe at" in str(result) and "num_threads=" in result.dali
    else:
        assert result.dali_speedup is None and result.dali == dali_missing()
    # CPU time comes in 10 ms ticks: a run this small can read 0 s for the recipe, and then
    # the ratio is inf (or nan for 0 / 0), never a number
    cpu = {m.label: m.cpu_s_per_sample for m in result.loaders.rows}
    if cpu[IMAGENET] > 0:
        assert result.cpu_ratio == pytest.approx(cpu[TUNED] / cpu[IMAGENET])
    else:
        assert result.cpu_ratio == math.inf if cpu[TUNED] > 0 else math.isnan(result.cpu_ratio)
    assert result.shipping_share is None or result.shipping_share > 0
    assert (result.shipping_share is None) == ("sending its pixels alone" not in str(result))
    text = str(result)
    assert "target >= 2.0x" in text and "target <= 0.5x" in text and "memmap / RAM gather" in text
    json.dumps(result.to_dict())
    out = tmp_path / "bench.json"
    assert main(["bench", "--images", str(n), "--batch-size", "4", "--repeats", "1", "--no-storage",
                 "--no-progress", "--json", str(out)]) == 0
    saved = json.loads(out.read_text())
    assert saved["loaders"] and saved["storage"] is None and saved["memmap_share"] is None
    saved_rate = {m["label"]: m["samples_per_s"] for m in saved["loaders"]["rows"]}
    assert saved["speedup"] == pytest.approx(saved_rate[TUNED] / saved_rate[IMAGENET])
    assert "tuned / ImageNet training recipe" in capsys.readouterr().out


def _row(label: str, cpu_s: float | None, seconds: float = 0.1) -> Measurement:
    return Measurement.from_times(label, [seconds], 64, cpu_s_per_sample=cpu_s, machine="m")


def test_every_ratio_and_target_by_hand():
    """64 samples per repeat: ImageNet 0.8 s (80/s), tuned 0.25 s (256/s), decode only 0.16 s
    (400/s); storage: memmap 0.5 s (128/s) against a RAM gather of 0.4 s (160/s)."""
    loaders = compare([_row(SEED, 5e-3, 1.6), _row(IMAGENET, 4e-3, 0.8), _row(TUNED, 1e-3, 0.25),
                       _row(DECODE_ONLY, 8e-4, 0.16), _row(SHIPPING, 3e-4, 0.1)], baseline=IMAGENET)
    storage = compare([_row(RAM_BYTES, 1e-3, 0.3), _row(TUNED, 1e-3, 0.25),
                       _row(MEMMAP, 1e-3, 0.5), _row(RAM_GATHER, 1e-3, 0.4)], baseline=RAM_BYTES)
    result = BenchmarkResult(loaders, storage, "d", "f", "c")
    assert result.speedup == pytest.approx(256 / 80)              # 3.2: met (>= 2)
    assert result.cpu_ratio == pytest.approx(1e-3 / 4e-3)         # 0.25: met (<= 0.5)
    assert result.decode_share == pytest.approx(256 / 400)        # 0.64: NOT met (>= 0.8)
    assert result.memmap_share == pytest.approx(128 / 160)        # 0.8: met (>= 0.6)
    assert result.shipping_share == pytest.approx(3e-4 / 1e-3)
    checks = {what: (value, met) for what, value, _, _, met in result.checks()}
    assert checks == {
        "samples/s, tuned / ImageNet training recipe": (result.speedup, result.speedup >= TARGETS["speedup"]),
        "CPU-s/sample, tuned / ImageNet training recipe": (result.cpu_ratio,
                                                           result.cpu_ratio <= TARGETS["cpu_ratio"]),
        "samples/s, tuned / decode only": (result.decode_share,
                                           result.decode_share >= TARGETS["decode_share"]),
        "samples/s, memmap / RAM gather": (result.memmap_share,
                                           result.memmap_share >= TARGETS["memmap_share"])}
    assert [met for *_, met in result.checks()] == [True, True, False, True]
    assert "samples/s, tuned / ImageNet training recipe: 3.20x (target >= 2.0x: met)" in str(result)


@pytest.mark.parametrize("shipping_cpu, share", [(2e-4, 0.2), (0.0, None), (None, None)])
def test_shipping_share_is_none_where_the_cpu_clock_read_nothing(shipping_cpu, share):
    rows = [_row(SEED, 3e-3), _row(IMAGENET, 3e-3), _row(TUNED, 1e-3), _row(DECODE_ONLY, 8e-4),
            _row(SHIPPING, shipping_cpu)]
    result = BenchmarkResult(compare(rows, baseline=IMAGENET), None, "d", "f", "c")
    assert result.shipping_share == pytest.approx(share) if share else result.shipping_share is None
    assert ("sending its pixels alone" in str(result)) == (share is not None)


def test_the_dali_row_by_hand():
    """DALI 0.4 s (160/s, 2 ms CPU per sample) against the recipe's 0.8 s (80/s, 4 ms)."""
    rows = [_row(SEED, 5e-3, 1.6), _row(IMAGENET, 4e-3, 0.8), _row(TUNED, 1e-3, 0.25),
            _row(DECODE_ONLY, 8e-4, 0.16), _row(SHIPPING, 3e-4, 0.1), _row(DALI, 2e-3, 0.4)]
    result = BenchmarkResult(compare(rows, baseline=IMAGENET), None, "d", "f", "c", "cpu, 2 threads")
    assert result.dali_speedup == pytest.approx(2.0)
    text = str(result)
    assert "DALI:    cpu, 2 threads" in text
    assert "DALI ran the ImageNet recipe at 2.00x its DataLoader's samples/s, and at 0.50x its CPU-s/sample." in text
    assert result.to_dict()["dali_speedup"] == pytest.approx(2.0)
    without = BenchmarkResult(compare(rows[:5], baseline=IMAGENET), None, "d", "f", "c")
    assert without.dali_speedup is None and "DALI ran" not in str(without)
