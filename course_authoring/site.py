"""The course as a website: ``make site`` (``python -m course_authoring site``).

Sphinx with MyST-NB: the notebooks are executed on this machine when the site is built, in quick
mode unless ``--full``, through jupyter-cache, so a second build re-executes only the notebooks
whose code changed. Chosen over Jupyter Book 2 because it needs no Node server and renders fully
offline: the theme (alabaster) ships its own files, and the widget and MathJax scripts MyST-NB
would fetch from CDNs are turned off (progress bars print as text: ``TQDM_DISABLE=1``).

The build copies what the site shows into ``build/site-src`` with the repository's own layout
(``index.md`` is the README, then ``notebooks/``, ``exercises/``, ``instructors/``), so the
notebooks' relative links resolve; links to other repository files go to the repository on
GitHub. Solutions are never copied. Each lesson page opens with a banner: where it ran, how long
it took, and links to download it, open it in Colab, and its exercise.
"""
from __future__ import annotations

import datetime
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Sequence

from course_utils.config import QUICK_ENV
from course_utils.machine import machine_summary

from .hosted import REPOSITORY_URL

__all__ = ["SITE_SRC", "SITE_OUT", "stage", "build", "lesson_banner"]

ROOT = Path(__file__).resolve().parent.parent
SITE_SRC = ROOT / "build" / "site-src"
SITE_OUT = ROOT / "build" / "site"
SITE_CACHE = ROOT / "build" / "site-cache"
_LINK = re.compile(r"\]\((?!https?://|#|mailto:)([^)\s]+)\)")

CONF = '''"""Sphinx configuration written by course_authoring/site.py (do not edit: it is rewritten)."""
import sys
sys.path.insert(0, {authoring!r})
project = "Feed the GPU"
extensions = ["myst_nb", "course_authoring.site"]
nb_execution_mode = "cache"
nb_execution_cache_path = {cache!r}
nb_execution_timeout = 900
nb_execution_raise_on_error = True
nb_execution_excludepatterns = ["exercises/*"]
nb_ipywidgets_js = {{}}                 # no widget scripts from a CDN
nb_merge_streams = True
mathjax_path = "no-mathjax.js"        # a local empty file: no MathJax from a CDN (no formulas here)
html_static_path = ["_static"]
html_theme = "alabaster"
html_theme_options = {{"nosidebar": False, "page_width": "1240px"}}
html_css_files = ["course.css"]
html_title = "Feed the GPU"
html_show_sourcelink = False
exclude_patterns = ["_build", "**/lesson*_*.py"]
suppress_warnings = ["mystnb.unknown_mime_type"]
'''


def _rewrite_links(text: str, page: Path, staged: set[str]) -> str:
    """Links to files the site does not hold point at the repository on GitHub."""
    def fix(match: re.Match) -> str:
        target = match.group(1)
        path, _, anchor = target.partition("#")
        resolved = os.path.normpath((page.parent / path).as_posix())
        if resolved in staged or not path:
            return match.group(0)
        return f"]({REPOSITORY_URL}/blob/main/{resolved}{'#' + anchor if anchor else ''})"
    return _LINK.sub(fix, text)


def _notebook(path: Path, rel: Path, staged: set[str]) -> dict:
    nb = json.loads(path.read_text(encoding="utf-8"))
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            text = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            cell["source"] = _rewrite_links(text, rel, staged)
    return nb


def stage(root: Path = ROOT, out: Path = SITE_SRC, lessons: Sequence[str] | None = None,
          cache: Path = SITE_CACHE) -> list[str]:
    """Copy the pages into ``out`` (lessons: notebook names or numbers, default all) and write its
    Sphinx configuration, executing through the jupyter-cache in ``cache``; return the pages."""
    root, out = Path(root), Path(out)
    picked = sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    if lessons:
        picked = [p for p in picked if p.name in lessons or p.name[:2] in lessons]
        if not picked:
            raise ValueError(f"--lessons {list(lessons)}: no such lesson; use names or numbers "
                             f"such as 00 03.")
    numbers = {p.name[:2] for p in picked}
    exercises = sorted(p for p in (root / "exercises").glob("[0-9][0-9]_*.ipynb") if p.name[:2] in numbers)
    pages = [f"notebooks/{p.name}" for p in picked] + [f"exercises/{p.name}" for p in exercises]
    pages += ["instructors/README.md", "ARCHITECTURE.md"]
    staged = set(pages) | {"README.md"}
    if out.exists():
        for child in out.iterdir():
            if child.name not in ("notebooks",):       # kept: the lessons' written files
                shutil.rmtree(child) if child.is_dir() else child.unlink()
    for rel in pages:
        target = out / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if rel.endswith(".ipynb"):
            nb = _notebook(root / rel, Path(rel), staged)
            target.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        else:
            target.write_text(_rewrite_links((root / rel).read_text(encoding="utf-8"), Path(rel), staged),
                              encoding="utf-8")
    for stale in (out / "notebooks").glob("*.ipynb"):
        if f"notebooks/{stale.name}" not in pages:
            stale.unlink()
    readme = _rewrite_links((root / "README.md").read_text(encoding="utf-8"), Path("README.md"), staged)
    toc = "\n".join(p.removesuffix(".ipynb").removesuffix(".md") for p in pages)
    (out / "index.md").write_text(readme + f"\n\n```{{toctree}}\n:hidden:\n:maxdepth: 1\n\n{toc}\n```\n",
                                  encoding="utf-8")
    (out / "conf.py").write_text(CONF.format(authoring=str(root), cache=str(cache)), encoding="utf-8")
    (out / "_static").mkdir(exist_ok=True)
    (out / "_static" / "no-mathjax.js").write_text("/* the course has no formulas: no MathJax */\n")
    # printed tables and verdicts wrap instead of running off the page (and off a phone)
    (out / "_static" / "course.css").write_text(
        "div.output pre, div.cell_output pre { white-space: pre-wrap; word-break: break-word; }\n"
        "div.cell_output img { max-width: 100%; height: auto; }\n")
    return pages


