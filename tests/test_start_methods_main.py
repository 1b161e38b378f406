"""What a forkserver's workers get of ``__main__`` (issue 38, E1): the case is read from the data
multiprocessing sends a new process and from multiprocessing's own source, the explanation that
``explain_start_method`` and ``doctor`` print follows it, and lesson 02's script case is measured
in a real ``python lesson02_train.py`` with a forkserver worker (on this Python, and with CPython's
fix for gh-126631 simulated, so both verdicts are reached). Everything that starts processes has a
timeout; no timing is asserted."""
from __future__ import annotations

import dataclasses
import inspect
import multiprocessing as mp
import sys
import types

import pytest

from course_authoring.notebook_modules import notebook_module
from course_utils import machine, start_methods
from course_utils.machine import advise, doctor
from course_utils.start_methods import (FORKSERVER_MAIN, explain_start_method, forkserver_main,
                                        server_runs_main)

HAS_FORKSERVER = "forkserver" in mp.get_all_start_methods()


def _main(monkeypatch, file: str | None = None, spec_name: str | None = None) -> None:
    module = types.ModuleType("__main__")
    module.__spec__ = types.SimpleNamespace(name=spec_name) if spec_name else None
    if file:
        module.__file__ = file
    monkeypatch.setitem(sys.modules, "__main__", module)


# ----------------------------------------------------------------------------- the case
@pytest.mark.parametrize("fixed, expected", [(True, "inherited"), (False, "rerun")])
def test_a_script_is_inherited_only_where_the_server_runs_it(monkeypatch, fixed, expected):
    _main(monkeypatch, file="/somewhere/train.py")
    monkeypatch.setattr(start_methods, "server_runs_main", lambda: fixed)
    assert forkserver_main() == expected


@pytest.mark.parametrize("spec_name, file, expected", [
    ("train", "/somewhere/train.py", "rerun"),         # python -m train: each worker runs it again
    ("pkg.__main__", "/somewhere/pkg/__main__.py", "none"),   # python -m pkg: multiprocessing skips it
    (None, None, "none"),                              # a notebook kernel, python -c, the REPL
])
def test_a_module_or_no_file_is_never_preloaded(monkeypatch, spec_name, file, expected):
    _main(monkeypatch, file=file, spec_name=spec_name)
    monkeypatch.setattr(start_methods, "server_runs_main", lambda: True)   # even with the fix
    assert forkserver_main() == expected


def test_server_runs_main_reads_the_source(monkeypatch):
    import multiprocessing.forkserver as fs
    source = inspect.getsource(fs.ForkServer.ensure_running)
    assert server_runs_main() is ("init_main_from_path" in source)
    if sys.version_info[:3] < (3, 13, 8):           # this venv: 3.11, before CPython's fix
        assert server_runs_main() is False
    monkeypatch.setattr(inspect, "getsource", lambda obj: "main_kws['main_path'] = data['init_main_from_path']")
    assert server_runs_main() is True


@pytest.mark.parametrize("version, expected", [
    ((3, 11, 7), False), ((3, 13, 7), False), ((3, 13, 8), True), ((3, 14, 0), True), ((3, 15, 1), True)])
def test_server_runs_main_falls_back_on_the_version(monkeypatch, version, expected):
    def no_source(obj):
        raise OSError("could not get source code")
    monkeypatch.setattr(inspect, "getsource", no_source)
    monkeypatch.setattr(sys, "version_info", version)
    assert server_runs_main() is expected


# ----------------------------------------------------------------------------- the texts
MARKERS = {"none": "has no file", "inherited": "inherited by every worker", "rerun": "top level again"}


@pytest.mark.parametrize("case", sorted(FORKSERVER_MAIN))
def test_explanation_says_which_case_this_process_is_in(monkeypatch, case):
    monkeypatch.setattr(start_methods, "forkserver_main", lambda: case)
    text = explain_start_method("forkserver")
    assert MARKERS[case] in text and "{main}" not in text
    assert all(marker not in text for other, marker in MARKERS.items() if other != case)
    assert ("are not inherited" in text) is (case == "none")
    assert ("CUDA fails" in text) is (case == "inherited")
    assert "preloads nothing" not in text


