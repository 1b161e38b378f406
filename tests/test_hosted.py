"""The hosted-install cell: one source (course_authoring/hosted.py), the same in every notebook,
a no-op off hosted services, and an install from the repository URL on them."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from IPython.core.inputtransformer2 import TransformerManager

from course_authoring import hosted
from course_authoring.__main__ import main

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
        f"cell; run `python -m course_authoring hosted-cell`.")


def test_cell_source_names_the_url_once_and_compiles():
    source = hosted.install_cell_source("https://example.org/course")
    assert source.count("https://example.org/course") == 1
    compile(TransformerManager().transform_cell(source), "install-cell", "exec")


def test_bad_url_is_named():
    with pytest.raises(ValueError, match="repository_url"):
        hosted.install_cell_source("example.org/course")


def _run_cell(monkeypatch, env: dict) -> list:
    """Run the cell as IPython would (magics transformed) with a stand-in get_ipython."""
    calls = []
    for variable in hosted.HOSTED_MARKERS:
        monkeypatch.delenv(variable, raising=False)
    for variable, value in env.items():
        monkeypatch.setenv(variable, value)

    class FakeShell:
        def run_line_magic(self, name, line):
            calls.append((name, line))

    code = TransformerManager().transform_cell(hosted.install_cell_source())
    exec(compile(code, "install-cell", "exec"), {"get_ipython": FakeShell})
    return calls


def test_cell_is_three_short_lines():
    lines = hosted.install_cell_source().splitlines()
    assert len(lines) == 3 and max(len(line) for line in lines) <= 100, lines


def test_cell_does_nothing_off_hosted_services(monkeypatch):
    assert _run_cell(monkeypatch, {}) == []


@pytest.mark.parametrize("variable", hosted.CELL_MARKERS)
def test_cell_installs_from_the_repository_on_hosted_services(monkeypatch, variable):
    calls = _run_cell(monkeypatch, {variable: "1"})
    assert calls == [("pip", f"install --quiet git+{hosted.REPOSITORY_URL}")]


def test_every_service_the_course_names_is_tested_by_the_cell():
    assert set(hosted.HOSTED_MARKERS.values()) == {hosted.HOSTED_MARKERS[v] for v in hosted.CELL_MARKERS}


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


def test_an_earlier_version_of_the_cell_is_recognised_and_replaced():
    old = {"cell_type": "code", "id": "x", "metadata": {}, "outputs": [], "execution_count": None,
           "source": "# Hosted notebooks (Google Colab, Kaggle) start without the course package:\n..."}
    assert hosted.is_install_cell(old)
    nb = hosted.with_install_cell({"cells": [old], "metadata": {}, "nbformat": 4, "nbformat_minor": 5})
    assert [c["source"] for c in nb["cells"]] == [hosted.install_cell_source()]
