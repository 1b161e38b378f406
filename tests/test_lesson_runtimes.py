"""tools/lesson_runtimes.py: the table, the README markers, and one run of tiny notebooks."""
from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from _helpers import load_tool
from course_utils.config import QUICK_ENV

ROOT = Path(__file__).resolve().parents[1]


lr = load_tool("lesson_runtimes")
R = lr.Result
MACHINE = {"usable_cpus": 2, "logical_cpus": 8, "cpu_model": "AMD EPYC 7B13", "ram_bytes": 16 * 2**30,
           "gpu": None, "torch": "2.5.1+cpu", "python": "3.11.7", "platform": "Linux x86_64"}
README = f"""# Course

## Lessons

text before

{lr.START}
{lr.PLACEHOLDER}
{lr.END}

## Commands

text after
"""


@pytest.mark.parametrize("seconds, text", [(0.4, "0 s"), (42.4, "42 s"), (59.6, "1 min 00 s"),
                                           (125, "2 min 05 s"), (3725, "1 h 02 min")])
def test_format_seconds(seconds, text):
    assert lr.format_seconds(seconds) == text


def _results():
    return [R("00_measure_first", "notebooks/00_measure_first.ipynb", "quick", True, 35.2),
            R("01_numpy", "notebooks/01_numpy.ipynb", "quick", False, 12.0,
              "code cell 3: ValueError: a | b"),
            R("00_measure_first", "notebooks/00_measure_first.ipynb", "full", True, 250.0),
            R("01_numpy", "notebooks/01_numpy.ipynb", "full", True, 600.0)]


def test_table_lists_each_lesson_in_both_modes_with_the_machine():
    table = lr.render_table(_results(), MACHINE, "2025-01-31")
    assert "2025-01-31" in table
    assert "2 usable CPUs (of 8), AMD EPYC 7B13, 16 GiB RAM, no GPU, torch 2.5.1+cpu" in table
    assert f"`{QUICK_ENV}=1`" in table
    lines = table.splitlines()
    assert lr.TABLE_HEADER in lines
    assert "| [00 measure first](notebooks/00_measure_first.ipynb) | 35 s | 4 min 10 s |" in lines
    failed = next(line for line in lines if line.startswith("| [01 numpy]"))
    assert "**failed** after 12 s: code cell 3: ValueError: a \\| b" in failed
    assert failed.endswith("| 10 min 00 s |")
    assert failed.count(" | ") == 2  # the escaped pipe does not add a column
    assert lines[-1] == "| **all lessons** | **47 s** (1 failed) | **14 min 10 s** |"


def test_table_with_quick_mode_only_and_a_gpu():
    results = [r for r in _results() if r.mode == "quick"]
    table = lr.render_table(results, dict(MACHINE, gpu="NVIDIA H100", logical_cpus=2), "2025-01-31")
    assert "2 usable CPUs, AMD EPYC 7B13, 16 GiB RAM, NVIDIA H100," in table
    assert "| 35 s | not run |" in table
    assert table.splitlines()[-1].endswith("| not run |")


def test_long_errors_are_cut():
    r = R("00_x", "notebooks/00_x.ipynb", "quick", False, 1.0, "RuntimeError: " + "x" * 300)
    row = lr.render_table([r], MACHINE, "d").splitlines()[-2]
    assert "..." in row and len(row) < 200


def test_replace_between_markers_touches_nothing_else():
    table = lr.render_table(_results(), MACHINE, "2025-01-31")
    new = lr.replace_between_markers(README, table)
    before, after = README.split(lr.START)[0], README.split(lr.END)[1]
    assert new.startswith(before + lr.START + "\n") and new.endswith(lr.END + after)
    assert lr.between_markers(new) == table
    assert lr.PLACEHOLDER not in new
    assert lr.replace_between_markers(new, table) == new  # idempotent
    assert lr.replace_between_markers(new, lr.PLACEHOLDER) == README  # and back


@pytest.mark.parametrize("text, message", [
    ("# no markers\n", "no <!-- lesson-runtimes:start --> and"),
    (f"{lr.START}\n", "no <!-- lesson-runtimes:end -->"),
    (f"{lr.END}\n{lr.START}\n", "comes before"),
    (f"{lr.START}\n{lr.END}\n{lr.START}\n{lr.END}\n", "more than once"),
])
def test_bad_markers_are_refused(text, message):
    with pytest.raises(lr.MarkerError, match=message):
        lr.replace_between_markers(text, "table")
    assert not lr.has_table(text)


def test_check(tmp_path, capsys):
    readme = tmp_path / "README.md"
    readme.write_text("# nothing\n")
    assert lr.main(["--check", "--readme", str(readme)]) == 1
    readme.write_text(README)
    assert lr.main(["--check", "--readme", str(readme)]) == 1  # the placeholder is no table
    assert "make runtimes" in capsys.readouterr().err
    readme.write_text(lr.replace_between_markers(README, lr.render_table(_results(), MACHINE, "d")))
    assert lr.main(["--check", "--readme", str(readme)]) == 0


def test_the_course_readme_has_the_markers_once():
    text = (ROOT / "README.md").read_text()
    lr.between_markers(text)  # raises MarkerError otherwise


def test_discover_and_choose_lessons(tmp_path):
    for name in ("00_a", "01_b", "10_c"):
        (tmp_path / f"{name}.ipynb").write_text("{}")
    assert [p.stem for p in lr.discover(tmp_path)] == ["00_a", "01_b", "10_c"]
    assert [p.stem for p in lr.discover(tmp_path, ["10", "00"])] == ["00_a", "10_c"]
    assert [p.stem for p in lr.discover(tmp_path, ["01_b"])] == ["01_b"]
    with pytest.raises(ValueError, match="no lesson '07'.*00_a, 01_b, 10_c"):
        lr.discover(tmp_path, ["07"])