def test_the_notebook_case_is_the_old_sentence_made_conditional(monkeypatch):
    _main(monkeypatch)                                 # like a Jupyter kernel's __main__
    text = explain_start_method("forkserver")
    assert "a notebook kernel" in text and "each worker imports torch itself" in text


@pytest.fixture(scope="module")
def report():
    return doctor()


@pytest.mark.parametrize("case", sorted(FORKSERVER_MAIN))
def test_doctor_advice_follows_the_case(monkeypatch, report, case):
    monkeypatch.setattr(machine, "forkserver_main", lambda: case)
    text = "\n".join(advise(dataclasses.replace(report, start_method="forkserver")))
    assert FORKSERVER_MAIN[case] in text
    assert "unless torch is preloaded into the server" not in text
    if report.pools.opencv > 1:                        # the pools sentence is there to read
        assert ("from a server that ran this script's top level" in text) is (case == "inherited")


# ----------------------------------------------------------------------------- lesson 02's script case
@pytest.fixture(scope="module")
def l02():
    return types.SimpleNamespace(script=notebook_module("02_threads.ipynb", "lesson02_script"),
                                 verdicts=notebook_module("02_threads.ipynb", "lesson02_verdicts"))


def _seen(top, pid=20, parent=10, script=5):
    return {"top_level_pid": top, "pid": pid, "parent_pid": parent, "script_pid": script}


def test_top_level_ran_in_each_side(l02):
    ran_in = l02.verdicts.top_level_ran_in
    assert ran_in(_seen(20)) == "the worker itself"
    assert ran_in(_seen(10)) == "the fork server"
    assert ran_in(_seen(5, parent=5)) == "the script's process"     # a fork of the script
    assert ran_in(_seen(7)) == "no process we know"
    assert set(l02.verdicts.TOP_LEVEL_MEANS) == {"the worker itself", "the fork server",
                                                 "the script's process", "no process we know"}


@pytest.mark.skipif(not HAS_FORKSERVER, reason="forkserver only (Linux, macOS)")
@pytest.mark.timeout(300)
def test_script_case_in_a_real_forkserver_worker(l02, tmp_path):
    """This Python, measured: the verdict is the one multiprocessing's source predicts, and the
    worker's OpenCV runs the 1 thread the script's top level set (inherited or run again)."""
    seen = l02.script.worker_of_a_script(folder=tmp_path, timeout_s=240)
    expected = "the fork server" if server_runs_main() else "the worker itself"
    assert l02.verdicts.top_level_ran_in(seen) == expected
    assert seen["pid"] != seen["script_pid"] and seen["pools"]["opencv"] == 1


SIMULATED_FIX = '''import multiprocessing.spawn as _spawn
_prepare = _spawn.get_preparation_data


def _with_main_path(name):   # what CPython's fix for gh-126631 hands the fork server
    data = _prepare(name)
    if "init_main_from_path" in data:
        data["main_path"] = data["init_main_from_path"]
    return data


_spawn.get_preparation_data = _with_main_path
'''


@pytest.mark.skipif(not HAS_FORKSERVER, reason="forkserver only (Linux, macOS)")
@pytest.mark.skipif(server_runs_main(), reason="this Python has the fix: the test above measures it")
@pytest.mark.timeout(300)
def test_script_case_with_the_fix_simulated_is_inherited(l02, tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SIMULATED_FIX)
    monkeypatch.setenv("PYTHONPATH", str(site))
    seen = l02.script.worker_of_a_script(folder=tmp_path, timeout_s=240)
    assert l02.verdicts.top_level_ran_in(seen) == "the fork server"
    assert seen["top_level_pid"] == seen["parent_pid"] != seen["pid"]
    assert seen["pools"]["opencv"] == 1


def test_worker_of_a_script_says_why_it_failed(l02, tmp_path, monkeypatch):
    monkeypatch.setattr(l02.script, "SCRIPT", "raise SystemExit('no such luck')\n")
    with pytest.raises(RuntimeError, match="exited with 1: no such luck"):
        l02.script.worker_of_a_script(folder=tmp_path, timeout_s=60)
