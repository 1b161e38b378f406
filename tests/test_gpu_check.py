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
from course_authoring.gpu_check import (IN_PROCESS_S, LIMIT_S, OWN_FILES, GpuCheckRefused,
                                        check_steps, format_targets, host_memory, main,
                                        memory_notes, plan_shm, run_check, run_part, summarize)
from course_authoring.hosted import install_cell
from course_authoring.notebook_runner import run_notebook_cells
from course_authoring.step_runner import Step, StepResult, worst_case_s
from course_utils.config import QUICK_ENV
from course_utils.reference import (LESSON04, LESSON05, REFERENCE_DIR, REFERENCE_NAMES, SUMMARY,
                                    available_references, load_reference)

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
    assert worst_case_s(steps, IN_PROCESS_S) <= LIMIT_S <= 420
    assert len(set(OWN_FILES) | {f"{n}.json" for n in REFERENCE_NAMES}) <= 8
    written = {Path(a).name for s in steps for a in s.argv if str(a).startswith(str(tmp_path) + "/")}
    assert written <= set(OWN_FILES)                          # tune's and diagnose's JSON
    parts = [s for s in steps if "--part" in s.argv]
    assert all(str(tmp_path) in s.argv for s in parts) and len(parts) == 2
    for s in parts:                                           # room inside the timeout to start
        assert s.timeout_s - float(s.argv[s.argv.index("--budget") + 1]) >= 10


def test_quick_steps_prove_paths_on_few_cpus_and_the_parts_measure_in_full(tmp_path):
    steps = {s.name: s for s in check_steps(tmp_path, python="python3")}
    quick = [s for s in steps.values() if s.env.get(QUICK_ENV) == "1"]
    assert {s.name.split(":")[0] for s in quick} >= {"lesson 06", "lesson 07", "lesson 08"}
    assert all(s.max_cpus == gpu_check.QUICK_CPUS for s in quick)
    assert sum("notebook" in s.name for s in quick) == 3
    full = [s for s in steps.values() if "--part" in s.argv]
    assert all(QUICK_ENV not in s.env and s.max_cpus is None for s in full)
    assert not steps["nvidia-smi"].required and all(s.required for s in quick + full)
    assert all("--rehearse" in s.argv for s in check_steps(tmp_path, rehearse=True) if "--part" in s.argv)


def test_a_short_dev_shm_shrinks_tune_and_tells_lesson05(tmp_path):
    steps = check_steps(tmp_path, python="python3", shm_free_bytes=GIB)
    tune = next(s for s in steps if s.name.startswith("lesson 06"))
    assert "--images" in tune.argv and "--batch-size" in tune.argv
    l05 = next(s for s in steps if "lesson05" in s.argv)
    assert l05.argv[l05.argv.index("--shm-bytes") + 1] == str(GIB)
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
    assert available_references(tmp_path) == sorted([LESSON04, SUMMARY])
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
    summary = load_reference(SUMMARY, directory=tmp_path / "out")["results"]
    assert [s["status"] for s in summary["steps"]] == ["failed", "passed", "timed out"]


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
    from course_authoring import gpu_check as G
    monkeypatch.setattr(G, "dali_missing", lambda: "NVIDIA DALI is not installed: pip install -e .[dali] (make lab and make test do).")
    dali, decoder = G.optional_library_notes()
    assert dali.startswith("NVIDIA DALI is not installed") and "deep dive 11 skips here" in dali
    assert "'mixed' path waits for a GPU machine" in dali and decoder.startswith("JPEG tensor decoder: ")
    monkeypatch.setattr(G, "dali_missing", lambda: None)
    assert G.optional_library_notes()[0] == "NVIDIA DALI: installed; lesson 05's deep dive 11 runs its pipeline here"