def build(out: Path = SITE_OUT, *, full: bool = False, lessons: Sequence[str] | None = None,
          src: Path = SITE_SRC, cache: Path = SITE_CACHE) -> int:
    """Stage and build the site into ``out``; the exit status of sphinx-build."""
    stage(out=src, lessons=lessons, cache=cache)
    env = dict(os.environ, TQDM_DISABLE="1", KINETO_LOG_LEVEL="6")
    env.pop("MPLBACKEND", None)                 # the kernel's inline backend draws the plots
    env.pop(QUICK_ENV, None) if full else env.update({QUICK_ENV: "1"})
    cmd = [sys.executable, "-m", "sphinx", "-b", "html", "-q", str(src), str(out)]
    status = subprocess.run(cmd, env=env, cwd=str(ROOT)).returncode
    # MyST-NB leaves each executed notebook, outputs and all, beside the site (its pages and images
    # are already in `out`, and the cache holds the outputs): notebooks are kept without outputs
    for executed in (Path(out).resolve().parent / "jupyter_execute").rglob("*.ipynb"):
        executed.unlink()
    return status


def lesson_banner(pagename: str, exec_data: dict | None, machine: str, mode: str) -> str:
    """The HTML that opens a lesson page: where and how long it ran, and its links."""
    name = pagename.split("/", 1)[1]
    exercise = next((p.stem for p in (ROOT / "exercises").glob(f"{name[:2]}_*.ipynb")), None)
    when = "" if not exec_data else f"{datetime.datetime.fromtimestamp(exec_data['mtime']):%Y-%m-%d %H:%M}"
    ran = ("not executed here" if not exec_data else
           f"executed {when} in {exec_data['runtime']:.0f} s ({mode}; the build keeps the outputs "
           f"until the notebook's code changes)")
    repository = REPOSITORY_URL.split("github.com/", 1)[1]
    colab = f"https://colab.research.google.com/github/{repository}/blob/main/{pagename}.ipynb"
    links = [f'<a href="{name}.ipynb" download>download the notebook</a>',
             f'<a href="{colab}">open in Colab</a>']
    if exercise:
        links.append(f'<a href="../exercises/{exercise}.html">its exercise</a>')
    return (f'<div class="admonition note course-run"><p>Every figure below was measured when this '
            f'page was built: {ran}, on <code>{machine}</code>. GPU reference results, where a GPU '
            f'run has written them, are shown beside them.</p><p>{" · ".join(links)}</p></div>')


def _page_context(app: Any, pagename: str, templatename: str, context: dict, doctree: Any) -> None:
    if not pagename.startswith("notebooks/") or "body" not in context:
        return
    # myst_nb only inside Sphinx: the bare GPU machine that runs gpu-check has no Jupyter stack
    from myst_nb.sphinx_ import NbMetadataCollector
    exec_data = NbMetadataCollector.get_exec_data(app.env, pagename)
    mode = "quick mode" if os.environ.get(QUICK_ENV) else "full mode"
    context["body"] = lesson_banner(pagename, exec_data, machine_summary(), mode) + context["body"]
    src = Path(app.srcdir) / f"{pagename}.ipynb"
    target = Path(app.outdir) / f"{pagename}.ipynb"
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, target)                            # the download link's file


def setup(app: Any) -> dict:
    """Sphinx extension entry point (listed in the generated conf.py)."""
    app.connect("html-page-context", _page_context)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
