"""tools/suite_cpu.py: the CPU floor of the suite's wall time, its areas, and the plugin that
records each test's CPU seconds."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SPEC = importlib.util.spec_from_file_location("suite_cpu", ROOT / "tools" / "suite_cpu.py")
suite_cpu = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(suite_cpu)

ROWS = [("notebooks/02_threads.ipynb::Cell 3", 9.0, 6.0),
        ("notebooks/02_threads.ipynb::Cell 4", 3.0, 2.0),
        ("solutions/02_worker_init.ipynb::Cell 1", 2.5, 2.0),
        ("tests/test_grader02.py::test_a", 1.5, 4.0),
        ("tests/test_grading.py::test_b", 0.5, 1.0),
        ("tests/test_diagnose_cli.py::test_c", 4.0, 3.5),
        ("tests/test_data.py::test_d[spawn]", 1.0, 1.5)]


def test_each_test_file_has_its_area():
    assert suite_cpu.area_of("notebooks/00_measure_first.ipynb::Cell 0").startswith("lessons")
    assert suite_cpu.area_of("solutions/00_measure_first.ipynb::Cell 0").startswith("solutions")
    assert suite_cpu.area_of("tests/test_grader06.py::t").startswith("graders")
    assert suite_cpu.area_of("tests/test_grading.py::t").startswith("graders")
    assert suite_cpu.area_of("tests/test_diagnose_script.py::t").startswith("diagnose")
    assert suite_cpu.area_of("tests/test_notebooks.py::t").startswith("the grade run")
    assert suite_cpu.area_of("tests/test_data.py::t") == "other tests"
    assert suite_cpu.area_of("elsewhere/test_x.py::t") == "other"


def test_totals_add_up_per_key_most_cpu_first():
    per_file = suite_cpu.totals(ROWS, lambda i: i.split("::")[0])
    assert per_file[0] == ("notebooks/02_threads.ipynb", 12.0, 8.0, 2)
    assert per_file[1] == ("tests/test_diagnose_cli.py", 4.0, 3.5, 1)
    assert [t[1] for t in per_file] == sorted((t[1] for t in per_file), reverse=True)
    assert sum(t[1] for t in per_file) == pytest.approx(21.5)


def test_the_report_gives_the_floor_cpu_over_cores():
    text = suite_cpu.report(ROWS, cores=2, top=2, notebooks=None)
    assert text.startswith("7 test items: 22 CPU seconds in 20 s run one at a time; on 2 cores "
                           "the suite cannot take less than 11 s")
    areas = text.split("area\n")[1].split("\n\n")[0].splitlines()
    assert areas[0] == "    12    56%       8      2  lessons (notebooks/, under nbval)"   # 12 of 21.5
    assert areas[3] == "     2     9%       5      2  graders (tests/test_grader*.py, test_grading.py)"
    assert len(areas) == 5
    items = text.split("CPU s  wall s  item\n")[1].splitlines()
    assert items == ["   9.0     6.0  notebooks/02_threads.ipynb::Cell 3",
                     "   4.0     3.5  tests/test_diagnose_cli.py::test_c"]      # top=2
    assert suite_cpu.report(ROWS, cores=4, notebooks=None).splitlines()[0].endswith(
        "cannot take less than 5 s of wall time (CPU / cores), however it is spread over pytest "
        "processes.")
    with pytest.raises(ValueError, match="no test was recorded"):
        suite_cpu.report([], cores=2, notebooks=None)


def _cell(kind, text):
    return {"cell_type": kind, "source": text, "metadata": {}, **({"outputs": []} if kind == "code" else {})}


def test_each_lessons_cpu_is_split_into_its_core_path_and_its_deep_dives(tmp_path):
    cells = [_cell("markdown", "# Lesson 02"), _cell("code", "a = 1"),              # Cell 0: core
             _cell("markdown", "## Deep dive (optional, ~5 min): pools"), _cell("code", "b = 2"),
             _cell("code", "c = 3"),                                                # Cells 1, 2: deep
             _cell("markdown", "## 3. Back to the core"), _cell("code", "d = 4")]   # Cell 3: core
    (tmp_path / "02_threads.ipynb").write_text(json.dumps({"cells": cells}))
    rows = [("notebooks/02_threads.ipynb::Cell 0", 1.0, 1.0), ("notebooks/02_threads.ipynb::Cell 1", 2.0, 1.0),
            ("notebooks/02_threads.ipynb::Cell 2", 4.0, 1.0), ("notebooks/02_threads.ipynb::Cell 3", 8.0, 1.0),
            ("solutions/02_worker_init.ipynb::Cell 1", 16.0, 1.0)]
    assert suite_cpu.lesson_split(rows, tmp_path) == [("02_threads.ipynb", 9.0, 6.0)]
    text = suite_cpu.report(rows, cores=2, notebooks=tmp_path)
    assert "   9.0 +   6.0  02_threads.ipynb\n   9.0 +   6.0  all lessons" in text
    assert "core path + deep dives" not in suite_cpu.report(rows[4:], cores=2, notebooks=tmp_path)


def test_bad_input_is_one_line(tmp_path, capsys):
    assert suite_cpu.main([str(tmp_path / "missing.tsv")]) == 2
    assert "record it first with make suite-cpu" in capsys.readouterr().err
    bad = tmp_path / "bad.tsv"
    bad.write_text("tests/test_x.py::t\t1.0\t2.0\nnot a row\n")
    assert suite_cpu.main([str(bad)]) == 2
    assert "line 2: not a line the suite_cpu plugin writes" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        suite_cpu.main([str(bad), "--cores", "0"])
    assert "--cores and --top must be at least 1" in capsys.readouterr().err


def test_the_plugin_records_every_item_with_its_children(tmp_path):
    """A test that burns CPU in a child process is charged for it: the figure is the machine's."""
    (tmp_path / "test_tiny.py").write_text(
        "import subprocess, sys\n"
        "def test_busy_child():\n"
        "    subprocess.run([sys.executable, '-c', 'import time\\nt = time.process_time()\\n"
        "while time.process_time() - t < 0.5: pass'], check=True)\n"
        "def test_idle():\n"
        "    pass\n")
    out = tmp_path / "cpu.tsv"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "tools"), SUITE_CPU_TSV=str(out))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "suite_cpu", "-p", "no:cacheprovider",
                           "-n", "0", str(tmp_path / "test_tiny.py")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = dict((r[0].rsplit("::", 1)[1], r[1]) for r in suite_cpu.read_rows(out))
    assert set(rows) == {"test_busy_child", "test_idle"}
    assert rows["test_busy_child"] >= 0.4 and rows["test_busy_child"] > rows["test_idle"]


