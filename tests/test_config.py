"""Quick mode is read from one environment variable, in one place."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from course_utils import config

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("value, expected", [("1", True), ("yes", True), ("TRUE", True), ("on", True),
                                             ("0", False), ("", False), ("no", False), ("off", False)])
def test_quick_mode_values(monkeypatch, value, expected):
    monkeypatch.setenv(config.QUICK_ENV, value)
    assert config.quick_mode() is expected
    assert config.pick(full="full", quick="quick") == ("quick" if expected else "full")
    assert bool(config.mode_banner()) is expected


def test_quick_mode_unset_means_full(monkeypatch):
    monkeypatch.delenv(config.QUICK_ENV, raising=False)
    assert config.quick_mode() is False


def test_bad_value_names_the_variable(monkeypatch):
    monkeypatch.setenv(config.QUICK_ENV, "maybe")
    with pytest.raises(ValueError, match=r"COURSE_QUICK='maybe'.*set it to 1"):
        config.quick_mode()


def test_only_config_reads_the_variable():
    readers = [p.relative_to(ROOT) for p in (ROOT / "course_utils").rglob("*.py")
               if "COURSE_QUICK" in p.read_text() and p.name != "config.py"]
    assert readers == [], f"read quick mode through course_utils.config, not in {readers}"


def test_import_has_no_side_effects():
    code = ("import io, contextlib, torch, cv2\n"
            "before = (torch.get_num_threads(), cv2.getNumThreads())\n"
            "buf = io.StringIO()\n"
            "with contextlib.redirect_stdout(buf):\n"
            "    import course_utils\n"
            "after = (torch.get_num_threads(), cv2.getNumThreads())\n"
            "assert before == after, (before, after)\n"
            "assert buf.getvalue() == '', buf.getvalue()\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=120)


def test_every_exported_name_exists():
    import course_utils
    missing = [name for name in course_utils.__all__ if not hasattr(course_utils, name)]
    assert not missing, f"course_utils.__all__ names that do not exist: {missing}"
