"""The course website on a small build (lesson 00 and its exercise): what it stages, what a lesson
page shows, that a second build comes from the cache, and that every page passes the check in
headless Chromium — which must also catch a broken page."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from course_authoring.hosted import REPOSITORY_URL
from course_authoring.site import SITE_CACHE, build, stage
from course_utils.machine import machine_summary

pytest.importorskip("myst_nb", reason="the site extra (Sphinx, MyST-NB) is not installed; make installs it")
pytestmark = pytest.mark.timeout(600)
ROOT = Path(__file__).resolve().parents[1]
CHECK = [sys.executable, str(ROOT / "tools" / "site_check.py")]


def chromium_or_skip() -> None:
    if subprocess.run([sys.executable, str(ROOT / "tools" / "browser_check.py"), "--find-chromium"],
                      capture_output=True).returncode:
        pytest.skip("Chromium is not installed: make site-check installs it (root with apt-get), "
                    "or apt-get install -y chromium")


def cached_runs() -> set[tuple[int, str]]:
    """(id, time) of every execution jupyter-cache holds for the site."""
    from jupyter_cache import get_cache
    return {(r.pk, str(r.created)) for r in get_cache(str(SITE_CACHE)).list_cache_records()}


@pytest.fixture(scope="module")
def small_site(tmp_path_factory):
    out, src = tmp_path_factory.mktemp("site"), tmp_path_factory.mktemp("site-src")
    assert build(out, lessons=["00"], src=src) == 0
    before = cached_runs()
    assert build(out, lessons=["00"], src=src) == 0
    assert cached_runs() == before, "the second build executed a notebook again"
    return out


def test_stage_copies_the_pages_links_the_rest_to_the_repository_and_never_the_solutions(tmp_path):
    pages = stage(out=tmp_path, lessons=["00", "06"])
    assert pages == ["notebooks/00_measure_first.ipynb", "notebooks/06_tune_your_pipeline.ipynb",
                     "exercises/00_measure_first.ipynb", "exercises/06_tune_pipeline.ipynb",
                     "instructors/README.md", "ARCHITECTURE.md"]
    assert not (tmp_path / "solutions").exists() and not list(tmp_path.rglob("*solution*"))
    index = (tmp_path / "index.md").read_text(encoding="utf-8")
    assert index.startswith((ROOT / "README.md").read_text(encoding="utf-8").splitlines()[0])
    assert "notebooks/00_measure_first" in index.split("{toctree}")[1]
    assert "](ARCHITECTURE.md)" in index                      # a staged page keeps its link
    assert f"]({REPOSITORY_URL}/blob/main/notebooks/03_num_workers.ipynb)" in index   # not staged
    with pytest.raises(ValueError, match="no such lesson"):
        stage(out=tmp_path, lessons=["99"])


def test_a_lesson_page_shows_its_outputs_where_and_when_it_ran_and_its_links(small_site):
    html = (small_site / "notebooks" / "00_measure_first.html").read_text(encoding="utf-8")
    assert 'class="admonition note course-run"' in html and machine_summary() in html
    assert re.search(r"executed \d{4}-\d\d-\d\d \d\d:\d\d in \d+ s \(quick mode; the build keeps", html)
    assert "open in Colab" in html and 'href="../exercises/00_measure_first.html"' in html
    assert "<img" in html and "QUICK MODE" in html           # plots and printed outputs
    assert (small_site / "notebooks" / "00_measure_first.ipynb").is_file()     # the download
    assert (small_site / "exercises" / "00_measure_first.html").is_file()
    assert not list(small_site.rglob("*solution*"))
    remote = [m for page in small_site.rglob("*.html") for m in re.findall(
        r'(?:src|href)="(https?://[^"]+\.(?:js|css)[^"]*)"', page.read_text(encoding="utf-8"))]
    assert remote == [], "the site must not load scripts or styles from the network"


def test_every_page_passes_the_check_in_headless_chromium(small_site):
    chromium_or_skip()
    proc = subprocess.run(CHECK + [str(small_site)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "every page loaded with no console error" in proc.stdout
    assert (ROOT / "build" / "site-check" / "00_measure_first.png").stat().st_size > 10_000


def test_the_check_finds_a_broken_page(small_site, tmp_path):
    chromium_or_skip()
    broken = tmp_path / "broken"
    shutil.copytree(small_site, broken)
    page = broken / "instructors" / "README.html"
    page.write_text(page.read_text(encoding="utf-8").replace("</body>", (
        '<img src="missing.png"><a href="nowhere.html">x</a>'
        '<script src="https://cdn.example.invalid/x.js"></script>'
        '<script>console.error("boom")</script></body>')), encoding="utf-8")
    proc = subprocess.run(CHECK + [str(broken)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout
    out = proc.stdout
    assert "instructors/README.html" in out and "1 page(s) with problems" in out
    assert "image did not load" in out and "broken link: instructors/nowhere.html" in out
    assert "cdn.example.invalid" in out and "console.error: boom" in out


def test_the_check_and_the_build_refuse_what_they_cannot_use(tmp_path):
    proc = subprocess.run(CHECK + [str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "holds no index.html; build the site first: make site" in proc.stderr
