"""gpu-check: refuses without CUDA and writes nothing; its plan; and, with the GPU steps
replaced by stand-ins that return labelled fake dicts (written only to a temporary folder),
the files it writes and the summary of targets. No GPU figure is made up: the fakes never
reach course_utils/reference_results/."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from course_utils import gpu_check
from course_utils.config import QUICK_ENV
from course_utils.gpu_check import (GpuCheckRefused, format_targets, main, plan, run_gpu_check)
from course_utils.reference import (LESSON04, LESSON05, REFERENCE_DIR, SUMMARY, available_references,
                                    load_reference)

pytestmark = pytest.mark.timeout(120)
CUDA = torch.cuda.is_available()
ROOT = Path(__file__).resolve().parents[1]


def _snapshot(folder: Path) -> dict:
    return {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} if folder.exists() else {}


@pytest.mark.skipif(CUDA, reason="this machine has CUDA: the check would run")
def test_refuses_without_cuda_and_writes_nothing(tmp_path, capsys):
    before = _snapshot(REFERENCE_DIR)
    out = tmp_path / "out"
    with pytest.raises(GpuCheckRefused, match="needs a CUDA GPU") as info:
        run_gpu_check(out)
    assert "nothing was written" in str(info.value)
    assert "python -m course_utils gpu-check" in str(info.value)
    assert not out.exists()
    assert main(["--out", str(out)]) == 1
    assert "needs a CUDA GPU" in capsys.readouterr().err
    assert not out.exists()
    assert main([]) == 1                              # default folder: still nothing written
    assert _snapshot(REFERENCE_DIR) == before


@pytest.mark.skipif(CUDA, reason="this machine has CUDA")
def test_command_line_refuses_with_nonzero_exit(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "course_utils.gpu_check", "--out",
                           str(tmp_path / "o")], capture_output=True, text=True, env=env,
                          cwd=str(ROOT), timeout=100)
    assert proc.returncode == 1 and "needs a CUDA GPU" in proc.stderr
    assert not (tmp_path / "o").exists()


def test_importing_it_loads_no_notebook_machinery():
    code = ("import sys, course_utils.gpu_check; "
            "print(sorted(m for m in ('nbclient', 'nbformat', 'ipywidgets', 'ipykernel') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=100)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_plan_splits_the_budget_and_skips_what_cannot_run():
    steps = plan(540)
    assert [s["name"] for s in steps] == ["lesson04", "lesson05", "notebooks", "summary"]
    assert sum(s["budget_s"] for s in steps) == pytest.approx(540, abs=1)
    assert steps[0]["runs"]
    tiny = plan(30)
    assert not tiny[0]["runs"] and "under" in tiny[0]["why"]
    assert not plan(540, notebooks=False)[2]["runs"]
    with pytest.raises(ValueError, match="budget_s"):
        plan(0)


def test_plan_option_prints_and_writes_nothing(tmp_path, capsys):
    before = _snapshot(REFERENCE_DIR)
    assert main(["--plan", "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "lesson04" in out and "CUDA available here" in out
    assert not (tmp_path / "o").exists() and _snapshot(REFERENCE_DIR) == before


# ---- with stand-ins for the GPU ----------------------------------------------------------------

def _fake04(budget_s):
    return {"fake": "test stand-in, not a measurement", "budget_s": budget_s,
            "targets": {"pinned_h2d": {"description": "pinned >= 90% of best H2D",
                                       "value": 0.95, "target": ">= 0.9", "met": True}}}


def _fake05(budget_s):
    return {"fake": "test stand-in, not a measurement",
            "targets": {"gpu_augment": {"description": "on-device >= 10x CPU", "value": 7.0,
                                        "target": ">= 10", "met": False},
                        "data_wait": {"description": "tuned data-wait < 5%", "value": 0.03,
                                      "target": "< 0.05", "met": True},
                        "skipped_one": {"description": "not measured", "value": None,
                                        "target": "> 1", "met": None}}}


@pytest.fixture
def fake_gpu(monkeypatch):
    monkeypatch.setattr(gpu_check, "cuda_available", lambda: True)
    monkeypatch.setattr(gpu_check, "_lesson04", _fake04)
    monkeypatch.setattr(gpu_check, "_lesson05", _fake05)
    monkeypatch.setattr(gpu_check, "_has_augment", lambda: True)


def test_writes_the_reference_files_and_the_targets(tmp_path, fake_gpu, monkeypatch):
    monkeypatch.setenv(QUICK_ENV, "1")
    before = _snapshot(REFERENCE_DIR)
    lines = []
    summary = run_gpu_check(tmp_path, budget_s=540, notebooks=False, log=lines.append)
    assert os.environ[QUICK_ENV] == "1"               # the mode is put back
    assert _snapshot(REFERENCE_DIR) == before         # fakes never reach the shipped folder
    assert available_references(tmp_path) == sorted([LESSON04, LESSON05, SUMMARY])
    doc04 = load_reference(LESSON04, directory=tmp_path)
    assert doc04["results"]["fake"].startswith("test stand-in")
    assert doc04["results"]["budget_s"] == pytest.approx(0.30 * 540)
    assert doc04["machine"]["torch_version"] == torch.__version__
    doc = load_reference(SUMMARY, directory=tmp_path)
    assert set(doc["results"]["targets"]) == {"pinned_h2d", "gpu_augment", "data_wait", "skipped_one"}
    assert doc["results"]["all_targets_met"] is False and summary["all_targets_met"] is False
    assert doc["results"]["steps"]["notebooks"]["status"] == "skipped"
    text = "\n".join(lines)
    assert "[NOT MET]" in text and "[MET    ]" in text
    json.dumps(summary)


def test_a_failing_step_is_recorded_and_exits_2(tmp_path, fake_gpu, monkeypatch, capsys):
    def broken(budget_s):
        raise RuntimeError("CUDA out of memory (stand-in)")

    monkeypatch.setattr(gpu_check, "_lesson05", broken)
    assert main(["--out", str(tmp_path), "--no-notebooks"]) == 2
    doc = load_reference(SUMMARY, directory=tmp_path)
    assert doc["results"]["steps"]["lesson05"]["status"] == "failed"
    assert "out of memory" in doc["results"]["steps"]["lesson05"]["detail"]
    assert load_reference(LESSON05, directory=tmp_path) is None
    assert load_reference(LESSON04, directory=tmp_path) is not None


def test_format_targets():
    text = format_targets(_fake05(1)["targets"])
    assert "[NOT MET] gpu_augment: measured 7 (target >= 10)" in text
    assert "[n/a    ] skipped_one: measured None" in text
    assert format_targets({}) == "no targets were measured"


@pytest.mark.skipif(CUDA, reason="this machine has CUDA")
def test_the_course_command_line_has_gpu_check(tmp_path, capsys):
    from course_utils.__main__ import main as course_main
    assert course_main(["gpu-check", "--out", str(tmp_path / "o")]) == 1
    assert "needs a CUDA GPU" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
    assert course_main(["gpu-check", "--plan"]) == 0
