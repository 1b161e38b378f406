"""The GPU check's rehearsal: ``tools/device_gpu_check.sh --rehearse`` runs every step of the
real check on this CPU, with the same timeouts, files, summary and exit status, so the one run
a GPU machine gets can fail only for reasons a GPU shows.

It takes about two minutes and its step timeouts are the GPU run's, so it must not share the
CPUs with other tests: ``make test`` runs it on its own after the rest of the suite (this file
skips itself elsewhere unless COURSE_REHEARSAL=1)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from course_authoring.gpu_check import NOTEBOOKS, OWN_FILES
from course_authoring.gpu_preflight import toolchain
from course_utils.reference import REFERENCE_NAMES

from _lesson04_run import check_cpu_run, check_reference_summary

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tools" / "device_gpu_check.sh"

pytestmark = [pytest.mark.timeout(600), pytest.mark.skipif(
    os.environ.get("COURSE_REHEARSAL") != "1",
    reason="runs alone (its timeouts are the GPU run's): make test runs it after the suite; "
           "or COURSE_REHEARSAL=1 pytest tests/test_gpu_rehearsal.py")]


def test_the_rehearsal_runs_every_step_and_passes(tmp_path):
    out = tmp_path / "out"
    env = dict(os.environ, OUT=str(out), PYTHON=sys.executable)
    env.pop("COURSE_QUICK", None)          # the check sets each step's mode itself
    proc = subprocess.run(["bash", str(SCRIPT), "--rehearse"], capture_output=True, text=True,
                          env=env, cwd=str(ROOT), timeout=560)
    text = proc.stdout + proc.stderr
    tail = proc.stdout[-12_000:]                              # what the device tool would show
    assert proc.returncode == 0, tail[-6000:]
    assert "summary: REHEARSAL on the CPU" in tail and "exit status 0: all" in tail
    summary_lines = tail[tail.index("summary: REHEARSAL"):].splitlines()
    steps = [line for line in summary_lines if " s of " in line]
    assert len(steps) == 11 and sum("notebook" in line for line in steps) == len(NOTEBOOKS)
    assert all(line.split()[0] == "passed" for line in steps), steps
    assert text.startswith("== preflight: python ")                 # the preflight comes first
    tools = toolchain()
    if tools["ok_cpu"]:            # the compile path lesson 05 takes, once, with a tiny function
        assert "[compile] torch.compile on cpu: first call (compiling)" in proc.stdout
    else:
        assert f"[compile] skipped: torch.compile on cpu not tried: {tools['why_not_cpu']}" in proc.stdout
    summary = json.loads((out / "gpu_check_summary.json").read_text(encoding="utf-8"))["results"]
    assert {"torch", "cudnn", "nccl", "compiler", "gpus", "shm_free_bytes"} <= set(summary["preflight"])
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(set(OWN_FILES) | {f"{n}.json" for n in REFERENCE_NAMES})
    assert len(names) <= 8
    assert (out / "gpu_check_log.txt").read_text(encoding="utf-8") == proc.stdout
    for name in REFERENCE_NAMES:                                # marked: never a reference
        doc = json.loads((out / f"{name}.json").read_text(encoding="utf-8"))
        assert "not a reference" in doc["results"]["rehearsal"], name
    assert "copy none of them" in tail and "cp " not in tail
    assert "Traceback" not in text.split("summary: REHEARSAL")[-1]
    lesson04 = json.loads((out / "lesson04_transfer.json").read_text(encoding="utf-8"))["results"]
    check_cpu_run(lesson04)            # every section of lesson 04, as the notebook writes them
    check_reference_summary(lesson04)
    lesson05 = json.loads((out / "lesson05_augment.json").read_text(encoding="utf-8"))["results"]
    assert lesson05["jpeg_decode"]["ran_on"] == "cpu" and lesson05["jpeg_decode"]["samples_per_s"] > 0
