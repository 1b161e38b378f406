"""course_authoring.notebook_modules: a notebook's %%writefile cells, imported without Jupyter."""
import json

import pytest

from course_authoring.notebook_modules import notebook_module, writefile_cells


def _notebook(tmp_path, cells):
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps({"cells": [{"cell_type": t, "source": s, "metadata": {}}
                                          for t, s in cells]}))
    return path


def test_writes_every_writefile_cell_and_imports_the_one_asked_for(tmp_path):
    nb = _notebook(tmp_path, [
        ("code", "%%writefile lessonx_base.py\nSIDE = 3\n"),
        ("markdown", "%%writefile not_code.py\nnothing\n"),
        ("code", "%%writefile lessonx_user.py\nfrom lessonx_base import SIDE\nAREA = SIDE * SIDE\n"),
        ("code", "print('a plain cell')"),
        ("code", "%%writefile -a lessonx_user.py\nPERIMETER = 4 * SIDE\n"),
    ])
    assert sorted(writefile_cells(nb)) == ["lessonx_base.py", "lessonx_user.py"]
    user = notebook_module(nb, "lessonx_user")
    assert (user.AREA, user.PERIMETER) == (9, 12)      # -a appends, as IPython does


def test_a_module_the_notebook_does_not_write_is_named_in_the_error(tmp_path):
    nb = _notebook(tmp_path, [("code", "%%writefile lessonx_base.py\nSIDE = 3\n")])
    with pytest.raises(LookupError, match=r"lessonx_base\.py"):
        notebook_module(nb, "lessonx_missing")
    with pytest.raises(FileNotFoundError, match="notebook="):
        writefile_cells(tmp_path / "absent.ipynb")


def test_the_lesson_notebooks_write_their_worker_modules():
    assert "lesson05_decode.py" in writefile_cells("05_gpu_augmentation.ipynb")