def test_the_longest_scopes_go_first_and_each_keeps_its_order():
    """conftest.py: the lessons, then the longest test files, then the rest, each file whole."""
    spec = importlib.util.spec_from_file_location("root_conftest", ROOT / "conftest.py")
    root_conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(root_conftest)

    class Item:
        def __init__(self, nodeid):
            self.nodeid = nodeid

    ids = ["solutions/00_measure_first.ipynb::Cell 0", "tests/test_advice.py::test_a",
           "tests/test_tuning.py::test_x", "tests/test_advice.py::test_b",
           "tests/test_rerun.py::TestLesson07::test_r", "tests/test_tuning.py::test_y",
           "tests/test_rerun.py::TestLesson00::test_r", "tests/test_notebooks.py::test_z"]
    items = [Item(i) for i in ids]
    root_conftest.pytest_collection_modifyitems(None, None, items)
    assert [i.nodeid for i in items] == [
        "tests/test_rerun.py::TestLesson07::test_r", "tests/test_rerun.py::TestLesson00::test_r",
        "tests/test_notebooks.py::test_z", "tests/test_tuning.py::test_x",
        "tests/test_tuning.py::test_y", "solutions/00_measure_first.ipynb::Cell 0",
        "tests/test_advice.py::test_a", "tests/test_advice.py::test_b"]
    test_rerun = __import__("test_rerun")
    for prefix in root_conftest.LONGEST_FIRST:                    # every prefix names a real test
        path, _, scope = prefix.partition("::")
        assert list(ROOT.glob(path.rstrip("/") + "*")), prefix
        assert not scope or hasattr(test_rerun, scope), prefix
    with open(ROOT / "Makefile", encoding="utf-8") as makefile:   # else xdist sorts by test count
        assert "--dist loadscope --no-loadscope-reorder" in makefile.read()
