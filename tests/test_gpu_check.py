"""gpu-check: refuses without CUDA and writes nothing; its plan; and, with the GPU steps
replaced by stand-ins that return labelled fake dicts (written only to a temporary folder),
the files it writes and the summary of targets. No GPU figure is made up: the fakes never
reach course_utils/reference_results/."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from course_authoring import gpu_check
from course_authoring.gpu_check import (GpuCheckRefused, format_targets, host_memory, main,
                                        memory_notes, plan, run_gpu_check)
from course_authoring.hosted import install_cell
from course_authoring.notebook_runner import run_notebook, run_notebook_cells
from course_utils.config import QUICK_ENV
from course_utils.reference import (LESSON04, LESSON05, REFERENCE_DIR, REFERENCE_NAMES, SUMMARY,
                                    available_references, load_reference)

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
    assert "python -m course_authoring gpu-check" in str(info.value)
    assert not out.exists()
    assert main(["--out", str(out)]) == 1
    assert "needs a CUDA GPU" in capsys.readouterr().err
    assert not out.exists()
    assert main([]) == 1                              # default folder: still nothing written
    assert _snapshot(REFERENCE_DIR) == before


@pytest.mark.skipif(CUDA, reason="this machine has CUDA")
def test_command_line_refuses_with_nonzero_exit(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "course_authoring.gpu_check", "--out",
                           str(tmp_path / "o")], capture_output=True, text=True, env=env,
                          cwd=str(ROOT), timeout=100)
    assert proc.returncode == 1 and "needs a CUDA GPU" in proc.stderr
    assert not (tmp_path / "o").exists()


def test_importing_it_loads_no_notebook_machinery():
    code = ("import sys, course_authoring.gpu_check; "
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
            "targets": {"augment_speedup": {"description": "on-device >= 10x CPU", "value": 7.0,
                                            "target": ">= 10", "met": False},
                        "tuned_data_wait": {"description": "tuned data-wait < 5%", "value": 0.03,
                                            "target": "< 0.05", "met": True},
                        "skipped_one": {"description": "not measured", "value": None,
                                        "target": "> 1", "met": None}}}


def _fake05_met(budget_s):
    return {"fake": "test stand-in, not a measurement", "skipped": [],
            "targets": {"augment_speedup": {"value": 12.0, "target": ">= 10", "met": True},
                        "tuned_data_wait": {"value": 0.03, "target": "< 0.05", "met": True}}}


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
    assert doc04["results"]["budget_s"] == pytest.approx(gpu_check.SHARES["lesson04"] * 540)
    assert doc04["machine"]["torch_version"] == torch.__version__
    doc = load_reference(SUMMARY, directory=tmp_path)
    assert set(doc["results"]["targets"]) == {"pinned_h2d", "augment_speedup", "tuned_data_wait",
                                              "skipped_one"}
    assert doc["results"]["failures"] == [] and "ram_available_bytes" in doc["results"]["memory"]
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
    results = doc["results"]
    assert any("lesson05" in f and "out of memory" in f for f in results["failures"])
    assert results["all_targets_met"] is False
    for name in ("augment_speedup", "tuned_data_wait"):       # expected, not measured: said so
        assert results["targets"][name]["met"] is None
        assert "not measured: lesson05 failed" in results["targets"][name]["detail"]
    assert "FAILED" in capsys.readouterr().out


def test_format_targets():
    text = format_targets(_fake05(1)["targets"])
    assert "[NOT MET] augment_speedup: measured 7 (target >= 10)" in text
    assert "[n/a    ] skipped_one: measured None" in text
    assert format_targets({}) == "no targets were measured"


@pytest.mark.skipif(CUDA, reason="this machine has CUDA")
def test_the_course_command_line_has_gpu_check(tmp_path, capsys):
    from course_authoring.__main__ import main as course_main
    assert course_main(["gpu-check", "--out", str(tmp_path / "o")]) == 1
    assert "needs a CUDA GPU" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
    assert course_main(["gpu-check", "--plan"]) == 0


def test_a_section_that_raised_inside_lesson04_fails_the_run(tmp_path, fake_gpu, monkeypatch,
                                                             capsys):
    # run_gpu_benchmarks records a section that raised as skipped[...] = "failed: ...": that
    # must fail the run, and the target that section measures must not count as met
    def sweep_broke(budget_s):
        return {"fake": "test stand-in", "skipped": {
                    "sweep": "failed: RuntimeError: CUDA error (stand-in)",
                    "dtype": "budget: 1 s left, about 3 s needed"}, "targets": {}}

    monkeypatch.setattr(gpu_check, "_lesson04", sweep_broke)
    monkeypatch.setattr(gpu_check, "_lesson05", _fake05_met)
    assert main(["--out", str(tmp_path), "--no-notebooks"]) == 2
    out = capsys.readouterr().out
    assert "lesson04: FAILED section sweep: failed: RuntimeError" in out
    results = load_reference(SUMMARY, directory=tmp_path)["results"]
    assert results["steps"]["lesson04"]["status"] == "failed"
    assert results["failures"] == ["lesson04: section sweep: failed: RuntimeError: CUDA error "
                                   "(stand-in)"]                # a budget skip is no failure
    assert results["targets"]["pinned_h2d"]["met"] is None
    assert "not measured" in results["targets"]["pinned_h2d"]["detail"]
    assert results["all_targets_met"] is False
    assert "[n/a    ] pinned_h2d" in out and "FAILED: 1 failure(s)" in out
    # what was measured is kept: lesson 04's file is written, with its failures inside
    doc04 = load_reference(LESSON04, directory=tmp_path)
    assert doc04["results"]["skipped"]["sweep"].startswith("failed:")


def test_all_targets_met_only_without_failures(tmp_path, fake_gpu, monkeypatch):
    monkeypatch.setattr(gpu_check, "_lesson05", _fake05_met)
    summary = run_gpu_check(tmp_path, budget_s=540, notebooks=False, log=lambda line: None)
    assert summary["failures"] == [] and summary["all_targets_met"] is True
    assert main(["--out", str(tmp_path), "--no-notebooks"]) == 0


def test_the_log_names_exactly_the_reference_files(tmp_path, fake_gpu):
    lines = []
    run_gpu_check(tmp_path, budget_s=540, notebooks=False, log=lines.append)
    hint = [line for line in lines if "reference files in" in line]
    assert len(hint) == 1
    assert all(f"{n}.json" in hint[0] for n in REFERENCE_NAMES) and "*" not in hint[0]


def test_memory_notes_say_what_fits():
    mem = host_memory()
    assert mem["ram_available_bytes"] > 0 and set(mem) == {"ram_available_bytes", "ram_total_bytes",
                                                          "shm_free_bytes"}
    gib = 1024 ** 3
    notes, short = memory_notes({"ram_available_bytes": 100 * gib, "shm_free_bytes": 60 * gib})
    assert not short and "enough for lesson 05" in notes[1] and "100.0 GiB" in notes[0]
    notes, short = memory_notes({"ram_available_bytes": 100 * gib, "shm_free_bytes": gib // 16})
    assert short and "WARNING" in notes[1] and "shm-size" in notes[1]
    notes, short = memory_notes({"ram_available_bytes": gib, "shm_free_bytes": None})
    assert not short and "not found" in notes[1]


def test_section_failures_reads_both_shapes():
    assert gpu_check._section_failures({"skipped": {"a": "failed: X: y", "b": "budget: 1 s"}}) == [
        "section a: failed: X: y"]
    assert gpu_check._section_failures({"skipped": ["training loop (budget)"]}) == []
    assert gpu_check._section_failures({}) == []


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


def test_run_notebook_in_its_own_process_reports_the_failing_cell(tmp_path, capfd):
    book = _write_notebook(tmp_path / "child.ipynb",
                           ["print('hello from the notebook')",
                            "# md: text",
                            "raise ValueError('broken on purpose')",
                            "print('not reached')"])
    result = run_notebook(book, timeout_s=90)
    out = capfd.readouterr()
    assert result["status"] == "failed", result
    assert result["failure"]["cell"] == 2
    assert result["detail"] == ('cell 2 ("raise ValueError(\'broken on purpose\')") raised '
                                'ValueError: broken on purpose')
    assert "hello from the notebook" in out.out and "not reached" not in out.out


def test_run_notebook_stops_a_notebook_that_runs_out_of_time(tmp_path):
    book = _write_notebook(tmp_path / "slow.ipynb", ["import time\ntime.sleep(120)"])
    t0 = time.perf_counter()
    result = run_notebook(book, timeout_s=15)
    assert time.perf_counter() - t0 < 60
    assert result["status"] == "timed out" and "stopped after 15 s" in result["detail"]


def test_failed_and_unrun_notebooks_fail_the_check(tmp_path, fake_gpu, monkeypatch, capsys):
    good = _write_notebook(tmp_path / "04_good.ipynb", [install_cell(), "print('fine')"])
    bad = _write_notebook(tmp_path / "05_bad.ipynb", ["import math", "math.sqrt(-1)"])
    monkeypatch.setattr(gpu_check, "_notebooks", lambda: [good, bad])
    monkeypatch.setattr(gpu_check, "_lesson05", _fake05_met)
    assert plan(540)[2]["runs"] and "04_good.ipynb" in plan(540)[2]["what"]
    assert main(["--out", str(tmp_path / "out"), "--budget", "540"]) == 2
    results = load_reference(SUMMARY, directory=tmp_path / "out")["results"]
    runs = results["steps"]["notebooks"]["notebooks"]
    assert runs["04_good.ipynb"]["status"] == "passed" and runs["04_good.ipynb"]["skipped"] == [0]
    assert runs["05_bad.ipynb"]["status"] == "failed"
    assert results["failures"] == ["notebooks: notebook 05_bad.ipynb: failed: cell 1 "
                                   "('math.sqrt(-1)') raised ValueError: math domain error"]
    assert results["all_targets_met"] is False                 # though every target was met
    assert "05_bad.ipynb: failed" in capsys.readouterr().out

    # a notebook left without time is not silently dropped
    step = gpu_check._run_notebooks(time.perf_counter() + 1.0, log=lambda line: None)
    assert step["status"] == "failed" and len(step["failures"]) == 2
    assert all(r["status"] == "not run" for r in step["notebooks"].values())


# ---- tools/device_gpu_check.sh -----------------------------------------------------------------

SCRIPT = ROOT / "tools" / "device_gpu_check.sh"
#: The device tool allows one call of 600 s; the steps must leave a margin for the rest.
SCRIPT_LIMIT_S = 560


def _script_lines() -> list[str]:
    return SCRIPT.read_text(encoding="utf-8").splitlines()


def test_the_script_is_valid_bash():
    proc = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr


def test_the_script_step_budgets_add_up_to_less_than_the_call():
    code = [line.split("#")[0] for line in _script_lines() if not line.lstrip().startswith("#")]
    found = [(int(m.group(2)), int(m.group(1) or 0))
             for line in code for m in re.finditer(r"\btimeout\s+(?:-k\s+(\d+)\s+)?(\d+)\b", line)]
    assert len(found) >= 6, found
    worst = [n + k for n, k in found]
    assert sum(worst) <= SCRIPT_LIMIT_S, f"the steps may take {sum(worst)} s: {found}"
    # the comment table says the same, row by row, and its total
    rows = [re.search(r"\s(\d+)(?: \+ (\d+))?$", line) for line in _script_lines()
            if re.match(r"#   \S.*\s\d+( \+ \d+)?$", line)]
    table = [int(m.group(1)) + int(m.group(2) or 0) for m in rows]
    assert table[:-1] == worst and table[-1] == sum(worst)
    # gpu-check's own budget leaves room, inside its timeout, for python, torch and CUDA to start
    gpu = next(line for line in code if "gpu-check --out" in line)
    budget = int(re.search(r"--budget (\d+)", gpu).group(1))
    timeout = next(n for line in code for m in [re.search(r"timeout -k \d+ (\d+) .*gpu-check", line)]
                   if m for n in [int(m.group(1))])
    assert timeout - budget >= 30


def test_the_script_writes_few_files_and_names_the_ones_to_copy():
    text = SCRIPT.read_text(encoding="utf-8")
    own = set(re.findall(r'\$OUT/([A-Za-z0-9_.-]+)', text))
    assert own == {"gpu_check_log.txt", "tune_cuda.json", "diagnose_cuda.json"}
    assert len(own) + len(REFERENCE_NAMES) <= 6              # the device tool returns 8 at most
    assert f'REFERENCE_FILES="{" ".join(f"{n}.json" for n in REFERENCE_NAMES)}"' in text
    assert "*.json" not in text and "| tail" not in text


def _stub_python(tmp_path: Path) -> Path:
    stub = tmp_path / "python"
    stub.write_text('#!/usr/bin/env bash\necho "stub python: $*"\n'
                    'if [ -n "${STUB_FAIL:-}" ]; then case "$*" in *"$STUB_FAIL"*) exit 3;; esac; fi\n'
                    "exit 0\n")
    stub.chmod(0o755)
    return stub


@pytest.mark.parametrize("fail", ["", "gpu-check"])
def test_the_script_logs_everything_and_fails_when_a_step_fails(tmp_path, fail):
    out = tmp_path / "out"
    env = dict(os.environ, OUT=str(out), PYTHON=str(_stub_python(tmp_path)), STUB_FAIL=fail)
    proc = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, env=env,
                          cwd=str(ROOT), timeout=120)
    log = (out / "gpu_check_log.txt").read_text(encoding="utf-8")
    assert log == proc.stdout                                 # the whole output, in full
    assert "== memory" in log and "sizes:" in log
    assert log.index("== memory") < log.index("stub python: -m course_utils doctor")
    for words in ("-m course_authoring gpu-check --out", "-m pytest", "-m course_utils tune",
                  "-c from course_authoring.notebook_modules import notebook_module"):
        assert "stub python: " + words in log
    assert "cp " + " ".join(f"{out}/{n}.json" for n in REFERENCE_NAMES) in log
    assert len(list(out.iterdir())) <= 6
    if fail:
        assert proc.returncode == 1
        assert re.search(r"FAILED.*\n(   - .*\n)*   - gpu-check .*\(exit 3\)", log), log[-800:]
    else:
        assert proc.returncode == 0, log[-800:]
        assert "every step passed" in log
