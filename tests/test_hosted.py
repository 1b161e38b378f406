"""The hosted-install cell: one source (course_utils/hosted.py), the same in every notebook,
a no-op off hosted services, and an install from the repository URL on them."""
from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

import pytest

from course_utils import hosted
from course_utils.__main__ import main

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = hosted.notebook_paths([ROOT / "notebooks", ROOT / "solutions", ROOT / "exercises"])


def _first_code_cell(path: Path) -> dict:
    nb = json.loads(path.read_text(encoding="utf-8"))
    return next(c for c in nb["cells"] if c["cell_type"] == "code")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_notebook_starts_with_the_current_install_cell(path):
    cell = _first_code_cell(path)
    assert cell.get("id") == hosted.CELL_ID and cell["source"] == hosted.install_cell_source(), (
        f"{path.parent.name}/{path.name}: the first code cell is not the current hosted-install "
        f"cell; run `python -m course_utils hosted-cell`.")


def test_cell_source_names_the_url_once_and_compiles():
    source = hosted.install_cell_source("https://example.org/course")
    assert source.count("https://example.org/course") == 1
    compile(source, "install-cell", "exec")


def test_bad_url_is_named():
    with pytest.raises(ValueError, match="repository_url"):
        hosted.install_cell_source("example.org/course")


def _run_cell(monkeypatch, env: dict, has_package: bool, pip_status: int = 0) -> list:
    calls = []
    for variable in hosted.HOSTED_MARKERS:
        monkeypatch.delenv(variable, raising=False)
    for variable, value in env.items():
        monkeypatch.setenv(variable, value)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: (real_find_spec(name, *a) if has_package or
                                          name != "course_utils" else None))
    monkeypatch.setattr(subprocess, "run", lambda args, **kw: calls.append(args) or
                        subprocess.CompletedProcess(args, pip_status))
    exec(compile(hosted.install_cell_source(), "install-cell", "exec"), {})
    return calls


def test_cell_does_nothing_off_hosted_services(monkeypatch):
    assert _run_cell(monkeypatch, {}, has_package=False) == []


def test_cell_does_nothing_when_the_package_is_there(monkeypatch):
    assert _run_cell(monkeypatch, {"COLAB_RELEASE_TAG": "x"}, has_package=True) == []


@pytest.mark.parametrize("variable", sorted(hosted.HOSTED_MARKERS))
def test_cell_installs_from_the_repository_on_hosted_services(monkeypatch, capsys, variable):
    calls = _run_cell(monkeypatch, {variable: "1"}, has_package=False)
    assert len(calls) == 1 and calls[0][-1] == f"git+{hosted.REPOSITORY_URL}"
    assert "installing the course" in capsys.readouterr().out


def test_hosted_service_names_the_service():
    assert hosted.hosted_service({}) is None
    assert hosted.hosted_service({"KAGGLE_KERNEL_RUN_TYPE": "Interactive"}) == "Kaggle"
    assert hosted.hosted_service({"COLAB_RELEASE_TAG": "release-x"}) == "Google Colab"


def _notebook(*cells: dict) -> dict:
    return {"cells": list(cells), "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


def test_with_install_cell_goes_after_the_title_and_replaces_an_old_copy():
    title = {"cell_type": "markdown", "id": "t", "metadata": {}, "source": "# Title"}
    setup = {"cell_type": "code", "id": "s", "metadata": {}, "outputs": [],
             "execution_count": None, "source": "import os"}
    nb = hosted.with_install_cell(_notebook(title, setup))
    assert [c["id"] for c in nb["cells"]] == ["t", hosted.CELL_ID, "s"]
    old = hosted.with_install_cell(nb, "https://old.example/course")
    again = hosted.with_install_cell(old)
    assert again == nb


def test_sync_writes_then_reports_nothing(tmp_path):
    folder = tmp_path / "notebooks"
    folder.mkdir()
    title = {"cell_type": "markdown", "id": "t", "metadata": {}, "source": "# Title"}
    (folder / "a.ipynb").write_text(json.dumps(_notebook(title)), encoding="utf-8")
    assert hosted.sync_install_cells([folder], check=True) == [folder / "a.ipynb"]
    assert hosted.sync_install_cells([folder]) == [folder / "a.ipynb"]
    assert hosted.sync_install_cells([folder], check=True) == []


def test_sync_names_a_missing_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        hosted.sync_install_cells([tmp_path / "nowhere"])


def test_cli_check_passes_on_the_repository(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert main(["hosted-cell", "--check"]) == 0
    assert "up to date" in capsys.readouterr().out


def test_a_failed_install_says_what_to_do(monkeypatch):
    with pytest.raises(RuntimeError, match="Kaggle, switch Internet on"):
        _run_cell(monkeypatch, {"KAGGLE_KERNEL_RUN_TYPE": "Interactive"}, has_package=False,
                  pip_status=1)
