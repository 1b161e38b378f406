"""Hosted notebook services (Google Colab, Kaggle): the first code cell that installs the course.

A notebook opened on Colab starts in a machine that has torch but not ``course_utils``. Every
lesson, solution and exercise notebook therefore starts with one three-line code cell, written by
:func:`sync_install_cells` from :func:`install_cell_source`, that runs ``%pip install`` from
:data:`REPOSITORY_URL` when it runs on a hosted service and does nothing anywhere else. (pip's
own message says why an install failed; on Kaggle it is usually "Internet" switched off in the
notebook's settings.)

:data:`REPOSITORY_URL` is the one place the repository address is set. After changing it, run
``python -m course_authoring hosted-cell`` to rewrite the cell in every notebook (and
``python -m course_authoring make-exercises``); a test fails while any notebook carries an old copy.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Iterable, Mapping

from .exercises import cell_source, render_notebook

#: Where the course lives; hosted notebooks ``pip install git+REPOSITORY_URL``.
REPOSITORY_URL = "https://github.com/feed-the-gpu/feed-the-gpu"

#: The id of the install cell in every notebook (Jupyter cell ids are stable strings).
CELL_ID = "hosted-install"

#: Environment variables that only hosted services set, and the service each one names.
HOSTED_MARKERS = {"COLAB_RELEASE_TAG": "Google Colab", "COLAB_GPU": "Google Colab",
                  "KAGGLE_KERNEL_RUN_TYPE": "Kaggle"}

#: The variables the cell itself tests (one per service keeps the cell short).
CELL_MARKERS = ("COLAB_RELEASE_TAG", "KAGGLE_KERNEL_RUN_TYPE")

_FIRST_LINE = "import os  # on Colab or Kaggle this cell installs the course; elsewhere it does nothing"
#: First lines of earlier versions of the cell, so that ``hosted-cell`` replaces them too.
_OLD_FIRST_LINES = ("# Hosted notebooks (Google Colab, Kaggle) start without the course package:",)


def hosted_service(environ: Mapping[str, str] | None = None) -> str | None:
    """Name the hosted notebook service this process runs on (``"Google Colab"``, ...), or None."""
    env = os.environ if environ is None else environ
    for variable, service in HOSTED_MARKERS.items():
        if variable in env:
            return service
    if environ is None and "google.colab" in sys.modules:
        return "Google Colab"
    return None


def install_cell_source(repository_url: str = REPOSITORY_URL) -> str:
    """The source of the install cell (three lines, an IPython ``%pip`` magic on the third).

    Self-contained, since ``course_utils`` is not there yet; the address is written by
    ``hosted-cell`` from :data:`REPOSITORY_URL`, its one home.
    """
    if not isinstance(repository_url, str) or not repository_url.startswith(("https://", "git@")):
        raise ValueError(f"repository_url={repository_url!r} should be the https:// (or git@) "
                         f"address of the course repository.")
    markers = ", ".join(f'"{v}"' for v in CELL_MARKERS)
    return (f"{_FIRST_LINE}\n"
            f"if {{{markers}}} & set(os.environ):\n"
            f"    %pip install --quiet git+{repository_url}")


def install_cell(repository_url: str = REPOSITORY_URL) -> dict:
    """The install cell as a notebook cell dict (no outputs)."""
    return {"cell_type": "code", "execution_count": None, "id": CELL_ID, "metadata": {},
            "outputs": [], "source": install_cell_source(repository_url)}


def is_install_cell(cell: Mapping) -> bool:
    """True for a cell this module wrote (any version of it, any URL)."""
    return cell.get("cell_type") == "code" and (
        cell.get("id") == CELL_ID or cell_source(cell).startswith((_FIRST_LINE, *_OLD_FIRST_LINES)))


def with_install_cell(nb: dict, repository_url: str = REPOSITORY_URL) -> dict:
    """Return a copy of ``nb`` whose first code cell is the current install cell.

    An existing install cell is replaced where it stands; otherwise the cell goes right before
    the first code cell (after the title), so the lesson's own first cell stays its setup cell.
    """
    out = json.loads(json.dumps(nb))
    cells = [c for c in out.get("cells", []) if not is_install_cell(c)]
    first_code = next((i for i, c in enumerate(cells) if c.get("cell_type") == "code"), len(cells))
    cells.insert(first_code, install_cell(repository_url))
    out["cells"] = cells
    return out


def notebook_paths(folders: Iterable[str | Path]) -> list[Path]:
    """Every ``*.ipynb`` in ``folders`` (sorted); a folder that does not exist is an error."""
    paths: list[Path] = []
    for folder in folders:
        folder = Path(folder)
        if not folder.is_dir():
            raise FileNotFoundError(f"folder {str(folder)!r} does not exist; run from the course "
                                    f"root or name the folders that hold the notebooks.")
        paths.extend(sorted(folder.glob("*.ipynb")))
    return paths


def sync_install_cells(folders: Iterable[str | Path] = ("notebooks", "solutions", "exercises"),
                       *, check: bool = False,
                       repository_url: str = REPOSITORY_URL) -> list[Path]:
    """Make the install cell of every notebook in ``folders`` current; return the paths changed.

    With ``check=True`` nothing is written and the paths that would change are returned.
    """
    changed = []
    for path in notebook_paths(folders):
        text = path.read_text(encoding="utf-8")
        new = render_notebook(with_install_cell(json.loads(text), repository_url))
        if new != text:
            changed.append(path)
            if not check:
                path.write_text(new, encoding="utf-8")
    return changed
