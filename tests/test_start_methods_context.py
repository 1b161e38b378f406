"""course_utils.start_methods: how the start method is read (set, the default context, the
platform's default), the explanation's opening for each case (this process's own default, one set
for it, another method asked about), a DataLoader's context from what a caller passes, and the
worker timeout that only fork gets. Fake multiprocessing state, no process started."""
from __future__ import annotations

import multiprocessing
import platform
from types import SimpleNamespace

import pytest

from course_utils import start_methods
from course_utils.start_methods import (FORKSERVER_MAIN, explain_start_method,
                                        platform_default_start_method, resolve_context, start_method,
                                        worker_timeout)


# ---- reading the start method ------------------------------------------------------------------

def _get_start_method(value):
    def get(allow_none=False):
        assert allow_none is True, "reading must not fix the start method"
        return value
    return get


def test_a_start_method_set_here_wins(monkeypatch):
    monkeypatch.setattr(multiprocessing, "get_start_method", _get_start_method("spawn"))
    monkeypatch.setattr(multiprocessing.context, "_default_context",
                        SimpleNamespace(_default_context=SimpleNamespace(_name="forkserver")))
    assert start_method() == "spawn"


def test_unset_reads_the_default_context_then_the_platform(monkeypatch):
    monkeypatch.setattr(multiprocessing, "get_start_method", _get_start_method(None))
    monkeypatch.setattr(multiprocessing.context, "_default_context",
                        SimpleNamespace(_default_context=SimpleNamespace(_name="forkserver")))
    assert start_method() == "forkserver"
    monkeypatch.setattr(multiprocessing.context, "_default_context",
                        SimpleNamespace(_default_context=None))
    monkeypatch.setattr(start_methods, "platform_default_start_method", lambda: "spawn")
    assert start_method() == "spawn"


@pytest.mark.parametrize("plat, version, expected", [("darwin", (3, 10), "spawn"),
                                                     ("win32", (3, 12), "spawn"),
                                                     ("linux", (3, 13), "fork"),
                                                     ("linux", (3, 14), "forkserver")])
def test_the_platform_default_reads_this_python_when_not_told(monkeypatch, plat, version, expected):
    monkeypatch.setattr(start_methods, "sys", SimpleNamespace(platform=plat,
                                                              version_info=(*version, 0, "final", 0)))
    assert platform_default_start_method() == expected


def test_the_platform_default_uses_what_it_is_told_over_this_python(monkeypatch):
    monkeypatch.setattr(start_methods, "sys", SimpleNamespace(platform="darwin",
                                                              version_info=(3, 11, 0, "final", 0)))
    assert platform_default_start_method("linux", (3, 14)) == "forkserver"
    assert platform_default_start_method("linux") == "fork"          # this Python: 3.11
    assert platform_default_start_method(version=(3, 15)) == "spawn"  # this platform: darwin


# ---- the explanation's opening -----------------------------------------------------------------

@pytest.fixture
def linux_311(monkeypatch):
    """This process: Python 3.11 on Linux, workers 'fork' (the platform's default), a notebook."""
    monkeypatch.setattr(start_methods, "sys", SimpleNamespace(platform="linux",
                                                              version_info=(3, 11, 9, "final", 0)))
    monkeypatch.setattr(platform, "system", lambda: "Linux")
    monkeypatch.setattr(start_methods, "start_method", lambda: "fork")
    monkeypatch.setattr(start_methods, "forkserver_main", lambda: "none")
    return monkeypatch


def test_the_default_method_is_called_the_default(linux_311):
    text = explain_start_method()
    assert text.startswith("DataLoader workers here start with 'fork', the default of Python 3.11 on "
                           "Linux (Linux: fork up to Python 3.13, forkserver from 3.14; macOS and "
                           "Windows: spawn). Each worker is a copy of this process")
    assert explain_start_method("fork") == text


def test_a_method_set_for_this_process_names_the_default_it_replaced(linux_311):
    linux_311.setattr(start_methods, "start_method", lambda: "spawn")
    text = explain_start_method()
    assert text.startswith("DataLoader workers here start with 'spawn', set for this process (the "
                           "default of Python 3.11 on Linux would be 'fork'). Each worker is a fresh")


def test_without_a_system_name_the_platform_is_named(linux_311):
    linux_311.setattr(platform, "system", lambda: "")
    assert "the default of Python 3.11 on linux (" in explain_start_method()


def test_another_method_is_described_in_lower_case_after_its_heading(linux_311):
    text = explain_start_method("spawn")
    assert text.startswith("With 'spawn' (not this process's default, which is 'fork'): each worker "
                           "is a fresh Python interpreter")


@pytest.mark.parametrize("case", sorted(FORKSERVER_MAIN))
def test_the_forkserver_text_carries_this_process_main_case(linux_311, case):
    linux_311.setattr(start_methods, "forkserver_main", lambda: case)
    text = explain_start_method("forkserver")
    assert f"what it ran of __main__: {FORKSERVER_MAIN[case]}. A Dataset" in text
    assert "{main}" not in text


# ---- a DataLoader's context and timeout --------------------------------------------------------

def test_no_context_means_this_process_default(monkeypatch):
    monkeypatch.setattr(start_methods, "start_method", lambda: "forkserver")
    assert resolve_context(None) == (None, "forkserver")


def test_a_context_object_is_kept_with_its_method():
    context = multiprocessing.get_context("spawn")
    assert resolve_context(context) == (context, "spawn")


def test_a_method_name_gives_its_context():
    context, method = resolve_context("spawn")
    assert method == "spawn" and context is multiprocessing.get_context("spawn")


@pytest.mark.parametrize("bad", ["threads", 3])
def test_an_unknown_method_is_refused_naming_the_caller(bad):
    with pytest.raises(ValueError, match=rf"^sweep: multiprocessing_context={bad!r} is not a start "
                                         r"method on this platform"):
        resolve_context(bad, "sweep")
    with pytest.raises(ValueError, match=rf"^multiprocessing_context={bad!r} is not"):
        resolve_context(bad)


def test_only_fork_workers_get_a_timeout(monkeypatch):
    assert worker_timeout(7, "fork") == 7.0 and isinstance(worker_timeout(7, "fork"), float)
    assert worker_timeout(7, "spawn") == 0.0
    assert worker_timeout(7, multiprocessing.get_context("forkserver")) == 0.0
    monkeypatch.setattr(start_methods, "start_method", lambda: "fork")
    assert worker_timeout(2.5) == 2.5
    monkeypatch.setattr(start_methods, "start_method", lambda: "spawn")
    assert worker_timeout(2.5) == 0.0


def test_server_runs_main_reads_the_fork_servers_own_source(monkeypatch):
    import inspect
    import multiprocessing.forkserver as fs

    def source(obj):
        assert obj is fs.ForkServer.ensure_running
        return "main_kws['main_path'] = data['init_main_from_path']"

    monkeypatch.setattr(inspect, "getsource", source)
    assert start_methods.server_runs_main() is True
