"""`bench`: every row measured side by side in one run (structure, not speed)."""
from __future__ import annotations

import json

import pytest

from course_utils.__main__ import main
from course_utils.benchmark import (COLD, DECODE_ONLY, IMAGENET, MEMMAP, RAM_BYTES, RAM_GATHER,
                                    SEED, SHIPPING, TUNED, BenchmarkResult, run_benchmark)
from course_utils.measurement import Measurement, compare


@pytest.mark.timeout(300)
def test_benchmark_measures_every_row_side_by_side(tmp_path, capsys):
    result = run_benchmark(n=48, batch_size=8, repeats=1, progress=False)
    assert [m.label for m in result.loaders.rows] == [SEED, IMAGENET, TUNED, DECODE_ONLY, SHIPPING]
    storage = [m.label for m in result.storage.rows]
    assert storage[:2] == [RAM_BYTES, TUNED] and storage[-2:] == [MEMMAP, RAM_GATHER]
    assert (COLD in storage) == ("dropped" in result.cold_cache)
    assert result.speedup > 0 and result.decode_share > 0 and result.memmap_share > 0
    # CPU time comes in 10 ms ticks: a run this small can read 0 s for one side, so only the
    # ratio's type and sign are checked; bench measures it for real
    assert isinstance(result.cpu_ratio, float) and not result.cpu_ratio < 0
    assert result.shipping_share is None or result.shipping_share > 0
    assert (result.shipping_share is None) == ("sending its pixels alone" not in str(result))
    text = str(result)
    assert "target >= 2.0x" in text and "target <= 0.5x" in text and "memmap / RAM gather" in text
    json.dumps(result.to_dict())
    out = tmp_path / "bench.json"
    assert main(["bench", "--images", "48", "--batch-size", "8", "--repeats", "1", "--no-storage",
                 "--no-progress", "--json", str(out)]) == 0
    saved = json.loads(out.read_text())
    assert saved["loaders"] and saved["storage"] is None and saved["memmap_share"] is None
    assert "tuned / ImageNet recipe" in capsys.readouterr().out


def _row(label: str, cpu_s: float | None) -> Measurement:
    return Measurement.from_times(label, [0.1], 64, cpu_s_per_sample=cpu_s)


@pytest.mark.parametrize("shipping_cpu, share", [(2e-4, 0.2), (0.0, None), (None, None)])
def test_shipping_share_is_none_where_the_cpu_clock_read_nothing(shipping_cpu, share):
    rows = [_row(SEED, 3e-3), _row(IMAGENET, 3e-3), _row(TUNED, 1e-3), _row(DECODE_ONLY, 8e-4),
            _row(SHIPPING, shipping_cpu)]
    result = BenchmarkResult(compare(rows, baseline=IMAGENET), None, "m", "d", "f", "c")
    assert result.shipping_share == pytest.approx(share) if share else result.shipping_share is None
    assert ("sending its pixels alone" in str(result)) == (share is not None)
