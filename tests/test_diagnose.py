"""`diagnose`'s rules at their thresholds, its strict JSON, and the two shipped example scripts
run unchanged: the data-bound one is data-bound with a fix measured, the compute-bound one gets
the verdict of the rule. Real runs assert only what no busy machine can change."""
from __future__ import annotations

import json
import multiprocessing

import psutil
import pytest

from course_utils.__main__ import main
from course_utils.tools.cli import print_and_save
from course_utils.tools.diagnose import DATA_BOUND_FRACTION, verdict
from course_utils.tools.diagnose.rules import POOL_THREADS, runs_own_pools

from _helpers import ROOT

EXAMPLES = ROOT / "course_utils" / "tools" / "examples"


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def _no_children_left(before: set[int]) -> None:
    """Nothing diagnose started is still running (a forkserver or resource tracker that another
    test started earlier in this process may be, and is not diagnose's)."""
    assert not multiprocessing.active_children()
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before
            and "resource_tracker" not in " ".join(p.cmdline())]   # multiprocessing's own helper
    assert not left, [p.cmdline() for p in left]


@pytest.mark.timeout(240)
def test_the_data_bound_example_is_data_bound_with_a_measured_fix(tmp_path, capfd):
    before = _children()
    out = tmp_path / "d.json"
    # 3 workers: more than a 2-CPU machine's suggestion, so torch would warn in the fix's run
    assert main(["diagnose", "--budget", "12", "--try", "num_workers=3", "--no-progress", "--json",
                 str(out), str(EXAMPLES / "data_bound.py"), "--epochs", "1000"]) == 0
    result = json.loads(out.read_text())
    assert result["verdict"] == "data-bound", result
    assert result["data_wait_fraction"] > DATA_BOUND_FRACTION
    # its decode, blur and conversion run in the loop's thread (no workers) and it measured that
    assert result["causes"][0].startswith("the per-sample CPU cost in BlurredFloatImages"), result["causes"]
    assert not result["baseline"]["cuda"] and not any("float32" in c for c in result["causes"])
    loaders = result["baseline"]["loaders"]
    assert len(loaders) == 2 and result["main_loader"] == 0        # training, then validation
    assert set(loaders[0]["wait_tail_s"]) == {"p50", "p95", "p99"}
    [fix] = result["fixes"]
    assert fix["changes"] == {"num_workers": 3} and fix["gain"] > 0    # measured, not asserted
    text, err = capfd.readouterr()
    assert "DATA-BOUND" in text and "fixes, each a re-run of the script" in text
    assert "This DataLoader will create" not in text + err
    _no_children_left(before)


@pytest.mark.timeout(240)
def test_the_compute_bound_example_gets_the_verdict_of_the_rule(tmp_path):
    out = tmp_path / "c.json"
    assert main(["diagnose", "--budget", "12", "--no-progress", "--json", str(out),
                 str(EXAMPLES / "compute_bound.py"), "--epochs", "1000"]) == 0
    result = json.loads(out.read_text())
    # no timed threshold here (the rule is pinned below): the verdict is the rule applied to the
    # fraction measured, and the fraction is far from a loop that waits (its step is a CNN, its
    # batches ready tensors; counting the step as wait would read ~1)
    assert result["verdict"] == verdict(result["data_wait_fraction"]), result
    assert 0 <= result["data_wait_fraction"] < 0.5, result
    assert (result["fixes"] == []) == (result["verdict"] == "compute-bound"), result


def test_json_output_is_strict_json_without_nan_or_infinity(tmp_path, capsys):
    class Result:
        def __str__(self) -> str:
            return "a result"

        def to_dict(self) -> dict:
            return {"gain": float("nan"), "rows": [1.5, float("inf"), {"low": float("-inf")}],
                    "pair": (2.0, float("nan")), "name": "x", "n": 3}

    def no_constants(name: str):
        raise ValueError(f"{name} is not JSON")

    out = tmp_path / "r.json"
    print_and_save(Result(), str(out))
    text = out.read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text, parse_constant=no_constants) == {
        "gain": None, "rows": [1.5, None, {"low": None}], "pair": [2.0, None], "name": "x", "n": 3}
    assert "a result" in capsys.readouterr().out


# ---- the rules, just inside and just outside each threshold -------------------------------

def test_the_rules_flip_exactly_at_their_thresholds():
    assert verdict(DATA_BOUND_FRACTION * 1.01) == "data-bound"
    assert verdict(DATA_BOUND_FRACTION * 0.99) == verdict(0.0) == "compute-bound"
    assert runs_own_pools([1, POOL_THREADS + 1]) and not runs_own_pools([POOL_THREADS, 1])
    assert not runs_own_pools([])


def test_the_threshold_is_the_one_lesson_08_teaches():
    """Exercise 08 tells learners that its threshold=0.10 is diagnose's 10 %."""
    text = (ROOT / "solutions" / "08_find_the_stall.ipynb").read_text(encoding="utf-8")
    assert f"threshold={DATA_BOUND_FRACTION:.2f}" in text
    assert f"use the same {DATA_BOUND_FRACTION * 100:.0f} %" in text


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    script = tmp_path / "train.py"
    script.write_text("print('training')\n")
    for argv, says in ((["diagnose", "--budget", "0", str(script)], "--budget must be a positive"),
                       (["diagnose", "--budget", "-3", str(script)], "--budget must be a positive"),
                       (["diagnose", "--no-progress"], "name your training script"),
                       (["diagnose", "--try", "workers=2", str(script)], "KEY=VALUE")):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and says in err and "Traceback" not in err, err
