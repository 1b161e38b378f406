"""course_utils.checks: one family of argument checks, each naming the argument and the fix."""
from __future__ import annotations

import numpy as np
import pytest

from course_utils.checks import WrongType, check_folder, check_fraction, check_int, check_seconds


def test_check_int_returns_ints_and_names_the_argument():
    assert check_int("n", 3, 1) == 3 and check_int("n", np.int64(2), 1) == 2
    assert check_int("n", None, 1, allow_none=True) is None
    with pytest.raises(ValueError, match=r"sweep: n=0 is too small: n must be >= 1\. try 1"):
        check_int("n", 0, 1, "sweep", " try 1")
    for bad in (True, 2.0, "3", None):
        with pytest.raises(WrongType, match="n must be an int >= 1"):
            check_int("n", bad, 1)


def test_wrong_type_is_both_a_type_error_and_a_value_error():
    with pytest.raises(TypeError):
        check_int("n", "x", 0)
    with pytest.raises(ValueError):
        check_int("n", "x", 0)


def test_check_seconds_and_fraction():
    assert check_seconds("t", 0, "f") == 0.0 and check_seconds("t", 2, positive=True) == 2.0
    with pytest.raises(ValueError, match="t must be a number of seconds > 0"):
        check_seconds("t", 0, positive=True)
    with pytest.raises(ValueError, match="finite"):
        check_seconds("t", float("inf"))
    with pytest.raises(WrongType, match="seconds"):
        check_seconds("t", "1")
    assert check_fraction("f", 0.9) == 0.9
    for bad in (0, 1.5):
        with pytest.raises(ValueError, match=r"f=.* must be in \(0, 1\]"):
            check_fraction("f", bad)


def test_check_folder_names_the_argument_and_says_what_to_pass(tmp_path):
    assert check_folder(tmp_path, "root", "pass a folder.") == tmp_path
    with pytest.raises(FileNotFoundError, match=r"^root='.*nowhere': no such folder; pass a folder\.$"):
        check_folder(tmp_path / "nowhere", "root", "pass a folder.")
    (tmp_path / "a.jpg").write_bytes(b"")
    with pytest.raises(NotADirectoryError, match=r"is a file, not a folder; pass a folder\.$"):
        check_folder(tmp_path / "a.jpg", "root", "pass a folder.")
