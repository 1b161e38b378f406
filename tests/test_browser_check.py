"""tools/browser_check.py: the parts that need no browser, no JupyterLab and no network."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from _helpers import load_tool

ROOT = Path(__file__).resolve().parents[1]


bc = load_tool("browser_check")


def test_defaults_run_lesson_00_in_quick_mode():
    args = bc.parse_args([])
    assert Path(args.notebook) == ROOT / "notebooks" / "00_measure_first.ipynb"
    assert Path(args.notebook).is_file()
    assert args.timeout == 600 and not args.full and args.chromium is None
    shot = bc.screenshot_path(Path(args.notebook), args.screenshot)
    assert shot == ROOT / "build" / "browser-check" / "00_measure_first.png"


def test_arguments():
    args = bc.parse_args(["notebooks/03_num_workers.ipynb", "--timeout", "90", "--full",
                          "--screenshot", "x.png", "--chromium", "/opt/chrome"])
    assert args.notebook == "notebooks/03_num_workers.ipynb"
    assert (args.timeout, args.full, args.chromium) == (90, True, "/opt/chrome")
    assert bc.screenshot_path(Path(args.notebook), args.screenshot) == Path("x.png")


@pytest.mark.parametrize("bad", [["--timeout", "0"], ["--width", "10"],
                                 ["--height", "2000", "--max-height", "1000"]])
def test_bad_arguments_are_refused(bad, capsys):
    with pytest.raises(SystemExit) as exc:
        bc.parse_args(bad)
    assert exc.value.code == 2


def test_help_says_what_it_needs(capsys):
    with pytest.raises(SystemExit) as exc:
        bc.parse_args(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "Chromium" in out and "--timeout" in out and "screenshot" in out


def _model(*cells):
    return {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": list(cells)}


def _code(source, count=None, outputs=()):
    return {"cell_type": "code", "source": source, "execution_count": count,
            "metadata": {}, "outputs": list(outputs)}


MARKDOWN = {"cell_type": "markdown", "source": "# title", "metadata": {}}
ERROR = {"output_type": "error", "ename": "ZeroDivisionError", "evalue": "division by zero",
         "traceback": ["..."]}


def test_find_errors_names_the_cell_and_the_error():
    nb = _model(MARKDOWN,
                _code("import os", 1, [{"output_type": "stream", "name": "stderr", "text": "warning"}]),
                MARKDOWN,
                _code(["\n", "# divide\n", "x = 1 / 0\n"], 2, [ERROR]),
                _code("print(x)"))
    (err,) = bc.find_errors(nb)
    assert (err.index, err.code_cell, err.execution_count) == (3, 2, 2)
    assert (err.ename, err.evalue, err.source_head) == ("ZeroDivisionError", "division by zero", "# divide")
    text = err.describe()
    assert "code cell 2" in text and "cell 4 of the notebook" in text
    assert "ZeroDivisionError: division by zero" in text and "# divide" in text
    assert bc.run_summary(nb) == (2, 3)


def test_no_errors_in_a_clean_or_empty_model():
    assert bc.find_errors(_model(MARKDOWN, _code("1", 1, [{"output_type": "execute_result",
                                                          "data": {}, "metadata": {},
                                                          "execution_count": 1}]))) == []
    assert bc.find_errors({}) == []
    assert bc.run_summary({}) == (0, 0)


def test_free_port_is_free_on_loopback():
    port = bc.free_port()
    assert 1024 <= port <= 65535
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_chromium_command_line(tmp_path):
    cmd = bc.chromium_command("/usr/bin/chromium", tmp_path / "profile", 1400, 1200)
    assert cmd[0] == "/usr/bin/chromium"
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-dev-shm-usage", "--no-first-run"):
        assert flag in cmd
    assert f"--user-data-dir={tmp_path / 'profile'}" in cmd
    assert "--remote-debugging-port=0" in cmd  # Chromium picks the port, writes DevToolsActivePort
    assert "--window-size=1400,1200" in cmd


def test_jupyter_command_is_loopback_only_with_a_token(tmp_path):
    cmd = bc.jupyter_command("python", 8123, "tok", ROOT, tmp_path, as_root=False)
    assert "--ip=127.0.0.1" in cmd and "--port=8123" in cmd and "--no-browser" in cmd
    assert "--IdentityProvider.token=tok" in cmd
    assert "--LabApp.expose_app_in_browser=True" in cmd
    assert "--allow-root" not in cmd
    assert "--allow-root" in bc.jupyter_command("python", 1, "t", ROOT, tmp_path, as_root=True)
    # settings, workspaces and checkpoints stay in the temporary directory
    assert f"--FileCheckpoints.checkpoint_dir={tmp_path / 'checkpoints'}" in cmd
    assert f"--LabApp.user_settings_dir={tmp_path / 'lab-settings'}" in cmd
    assert f"--LabApp.workspaces_dir={tmp_path / 'lab-workspaces'}" in cmd
    url = bc.lab_url(8123, "tok", "notebooks/00_measure_first.ipynb")
    assert url.startswith("http://127.0.0.1:8123/lab/tree/notebooks/00_measure_first.ipynb?")
    assert "token=tok" in url


def test_the_notebook_is_never_saved():
    settings = bc.LAB_SETTINGS["@jupyterlab/docmanager-extension/plugin.jupyterlab-settings"]
    assert settings == {"autosave": False}


def test_missing_chromium_says_how_to_install_it(tmp_path):
    with pytest.raises(bc.ChromiumNotFound, match="apt-get install -y chromium"):
        bc.find_chromium(env={}, path=str(tmp_path))
    with pytest.raises(bc.ChromiumNotFound, match="/nowhere/chrome"):
        bc.find_chromium("/nowhere/chrome", env={}, path=str(tmp_path))


def test_chromium_found_on_path_or_from_the_environment(tmp_path):
    fake = tmp_path / "chromium-browser"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    assert bc.find_chromium(env={}, path=str(tmp_path)) == str(fake)
    assert bc.find_chromium(env={"CHROMIUM": str(fake)}, path="") == str(fake)


def test_main_fails_clearly_without_chromium(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CHROMIUM", raising=False)
    assert bc.main(["--find-chromium"]) == 1
    assert "apt-get install -y chromium" in capsys.readouterr().err
    assert bc.main([]) == 1  # starts nothing
    err = capsys.readouterr().err
    assert "FAILED" in err and "apt-get install -y chromium" in err


def test_main_fails_clearly_on_a_missing_notebook(tmp_path, capsys):
    assert bc.main([str(tmp_path / "nope.ipynb")]) == 1
    assert "No such notebook" in capsys.readouterr().err


def test_stop_process_leaves_no_child_behind():
    psutil = pytest.importorskip("psutil")
    # a parent in its own session with a child that ignores SIGTERM
    code = ("import subprocess, sys, time; "
            "subprocess.Popen([sys.executable, '-c', "
            "'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)']); "
            "time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    deadline = time.monotonic() + 20
    while not psutil.Process(proc.pid).children() and time.monotonic() < deadline:
        time.sleep(0.05)
    (child,) = psutil.Process(proc.pid).children()
    time.sleep(0.3)  # let the child install its handler
    bc.stop_process(proc, "test", grace=1)
    assert proc.poll() is not None
    child_gone = not child.is_running() or child.status() == psutil.STATUS_ZOMBIE
    assert child_gone, "the child survived"


def test_the_make_target_is_opt_in():
    makefile = (ROOT / "Makefile").read_text()
    assert "browser-check:" in makefile
    test_recipe = makefile.split("\ntest:", 1)[1].split("\n\n", 1)[0]
    assert "browser" not in test_recipe
    ci = (ROOT / ".ci" / "run").read_text()
    assert "browser-check" not in ci and "make chromium" in ci   # Chromium for the site tests only
    assert os.access(ROOT / "tools" / "browser_check.py", os.R_OK)