def test_from_json_rebuilds_the_table(tmp_path):
    from dataclasses import asdict
    saved = tmp_path / "runs.json"
    saved.write_text(json.dumps({"date": "2025-01-31", "machine": MACHINE,
                                 "results": [asdict(r) for r in _results()]}))
    readme = tmp_path / "README.md"
    readme.write_text(README)
    assert lr.main(["--from-json", str(saved), "--readme", str(readme)]) == 1  # one run failed
    assert lr.between_markers(readme.read_text()) == lr.render_table(
        _results(), MACHINE, "2025-01-31", readme_dir=tmp_path)


def _notebook(path: Path, *sources: str) -> None:
    nb = new_notebook(cells=[new_markdown_cell("# tiny")] + [new_code_cell(s) for s in sources])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, str(path))


def test_tiny_notebooks_end_to_end(tmp_path, capsys):
    """Two tiny notebooks in a fresh kernel each: one passes (in quick mode), one fails; the
    failure is in the table, not a crash. The time limit is far beyond any kernel start-up, so
    a loaded machine cannot turn either result into a timeout (timeouts: the next test)."""
    nbs = tmp_path / "notebooks"
    nbs.mkdir()
    _notebook(nbs / "00_ok.ipynb", "import os",
              f"assert os.environ[{QUICK_ENV!r}] == '1', 'not quick mode'\nprint('ok')")
    _notebook(nbs / "01_fails.ipynb", "x = 1", "raise KeyError('missing thing')\n# second line")
    readme = tmp_path / "README.md"
    readme.write_text(README)
    out = tmp_path / "build" / "runs.json"
    code = lr.main(["--notebooks", str(nbs), "--readme", str(readme), "--json", str(out),
                    "--quick-only", "--timeout", "600"])
    assert code == 1
    printed = capsys.readouterr().out
    assert "[quick 1/2] 00_ok" in printed and "[quick 2/2] 01_fails" in printed
    data = json.loads(out.read_text())
    by_lesson = {r["lesson"]: r for r in data["results"]}
    assert by_lesson["00_ok"]["ok"] and by_lesson["00_ok"]["mode"] == "quick"
    assert by_lesson["01_fails"]["error"] == "code cell 2: KeyError: 'missing thing'"
    assert data["machine"]["usable_cpus"] >= 1
    table = lr.between_markers(readme.read_text())
    assert "| [00 ok](notebooks/00_ok.ipynb) |" in table
    assert "**failed**" in table and "KeyError: 'missing thing'" in table
    assert readme.read_text().endswith("## Commands\n\ntext after\n")


def test_the_time_limit_is_for_the_whole_notebook(tmp_path):
    """Three cells of 1.5 s under a 2 s limit: each cell alone fits, the notebook does not.
    The limit counts from the kernel's start and every cell gets at least 1 s, so the second
    cell starts with at most 1 s left and always times out, however slow the machine (a
    per-cell limit would let all three run)."""
    path = tmp_path / "02_slow.ipynb"
    _notebook(path, "import time; time.sleep(1.5)", "time.sleep(1.5)", "time.sleep(1.5)")
    r = lr.run_notebook(path, quick=True, timeout=2)
    assert not r.ok
    assert r.error in ("code cell 1: timed out after 2 s", "code cell 2: timed out after 2 s")


def _flaky_kernel(tmp_path: Path, monkeypatch, failures: int) -> str:
    """A kernelspec whose first ``failures`` launches die at once, as a kernel does that loses a
    port race with another one starting at the same time; later launches are ipykernel."""
    import sys
    counter = tmp_path / "launches"
    launcher = tmp_path / "flaky_kernel.py"
    launcher.write_text(
        "import pathlib, sys\n"
        f"counter = pathlib.Path({str(counter)!r})\n"
        "n = int(counter.read_text()) if counter.exists() else 0\n"
        "counter.write_text(str(n + 1))\n"
        f"if n < {failures}:\n"
        "    print('flaky kernel: address already in use', file=sys.stderr); sys.exit(1)\n"
        "from ipykernel.kernelapp import launch_new_instance\n"
        "launch_new_instance()\n")
    spec_dir = tmp_path / "jupyter" / "kernels" / "flaky"
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, str(launcher), "-f", "{connection_file}"],
        "display_name": "flaky", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    return "flaky"


@pytest.mark.parametrize("failures, ok", [(1, True), (2, False)])
def test_a_kernel_that_does_not_start_is_started_once_more(tmp_path, monkeypatch, capsys, failures, ok):
    name = _flaky_kernel(tmp_path, monkeypatch, failures)
    nb_path = tmp_path / "00_tiny.ipynb"
    _notebook(nb_path, "print('ran')")
    nb = nbformat.read(str(nb_path), as_version=4)
    nb.metadata["kernelspec"]["name"] = name
    nbformat.write(nb, str(nb_path))
    log = tmp_path / "kernels.log"
    log.write_text("")
    r = lr.run_notebook(nb_path, quick=True, timeout=60, kernel_log=log)
    assert r.ok is ok, r.error
    assert (tmp_path / "launches").read_text() == "2"  # never more than one retry
    assert "starting it again" in capsys.readouterr().out
    if not ok:
        assert "(kernel said: flaky kernel: address already in use)" in r.error
