"""gpu-check: refuses without CUDA (and writes nothing) unless rehearsing; its steps' worst
case stays under the limit and its files under the device tool's 8; each part writes its JSON
and says when a section failed; the summary reads the targets from the parts' files; /dev/shm
is made room in; notebooks run without Jupyter; and the rehearsal itself, every step on this
CPU, passes and ends its output with the summary. No GPU figure is made up: the stand-ins are
labelled and written only to temporary folders."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from course_authoring import gpu_check
from course_authoring import gpu_preflight
from course_authoring.gpu_check import (IN_PROCESS_S, LIMIT_S, OWN_FILES, GpuCheckRefused,
                                        check_steps, format_targets, host_memory,
                                        in_process_worst_s, main, memory_notes, plan_shm,
                                        run_check, run_compile_probe, run_part, summarize)
from course_authoring.gpu_lesson04 import (pin_loader_bytes, pinned_h2d_target, plan_pin_loaders,
                                           run_h2d_copies)
from course_authoring.gpu_lesson05 import compile_probe, jpeg_decode_check, tuned_wait_met
from course_authoring.gpu_preflight import (nvidia_smi_gpus, preflight, preflight_line,
                                            preflight_warnings, toolchain)
from course_utils.jpeg_decoders import TensorDecoder
from course_utils.lessons.l04_copies import BandwidthSweep
from course_authoring.hosted import install_cell
from course_authoring.notebook_runner import run_notebook_cells
from course_authoring.step_runner import Step, StepResult, step_worst_s, worst_case_s
from course_utils.config import QUICK_ENV
from course_utils.reference import (LESSON04, LESSON05, REFERENCE_DIR, REFERENCE_NAMES, SUMMARY,
                                    load_reference)

pytestmark = pytest.mark.timeout(120)
CUDA = torch.cuda.is_available()
ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tools" / "device_gpu_check.sh"
GIB = 1024 ** 3


def _snapshot(folder: Path) -> dict:
    return {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} if folder.exists() else {}


@pytest.mark.skipif(CUDA, reason="this machine has CUDA: the check would run")
def test_refuses_without_cuda_and_writes_nothing(tmp_path, capsys):
    before = _snapshot(REFERENCE_DIR)
    out = tmp_path / "out"
    with pytest.raises(GpuCheckRefused, match="needs a CUDA GPU") as info:
        run_check(out)
    assert "nothing was written" in str(info.value) and "--rehearse" in str(info.value)
    assert not out.exists()
    assert main(["--out", str(out)]) == 1
    assert "needs a CUDA GPU" in capsys.readouterr().err
    assert main(["--part", "lesson04", "--budget", "5", "--out", str(out)]) == 1
    assert not out.exists() and _snapshot(REFERENCE_DIR) == before


def test_importing_it_loads_no_notebook_machinery():
    code = ("import sys, course_authoring.gpu_check; "
            "print(sorted(m for m in ('nbclient', 'nbformat', 'ipywidgets', 'ipykernel') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=100)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


# ---- the steps: time and files ----------------------------------------------------------------

@pytest.mark.parametrize("shm", [None, 60 * GIB, GIB])
def test_the_worst_case_fits_a_second_try_and_few_files_come_back(tmp_path, shm):
    steps = check_steps(tmp_path, python="python3", shm_free_bytes=shm)
    assert worst_case_s(steps, in_process_worst_s()) <= LIMIT_S <= 420
    assert len(set(OWN_FILES) | {f"{n}.json" for n in REFERENCE_NAMES}) <= 8
    written = {Path(a).name for s in steps for a in s.argv if str(a).startswith(str(tmp_path) + "/")}
    assert written <= set(OWN_FILES)                          # tune's and diagnose's JSON
    parts = [s for s in steps if "--part" in s.argv]
    assert all(str(tmp_path) in s.argv for s in parts) and len(parts) == 2
    assert all(("--shm-bytes" in s.argv) == (shm is not None) for s in parts)
    for s in parts:                                           # room inside the timeout to start
        assert s.timeout_s - float(s.argv[s.argv.index("--budget") + 1]) >= 10


def test_quick_steps_prove_paths_on_few_cpus_and_the_parts_measure_in_full(tmp_path):
    steps = {s.name: s for s in check_steps(tmp_path, python="python3")}
    quick = [s for s in steps.values() if s.env.get(QUICK_ENV) == "1"]
    assert {s.name.split(":")[0] for s in quick} >= {"lesson 06", "lesson 07", "lesson 08",
                                                     "torch.compile probe (cuda)"}
    assert all(s.max_cpus == gpu_check.QUICK_CPUS for s in quick)
    assert sum("notebook" in s.name for s in quick) == 3
    full = [s for s in steps.values() if "--part" in s.argv]
    assert all(QUICK_ENV not in s.env and s.max_cpus is None for s in full)
    assert all(s.required for s in quick + full) and "--compile-probe" in steps[
        "torch.compile probe (cuda)"].argv
    assert all("--rehearse" in s.argv for s in check_steps(tmp_path, rehearse=True) if "--part" in s.argv)


def test_a_short_dev_shm_shrinks_tune_and_tells_lesson05(tmp_path):
    steps = check_steps(tmp_path, python="python3", shm_free_bytes=GIB)
    tune = next(s for s in steps if s.name.startswith("lesson 06"))
    assert "--images" in tune.argv and "--batch-size" in tune.argv
    for part in ("lesson04", "lesson05"):
        step = next(s for s in steps if part in s.argv)
        assert step.argv[step.argv.index("--shm-bytes") + 1] == str(GIB)
    roomy = check_steps(tmp_path, python="python3", shm_free_bytes=60 * GIB)
    assert "--images" not in next(s for s in roomy if s.name.startswith("lesson 06")).argv


def test_plan_option_prints_and_writes_nothing(tmp_path, capsys):
    before = _snapshot(REFERENCE_DIR)
    assert main(["--plan", "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "lesson04" in out and "CUDA available here" in out and "worst case" in out
    assert not (tmp_path / "o").exists() and _snapshot(REFERENCE_DIR) == before


def test_the_reference_folder_is_never_the_out_folder(monkeypatch):
    monkeypatch.setattr(gpu_check, "cuda_available", lambda: True)
    with pytest.raises(ValueError, match="a folder of its own"):
        run_check(REFERENCE_DIR)


# ---- /dev/shm ---------------------------------------------------------------------------------

def _mem(free_gib, total_gib=None):
    return {"ram_available_bytes": 100 * GIB, "ram_total_bytes": 128 * GIB,
            "shm_free_bytes": int(free_gib * GIB), "shm_total_bytes": int((total_gib or free_gib) * GIB)}


def test_enough_dev_shm_is_left_alone():
    calls = []
    memory, lines = plan_shm(_mem(64), rehearse=False, is_root=True, remount=calls.append)
    assert memory["shm_free_bytes"] == 64 * GIB and lines == [] and calls == []


def test_a_short_dev_shm_is_enlarged_as_root(monkeypatch):
    sizes = []

    def remount(size):
        sizes.append(size)
        return True

    monkeypatch.setattr(gpu_check, "host_memory", lambda: _mem(8, 9))
    memory, lines = plan_shm(_mem(1, 2), rehearse=False, is_root=True, remount=remount)
    assert sizes == [7 * GIB]                                 # 2 GiB + 6 needed - 1 free
    assert memory["shm_free_bytes"] == 8 * GIB and "remounted /dev/shm with size=7G" in lines[0]


def test_a_short_dev_shm_that_cannot_grow_says_the_run_shrinks():
    memory, lines = plan_shm(_mem(1), rehearse=False, is_root=True, remount=lambda size: False)
    assert memory["shm_free_bytes"] == GIB and "could not enlarge" in lines[0]
    _, lines = plan_shm(_mem(1), rehearse=False, is_root=False, remount=lambda size: 1 / 0)
    assert "not root" in lines[0] and "run smaller" in lines[0]
    _, lines = plan_shm(_mem(1), rehearse=True, is_root=True, remount=lambda size: 1 / 0)
    assert lines[0].startswith("rehearsal:") and "left alone" in lines[0]


def test_memory_notes_say_what_fits():
    mem = host_memory()
    assert mem["ram_available_bytes"] > 0 and "shm_free_bytes" in mem
    notes, short = memory_notes(_mem(60))
    assert not short and "enough for lesson 05" in notes[1] and "100.0 GiB" in notes[0]
    notes, short = memory_notes(_mem(1 / 16))
    assert short and "WARNING" in notes[1] and "shm-size" in notes[1]
    notes, short = memory_notes({"ram_available_bytes": GIB, "shm_free_bytes": None})
    assert not short and "not found" in notes[1]


def test_lesson05_fits_its_workers_to_dev_shm():
    from course_authoring.gpu_lesson05 import workers_that_fit
    per_worker = 2 * 256 * 3 * 224 * 224 * 4                 # two float32 batches of 256
    assert workers_that_fit(2 * 16 * per_worker, 256, 224, 16) == 16
    assert workers_that_fit(2 * 16 * per_worker - 1, 256, 224, 16) == 15
    assert workers_that_fit(0, 256, 224, 16) == 1


# ---- one part: its file, its failures ---------------------------------------------------------

def _fake_part(targets, skipped=()):
    def measure(part, budget_s, rehearse, shm_bytes):
        return {"fake": "test stand-in, not a measurement", "budget_s": budget_s,
                "skipped": list(skipped), "targets": targets,
                "machine": {"summary": "a test stand-in"}}
    return measure


def test_a_part_writes_its_file_and_says_its_targets(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_check, "cuda_available", lambda: True)
    lines = []
    targets = {"pinned_h2d": {"description": "pinned >= 90%", "value": 0.95, "target": ">= 0.9",
                              "met": True}}
    assert run_part("lesson04", tmp_path, 38, log=lines.append, measure=_fake_part(targets)) == 0
    doc = load_reference(LESSON04, directory=tmp_path)
    assert doc["results"]["budget_s"] == 38 and "rehearsal" not in doc["results"]
    assert doc["machine"] == {"summary": "a test stand-in"}
    assert "[MET    ] pinned_h2d: measured 0.95" in "\n".join(lines)


def test_a_part_whose_section_raised_exits_2_and_keeps_what_it_measured(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_check, "cuda_available", lambda: True)
    lines = []
    measure = _fake_part({}, skipped=["failed: training loop: RuntimeError: bus error (stand-in)",
                                      "augmentation at batch sizes [256] (budget)"])
    assert run_part("lesson05", tmp_path, 62, log=lines.append, measure=measure) == 2
    assert load_reference(LESSON05, directory=tmp_path) is not None
    assert any(line.startswith("[gpu-check] lesson05: FAILED failed: training loop") for line in lines)
    assert not any("FAILED augmentation" in line for line in lines)   # a budget skip is no failure


def test_a_rehearsed_part_runs_without_cuda_and_is_marked(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_check, "cuda_available", lambda: False)
    assert run_part("lesson04", tmp_path, 5, rehearse=True, log=lambda line: None,
                    measure=_fake_part({})) == 0
    assert "not a reference" in load_reference(LESSON04, directory=tmp_path)["results"]["rehearsal"]


def test_section_failures_reads_both_shapes():
    assert gpu_check._section_failures({"skipped": {"a": "failed: X: y", "b": "budget: 1 s"}}) == [
        "section a: failed: X: y"]
    assert gpu_check._section_failures({"skipped": ["training loop (budget)"]}) == []
    assert gpu_check._section_failures({}) == []


# ---- the summary ------------------------------------------------------------------------------

def _results(**status):
    names = {"lesson04": "lesson04 benchmarks (full mode)", "lesson05": "lesson05 benchmarks (full mode)",
             "doctor": "doctor"}
    return [StepResult(names[k], v, 3.0, 50, 0 if v == "passed" else 1,
                       [] if v == "passed" else [f"{k} broke (stand-in)"]) for k, v in status.items()]


def test_the_summary_reads_the_targets_and_names_what_was_not_measured(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_check, "cuda_available", lambda: True)
    met = {"pinned_h2d": {"value": 0.95, "target": ">= 0.9", "met": True}}
    run_part("lesson04", tmp_path, 38, log=lambda line: None, measure=_fake_part(met))
    summary = summarize(tmp_path, _results(doctor="passed", lesson04="passed", lesson05="failed"),
                        _mem(60), rehearse=False)
    assert sorted(p.stem for p in tmp_path.glob("*.json")) == sorted([LESSON04, SUMMARY])
    assert summary["targets"]["pinned_h2d"]["met"] is True
    for name in ("augment_speedup", "tuned_data_wait"):
        assert summary["targets"][name]["met"] is None
        assert "not measured: lesson05: failed" in summary["targets"][name]["detail"]
    assert summary["failures"] == ["lesson05 benchmarks (full mode): lesson05 broke (stand-in)"]
    assert summary["all_targets_met"] is False
    doc = load_reference(SUMMARY, directory=tmp_path)
    assert doc["machine"] == {"summary": "a test stand-in"} and "rehearsal" not in doc["results"]
    json.dumps(summary)


def test_all_targets_met_only_without_failures(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_check, "cuda_available", lambda: True)
    run_part("lesson04", tmp_path, 38, log=lambda line: None,
             measure=_fake_part({"pinned_h2d": {"value": 0.95, "met": True}}))
    run_part("lesson05", tmp_path, 62, log=lambda line: None,
             measure=_fake_part({"augment_speedup": {"value": 12.0, "met": True},
                                 "tuned_data_wait": {"value": 0.03, "met": True}}))
    ok = _results(doctor="passed", lesson04="passed", lesson05="passed")
    assert summarize(tmp_path, ok, {}, rehearse=False)["all_targets_met"] is True
    broken = _results(doctor="failed", lesson04="passed", lesson05="passed")
    assert summarize(tmp_path, broken, {}, rehearse=False)["all_targets_met"] is False


def test_format_targets():
    text = format_targets({"a": {"value": 7.0, "target": ">= 10", "met": False, "description": "d"},
                           "b": {"value": None, "target": "> 1", "met": None}})
    assert "[NOT MET] a: measured 7 (target >= 10) - d" in text
    assert "[n/a    ] b: measured None" in text
    assert format_targets({}) == "  no targets were measured"


def test_the_check_runs_every_step_and_ends_with_the_summary(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gpu_check, "cuda_available", lambda: True)

    def steps(out, **_):
        noisy = "for i in range(3000): print('FAILED noisy line', i)\nraise SystemExit(4)"
        return [Step("noisy and broken", [sys.executable, "-c", noisy], 30),
                Step("fine", [sys.executable, "-c", "print('fine')"], 30),
                Step("too slow", [sys.executable, "-c", "import time; time.sleep(30)"], 2, grace_s=1)]

    assert run_check(tmp_path / "out", steps=steps) == 1
    out = capsys.readouterr().out
    log = (tmp_path / "out" / "gpu_check_log.txt").read_text()
    assert log == out and len(out) > 40_000                   # everything, in full
    tail = out[-12_000:]                                      # what the device tool shows
    assert "==================== summary: GPU check" in tail
    for line in ("FAILED", "passed", "TIMED OUT"):
        assert line in tail
    assert "noisy and broken" in tail and "exit status 4" in tail and "timed out after 2 s" in tail
    assert "files in" in tail and "gpu_check_summary.json" in tail
    assert tail.rstrip().splitlines()[-1].startswith("exit status 1: 2 of 3 steps did not pass")
    assert out.startswith("== preflight: python ") and "preflight: python " in tail   # first and last
    summary = load_reference(SUMMARY, directory=tmp_path / "out")["results"]
    assert [s["status"] for s in summary["steps"]] == ["failed", "passed", "timed out"]
    assert set(summary["preflight"]) >= PREFLIGHT_KEYS


# ---- the notebooks, without Jupyter -----------------------------------------------------------
# ---- the notebooks, without Jupyter -----------------------------------------------------------

def _write_notebook(path: Path, sources: list[str | dict]) -> Path:
    cells = []
    for src in sources:
        if isinstance(src, dict):
            cells.append(src)
        elif src.startswith("# md:"):
            cells.append({"cell_type": "markdown", "metadata": {}, "source": src[5:]})
        else:
            cells.append({"cell_type": "code", "execution_count": None, "metadata": {},
                          "outputs": [], "source": src.splitlines(True)})
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4,
                                "nbformat_minor": 5}), encoding="utf-8")
    return path


_TINY = [
    "# md: A tiny lesson",
    install_cell(),                                                         # cell 1: skipped
    "import os, pickle\n"
    "class Point:\n"
    "    pass\n"
    "assert pickle.loads(pickle.dumps(Point())).__class__ is Point   # __main__, as in a kernel\n"
    "print('mode', os.environ['COURSE_QUICK'], os.environ['MPLBACKEND'], __name__)",
    "%%writefile tiny_helper_module.py\nVALUE = 41\n",
    "%matplotlib inline\n"
    "import tiny_helper_module\n"
    "import matplotlib.pyplot as plt\n"
    "fig, ax = plt.subplots()\n"
    "ax.plot([1, 2])\n"
    "tiny_helper_module.VALUE + 1",                                         # shown: 42
    "total = 1 / 0",                                                        # cell 5 fails
    "print('never printed')",
]


def test_notebook_cells_run_in_process_and_a_failing_cell_is_reported(tmp_path, monkeypatch,
                                                                      capsys):
    monkeypatch.setenv(QUICK_ENV, "0")
    monkeypatch.delenv("MPLBACKEND", raising=False)
    monkeypatch.delitem(sys.modules, "tiny_helper_module", raising=False)
    book = _write_notebook(tmp_path / "tiny.ipynb", _TINY)
    main_module, cwd, path = sys.modules["__main__"], os.getcwd(), list(sys.path)
    seen = []
    result = run_notebook_cells(book, progress=lambda r: seen.append(r["current"]))
    sys.modules.pop("tiny_helper_module", None)
    out = capsys.readouterr()
    assert result["status"] == "failed" and result["skipped"] == [1]
    assert result["failure"] == {"cell": 5, "error": "ZeroDivisionError: division by zero",
                                 "source": "total = 1 / 0"}
    assert result["ran"] == 3 and result["not_run"] == 1 and result["code_cells"] == 6
    assert seen[:4] == [2, 3, 4, 5]
    assert "mode 1 Agg __main__" in out.out and "\n42\n" in out.out
    assert "Writing tiny_helper_module.py" in out.out and "never printed" not in out.out
    assert "ZeroDivisionError" in out.err                    # the traceback, for the log
    assert (tmp_path / "tiny_helper_module.py").read_text() == "VALUE = 41\n"
    # everything is put back
    assert sys.modules["__main__"] is main_module and os.getcwd() == cwd and sys.path == path
    assert os.environ[QUICK_ENV] == "0" and "MPLBACKEND" not in os.environ


@pytest.mark.parametrize("source, words", [
    ("x = 1\n%timeit x + 1", "line 2: '%timeit x + 1' is an IPython magic"),
    ("!ls", "shell escape"),
    ("%%bash\necho hi", "cell magic '%%bash' needs a Jupyter kernel"),
])
def test_a_magic_the_runner_cannot_run_fails_its_cell(tmp_path, source, words):
    book = _write_notebook(tmp_path / "magic.ipynb", ["y = 2", source, "z = 3"])
    result = run_notebook_cells(book, log=lambda line: None)
    assert result["status"] == "failed" and result["failure"]["cell"] == 1
    assert result["failure"]["error"].startswith("UnsupportedMagic") and words in result["failure"]["error"]


def test_an_unreadable_notebook_is_a_clear_error(tmp_path):
    (tmp_path / "bad.ipynb").write_text("{not json")
    with pytest.raises(ValueError, match="not a readable notebook"):
        run_notebook_cells(tmp_path / "bad.ipynb")


def test_keep_going_runs_every_cell_and_lists_each_failure(tmp_path):
    book = _write_notebook(tmp_path / "two.ipynb", ["a = 1", "1 / 0", "b = a + 1", "b + c"])
    result = run_notebook_cells(book, log=lambda line: None, keep_going=True)
    assert result["status"] == "failed" and result["ran"] == 2 and result["not_run"] == 0
    assert [f["cell"] for f in result["failures"]] == [1, 3]
    assert result["failure"] == result["failures"][0]
    assert result["failures"][1]["error"] == "NameError: name 'c' is not defined"


def test_a_notebook_step_names_every_failed_cell_at_the_end(tmp_path, monkeypatch, capsys):
    _write_notebook(tmp_path / "05_x.ipynb", ["%%writefile x_mod_for_test.py\nV = 2\n",
                                              "import x_mod_for_test\nx_mod_for_test.V",
                                              "raise KeyError('k')"])
    monkeypatch.chdir(tmp_path.parent)                   # a relative path, as gpu-check passes it
    monkeypatch.delitem(sys.modules, "x_mod_for_test", raising=False)
    assert main(["--notebook", f"{tmp_path.name}/05_x.ipynb"]) == 1
    sys.modules.pop("x_mod_for_test", None)
    lines = capsys.readouterr().out.splitlines()
    assert lines[-2] == "[notebook] 05_x.ipynb: FAILED cell 2 (\"raise KeyError('k')\"): KeyError: 'k'"
    assert lines[-1].startswith("[notebook] 05_x.ipynb: failed: 2 of 3 code cells ran")
    assert main(["--notebook", str(tmp_path / "nope.ipynb")]) == 1


# ---- tools/device_gpu_check.sh ----------------------------------------------------------------

def test_the_script_is_valid_bash_and_hands_over_to_gpu_check(tmp_path):
    proc = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    stub = tmp_path / "python"
    stub.write_text('#!/usr/bin/env bash\necho "stub python: $* (PYTHONPATH=$PYTHONPATH)"\nexit 7\n')
    stub.chmod(0o755)
    proc = subprocess.run(["bash", str(SCRIPT), "--rehearse"], capture_output=True, text=True,
                          env=dict(os.environ, OUT=str(tmp_path / "o"), PYTHON=str(stub)),
                          cwd=str(tmp_path), timeout=60)
    assert proc.returncode == 7                                 # its exit status is the check's
    assert proc.stdout.startswith(f"stub python: -m course_authoring gpu-check --out {tmp_path}/o "
                                  f"--log {tmp_path}/o/gpu_check_log.txt --rehearse (PYTHONPATH={ROOT}")


def test_the_optional_libraries_are_named_and_a_missing_dali_says_what_skips(monkeypatch):
    G = gpu_preflight
    monkeypatch.setattr(G, "dali_missing", lambda: "NVIDIA DALI is not installed: pip install -e .[dali] (make lab and make test do).")
    dali, decoder = G.optional_library_notes()
    assert dali.startswith("NVIDIA DALI is not installed") and "deep dive 11 skips here" in dali
    assert "'mixed' path waits for a GPU machine" in dali and decoder.startswith("JPEG tensor decoder: ")
    monkeypatch.setattr(G, "dali_missing", lambda: None)
    assert G.optional_library_notes()[0] == "NVIDIA DALI: installed; lesson 05's deep dive 11 runs its pipeline here"


# ---- issue 38: the worst case, the preflight, the compile probe, /dev/shm, the targets ------

def test_the_worst_case_is_every_timeout_and_every_escalation_worked_by_hand(tmp_path):
    steps = check_steps(tmp_path, python="python3", shm_free_bytes=60 * GIB)
    timeouts = [s.timeout_s for s in steps]
    assert sum(timeouts) == 373 and len(steps) == 11
    # each step: + 0.2 poll + 1 grace + 1.5 after SIGKILL + 0.3 scans = 3 s; outside the steps:
    # 8 s and the preflight's nvidia-smi (3 s + 3 s of escalations)
    assert all(step_worst_s(s) == s.timeout_s + 3.0 for s in steps)
    assert IN_PROCESS_S == 8 and in_process_worst_s() == 8 + 3 + 3.0
    assert worst_case_s(steps, in_process_worst_s()) == 373 + 11 * 3.0 + 14 == 420 == LIMIT_S
    widened = {s.name: s.timeout_s for s in steps}
    assert widened["notebook 05 (quick)"] == 65                 # was 50: a cold torch.compile
    assert widened["lesson 07: one torchrun rank (quick)"] == 30
    ddp = next(s for s in steps if s.name.startswith("lesson 07"))
    assert "timeout_s=24" in ddp.argv[-1] and "timeout_s=18" not in ddp.argv[-1]


PREFLIGHT_KEYS = {"python", "torch", "torchvision", "cuda", "cudnn", "nccl", "cuda_available",
                  "gpus", "nvidia_smi", "compiler", "shm_total_bytes", "shm_free_bytes"}
_SMI = "0, NVIDIA H100 80GB HBM3, 570.86.15, Exclusive_Process, Enabled\n"
_VERSIONS = {"python": "3.12.3", "torch": "2.14.1+cu130", "torchvision": "0.29.1+cu130",
             "cuda": "13.0", "cudnn": 92400, "nccl": "2.27.3"}


def _fake_smi(text, status="passed"):
    def run(step, echo):
        echo(text)
        return StepResult(step.name, status, 0.1, step.timeout_s, 0 if status == "passed" else None,
                          [] if status == "passed" else ["timed out after 3 s; it was at: (nothing)"])
    return run


def test_nvidia_smi_rows_and_why_not():
    rows, why = nvidia_smi_gpus(run=_fake_smi(_SMI))
    assert why is None and rows == [{"index": "0", "name": "NVIDIA H100 80GB HBM3", "driver": "570.86.15",
                                     "compute_mode": "Exclusive_Process", "persistence_mode": "Enabled"}]
    assert nvidia_smi_gpus(run=_fake_smi("", "timed out")) == ([], "timed out after 3 s; it was at: (nothing)")
    assert nvidia_smi_gpus(run=_fake_smi("No devices were found\n")) == ([], "nvidia-smi listed no GPU")


def _lesson_check(c=None, cxx=None, header=None):
    """lesson05_compile.compile_toolchain stood in: compilers by device, one Python.h."""
    def check(device):
        compiler = c if device == "cuda" else cxx
        why = [f"no {'C' if device == 'cuda' else 'C++'} compiler ({device})"] if compiler is None else []
        why += [] if header else ["no Python.h in /nowhere"]
        return {"compiler": compiler, "python_h": header, "missing": "; ".join(why) or None}
    return check


def test_the_preflight_holds_every_key_and_says_them_in_one_line():
    tools = toolchain(_lesson_check())
    pf = preflight(_mem(0.0625, 0.0625), cuda=True, gpus=lambda: nvidia_smi_gpus(run=_fake_smi(_SMI)),
                   versions=lambda: dict(_VERSIONS), tools=lambda: tools)
    assert set(pf) == PREFLIGHT_KEYS and pf["cuda_available"] is True
    json.dumps(pf)
    line = preflight_line(pf)
    for part in ("python 3.12.3", "torch 2.14.1+cu130", "torchvision 0.29.1+cu130",
                 "built for CUDA 13.0 (a GPU is visible)",
                 "cuDNN 92400", "NCCL 2.27.3", "compute mode Exclusive_Process", "persistence Enabled",
                 "C compiler none", "Python.h MISSING", "/dev/shm 0.1 GiB free of 0.1 GiB"):
        assert part in line, part
    warnings = preflight_warnings(pf, rehearse=False)
    assert warnings[0] == ("WARNING: torch.compile cannot build kernels on cuda here (no C compiler (cuda); "
                           "no Python.h in /nowhere): its probe and notebook 05's compile cell skip, saying so")
    assert "compute mode Exclusive_Process" in warnings[1]
    bare = preflight_line(dict(pf, gpus=[], nvidia_smi="could not start 'nvidia-smi'", cuda=None,
                               cuda_available=False, shm_free_bytes=None))
    assert "nvidia-smi: could not start" in bare and "a CPU build of torch (no GPU visible)" in bare
    assert bare.endswith("/dev/shm not found")


def test_the_toolchain_is_lesson_05s_own_check_asked_for_cuda_and_the_cpu():
    only_c = toolchain(_lesson_check(c="/opt/clang", header="/inc/Python.h"))
    assert only_c == {"c_compiler": "/opt/clang", "cxx_compiler": None, "python_h": "/inc/Python.h",
                      "ok_cuda": True, "ok_cpu": False, "why_not_cuda": None,
                      "why_not_cpu": "no C++ compiler (cpu)"}
    only_cxx = toolchain(_lesson_check(cxx="/usr/bin/g++"))
    assert (only_cxx["ok_cuda"], only_cxx["ok_cpu"]) == (False, False) and only_cxx["python_h"] is None
    assert only_cxx["why_not_cpu"] == "no Python.h in /nowhere"
    # by default: the notebook's %%writefile lesson05_compile cell, as the learner runs it
    lesson = gpu_preflight.notebook_module(gpu_preflight.NOTEBOOK, "lesson05_compile").compile_toolchain
    here = toolchain()
    assert here == toolchain(lesson)
    assert (here["c_compiler"], here["ok_cpu"]) == (lesson("cuda")["compiler"], lesson("cpu")["missing"] is None)


def test_without_a_toolchain_the_compile_probe_skips_with_the_reason(monkeypatch):
    tools = toolchain(_lesson_check(c="/usr/bin/gcc", header="/inc/Python.h"))   # C, but no C++
    monkeypatch.setattr(torch, "compile", lambda *a, **k: pytest.fail("compiled without a toolchain"))
    result = compile_probe("cpu", tools)
    assert result["skipped"] == "torch.compile on cpu not tried: no C++ compiler (cpu)"
    lines = []
    assert run_compile_probe(rehearse=True, log=lines.append, probe=lambda d: result) == 0
    assert lines == [f"[compile] skipped: {result['skipped']}"]


def test_a_compile_that_raises_or_differs_fails_the_probe_step(monkeypatch):
    class BackendCompilerFailed(RuntimeError):
        pass

    def raises(device):
        raise BackendCompilerFailed("backend='inductor' raised:\nCalledProcessError: gcc failed")

    lines = []
    assert run_compile_probe(rehearse=True, log=lines.append, probe=raises) == 1
    assert lines == ["[compile] FAILED: torch.compile on cpu: BackendCompilerFailed: backend='inductor' raised:"]
    ran = {"skipped": None, "first_call_s": 12.5, "second_call_s": 0.002, "max_abs_diff": 0.5}
    assert run_compile_probe(rehearse=True, log=lines.append, probe=lambda d: ran) == 1
    assert "FAILED: they differ" in lines[-1]
    assert run_compile_probe(rehearse=True, log=lines.append, probe=lambda d: dict(ran, max_abs_diff=0.0)) == 0
    assert "first call (compiling) 12.5 s, second 2.0 ms" in lines[-1]
    monkeypatch.setattr(gpu_check, "cuda_available", lambda: False)
    with pytest.raises(GpuCheckRefused):
        run_compile_probe(rehearse=False, log=lines.append, probe=raises)


def _jpegs(n=3):
    import cv2
    import numpy as np
    return [torch.from_numpy(cv2.imencode(".jpg", np.full((16, 16 + i, 3), 90, np.uint8))[1].reshape(-1).copy())
            for i in range(n)]


def test_no_cuda_jpeg_decoder_is_a_skip_with_its_reason_not_a_failure():
    cpu_only = TensorDecoder("torchvision 0.29.1", lambda d, device: pytest.fail("decoded"),
                             why="torchvision 0.29.1 failed to decode a JPEG on cuda: no nvJPEG; "
                                 "decoding on the CPU instead", device="cpu")
    info, why = jpeg_decode_check("cuda", _jpegs(), decoder_for=lambda d: cpu_only)
    assert info["ran_on"] == "cpu" and why.startswith("JPEG decode on cuda: not available here (torchvision")
    assert gpu_check._section_failures({"skipped": [why]}) == []        # a skip, not a failure

    def broken(data, device):
        raise RuntimeError("nvjpegDecodeBatched failed (stand-in)")

    on_gpu = TensorDecoder("TorchCodec 0.17", broken, device="cuda")
    info, why = jpeg_decode_check(torch.device("cuda"), _jpegs(), decoder_for=lambda d: on_gpu)
    assert why.startswith("JPEG decode on cuda: TorchCodec 0.17 on cuda raised on a batch of 3: RuntimeError")
    assert gpu_check._section_failures({"skipped": [why]}) == []
    info, why = jpeg_decode_check("cpu", _jpegs(4))
    assert why is None and info["images"] == 4 and info["samples_per_s"] > 0


def test_pin_loader_bytes_are_workers_times_prefetch_plus_the_one_in_use():
    sample = 3 * 224 * 224 + 8                                     # uint8 image + int64 label
    assert pin_loader_bytes(128, 4) == (4 * 2 + 1) * 128 * sample == 173_417_472
    assert pin_loader_bytes(32, 1, prefetch=3) == 4 * 32 * sample
    assert pin_loader_bytes(128, 0) == 0                           # no workers: no shared memory


@pytest.mark.parametrize("free_mib, expect", [
    (256, (128, 4)),          # 173.4 MB <= 0.8 x 268.4 MB: as asked
    (180, (128, 3)),          # 0.8 x 188.7 MB = 151.0 MB: 3 workers need 134.9 MB
    (64, (64, 1)),            # 1 worker at 128 needs 57.8 MB > 53.7 MB: batches of 64 (28.9 MB)
    (10, (16, 1)),            # 0.8 x 10.5 MB = 8.4 MB: 1 worker, batches of 16 (7.2 MB)
    (8, None),                # 6.7 MB < 7.2 MB: skipped, saying why
])
def test_lesson04s_pinning_loaders_are_fitted_into_dev_shm(free_mib, expect):
    plan, why = plan_pin_loaders(free_mib * 1024 ** 2, batch_size=128, workers=4)
    if expect is None:
        assert plan is None and "even 1 worker with batches of 16 needs 6.9 MiB" in why
        assert "not measured" in why
    else:
        assert (plan["batch_size"], plan["num_workers"]) == expect
        assert plan["need_bytes"] == pin_loader_bytes(*expect) <= 0.8 * free_mib * 1024 ** 2
        assert ("as asked" in why) == (expect == (128, 4))
    plan, why = plan_pin_loaders(None, batch_size=128, workers=4)
    assert (plan["batch_size"], plan["num_workers"]) == (128, 4)


def _sweep(pageable, pinned_blocking, pinned_nb):
    return BandwidthSweep(device="cuda:0", sizes_bytes=[1 << 20, 1 << 28],
                          gbps={"pageable": pageable, "pinned_blocking": pinned_blocking,
                                "pinned_non_blocking": pinned_nb, "device": [900.0, 2000.0]})


def test_pinned_h2d_is_judged_against_every_copy_of_the_run_not_the_sweep_alone():
    sweep = _sweep([3.0, 8.0], [5.0, 11.0], [5.5, 12.0])        # pinned is the sweep's fastest
    results = {"mismeasure": {"nbytes": 1 << 28, "pinned": True, "honest_gbps": 13.0},
               "overlap": {"copy_bytes": 24_000_000,
                           "times_s": {"copy alone": {"pageable": 0.004, "pinned_non_blocking": 0.001}}},
               "prefetch": {"copy_s_per_batch": 0.01}}
    copies = run_h2d_copies(results, prefetch_bytes=38_535_168)
    assert [round(g, 3) for _, g in copies] == [13.0, 6.0, 24.0, 3.854]
    target = pinned_h2d_target(sweep, copies)
    assert target["value"] == 12.0 / 24.0 and target["met"] is False      # far from the run's best
    assert "overlap: pinned_non_blocking alone" in target["detail"]
    assert pinned_h2d_target(sweep, [])["value"] == 1.0                    # the sweep alone: 1.0
    near = pinned_h2d_target(sweep, [("naive-vs-honest copy", 13.0)])
    assert near["value"] == 12.0 / 13.0 and near["met"] is True            # 0.923 >= 0.9
    below = pinned_h2d_target(sweep, [("naive-vs-honest copy", 13.4)])
    assert below["met"] is False                                           # 0.896 < 0.9
    none = pinned_h2d_target(_sweep([3.0, 8.0], [None, None], [None, None]), copies)
    assert none["value"] is None and none["met"] is None


@pytest.mark.parametrize("tuned, recipe, met", [
    (0.04, None, True),        # keeps up: under 5 %
    (0.05, 0.09, False),       # not under 5 %, and not half the recipe's 9 %
    (0.30, 0.60, True),        # half the recipe's wait exactly
    (0.31, 0.60, False),
    (0.30, None, False),       # the recipe not measured: only the 5 % rule
    (None, 0.5, None),
])
def test_the_tuned_wait_target_is_keeping_up_or_halving_the_recipes_wait(tuned, recipe, met):
    assert tuned_wait_met(tuned, recipe) is met
