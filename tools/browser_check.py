#!/usr/bin/env python3
"""Run a lesson notebook inside JupyterLab in headless Chromium, and fail on any cell error.

    make browser-check                                   # lesson 00, quick mode
    .venv/bin/python tools/browser_check.py notebooks/03_num_workers.ipynb --timeout 900

What it does, step by step:

1. starts JupyterLab on 127.0.0.1 (a free port, a random token, no browser, ``--allow-root``
   when run as root, quick mode in its environment so the kernel inherits it), with a fresh
   settings directory in which autosave is off, so the notebook file is never written;
2. starts headless Chromium with a fresh profile in a temporary directory and drives it over
   the Chrome DevTools Protocol (a websocket, through the ``websocket-client`` package);
3. opens the notebook in JupyterLab, waits for its kernel, runs
   ``notebook:run-all-cells`` through ``window.jupyterapp`` (the server is started with
   ``--LabApp.expose_app_in_browser=True``) and polls the notebook model until the run ends;
4. saves a screenshot of the executed notebook (build/browser-check/<notebook>.png), prints
   a summary, and exits 1 naming the cell and the error when a cell failed, or when the run
   took longer than ``--timeout`` seconds.

JupyterLab, its kernel and Chromium are always shut down, also on errors and Ctrl-C.
Chromium is Debian's ``chromium`` package (``apt-get install -y chromium``); ``--chromium``
or the CHROMIUM environment variable name another binary.
"""
from __future__ import annotations

import argparse
import base64
import contextlib
import itertools
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_NOTEBOOK = ROOT / "notebooks" / "00_measure_first.ipynb"
DEFAULT_OUT_DIR = ROOT / "build" / "browser-check"
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
INSTALL_HINT = "sudo apt-get install -y chromium"
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-extensions",
    "--disable-sync",
    "--hide-scrollbars",
    "--mute-audio",
)
# JupyterLab settings for the run: never save the notebook, render every cell (so the
# screenshot shows them all), and ask no website for news or updates.
LAB_SETTINGS = {
    "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False},
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "fetchNews": "false", "checkForUpdates": False},
}


class CheckError(RuntimeError):
    """A failure with a message meant for the person running the check."""


class ChromiumNotFound(CheckError):
    pass


# --------------------------------------------------------------------------------------
# pieces that need no browser (unit-tested in tests/test_browser_check.py)
# --------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="browser_check.py",
        description=("Open a lesson notebook in JupyterLab inside headless Chromium, run all "
                     "cells, save a screenshot, and exit 1 when a cell errors or the run times "
                     "out. Quick mode is on unless --full is given."),
        epilog=("Needs Chromium (Debian: apt-get install -y chromium) and the 'browser' extra "
                "(pip install -e '.[browser]'); `make browser-check` sets up both. "
                "Example: make browser-check BROWSER_CHECK_ARGS='notebooks/03_num_workers.ipynb'"),
    )
    parser.add_argument("notebook", nargs="?", default=str(DEFAULT_NOTEBOOK),
                        help="notebook to run (default: notebooks/00_measure_first.ipynb); a "
                             "path outside the repository is served from its own folder")
    parser.add_argument("--timeout", type=float, default=600.0, metavar="S",
                        help="fail when running all cells takes longer than S seconds (default 600)")
    parser.add_argument("--start-timeout", type=float, default=120.0, metavar="S",
                        help="seconds to wait for JupyterLab, Chromium and the kernel to start (default 120)")
    parser.add_argument("--screenshot", metavar="PNG",
                        help="where to save the screenshot (default build/browser-check/<notebook>.png)")
    parser.add_argument("--chromium", metavar="PATH",
                        help="Chromium binary (default: $CHROMIUM, else chromium, chromium-browser, "
                             "google-chrome on PATH)")
    parser.add_argument("--width", type=int, default=1400, help="viewport width in pixels (default 1400)")
    parser.add_argument("--height", type=int, default=1200,
                        help="viewport height while running (default 1200); the screenshot grows it "
                             "to show the whole notebook, up to --max-height")
    parser.add_argument("--max-height", type=int, default=16000,
                        help="tallest screenshot in pixels (default 16000)")
    parser.add_argument("--full", action="store_true",
                        help="full mode: do not switch quick mode on (slow: real measurements)")
    parser.add_argument("--find-chromium", action="store_true",
                        help="print the Chromium binary that would be used and exit (1 when none)")
    args = parser.parse_args(argv)
    if args.timeout <= 0 or args.start_timeout <= 0:
        parser.error("timeouts must be positive")
    if args.width < 200 or args.height < 200 or args.max_height < args.height:
        parser.error("viewport too small, or --max-height below --height")
    return args


def screenshot_path(notebook: Path, explicit: str | None = None) -> Path:
    return Path(explicit) if explicit else DEFAULT_OUT_DIR / f"{notebook.stem}.png"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def find_chromium(explicit: str | None = None, env: dict | None = None,
                  path: str | None = None) -> str:
    """The Chromium binary: ``explicit``, else $CHROMIUM, else the first of CHROMIUM_NAMES on
    PATH. Raises ChromiumNotFound with the command that installs it."""
    env = os.environ if env is None else env
    wanted = explicit or env.get("CHROMIUM")
    if wanted:
        found = shutil.which(wanted, path=path)
        if found:
            return found
        raise ChromiumNotFound(f"Chromium not found at {wanted!r} (from --chromium or $CHROMIUM).")
    for name in CHROMIUM_NAMES:
        found = shutil.which(name, path=path)
        if found:
            return found
    raise ChromiumNotFound(
        "Chromium is not installed (looked for " + ", ".join(CHROMIUM_NAMES) + " on PATH). "
        f"Install it with:\n    {INSTALL_HINT}\n"
        "or point --chromium / $CHROMIUM at a Chromium or Chrome binary.")


def chromium_command(binary: str, user_data_dir: str | os.PathLike, width: int, height: int,
                     debugging_port: int = 0) -> list[str]:
    """The Chromium command line. Port 0 lets Chromium pick a free port and write it to
    ``<user_data_dir>/DevToolsActivePort``."""
    return [binary, *CHROMIUM_FLAGS,
            f"--user-data-dir={user_data_dir}",
            f"--remote-debugging-port={debugging_port}",
            f"--window-size={width},{height}",
            "about:blank"]


def jupyter_command(python: str, port: int, token: str, root_dir: Path, tmp: Path,
                    as_root: bool) -> list[str]:
    """JupyterLab on loopback; its settings, workspaces and the checkpoint it makes when it
    opens a notebook all live in ``tmp``, so the run leaves nothing behind."""
    cmd = [python, "-m", "jupyter", "lab", "--no-browser",
           "--ip=127.0.0.1", f"--port={port}", "--ServerApp.port_retries=0",
           f"--IdentityProvider.token={token}",
           f"--ServerApp.root_dir={root_dir}",
           "--LabApp.expose_app_in_browser=True",
           f"--LabApp.user_settings_dir={tmp / 'lab-settings'}",
           f"--LabApp.workspaces_dir={tmp / 'lab-workspaces'}",
           f"--FileCheckpoints.checkpoint_dir={tmp / 'checkpoints'}"]
    if as_root:
        cmd.append("--allow-root")
    return cmd


def lab_url(port: int, token: str, notebook_rel: str) -> str:
    from urllib.parse import quote
    return f"http://127.0.0.1:{port}/lab/tree/{quote(notebook_rel)}?reset&token={token}"


def _text(value) -> str:
    return "".join(value) if isinstance(value, list) else (value or "")


@dataclass
class CellError:
    index: int            # position among all cells, 0-based
    code_cell: int        # position among code cells, 1-based
    execution_count: int | None
    ename: str
    evalue: str
    source_head: str      # first non-empty source line

    def describe(self) -> str:
        count = f"[{self.execution_count}]" if self.execution_count is not None else "[ ]"
        return (f"code cell {self.code_cell} (cell {self.index + 1} of the notebook, {count}) "
                f"raised {self.ename}: {self.evalue}\n    first line: {self.source_head}")


def find_errors(notebook: dict) -> list[CellError]:
    """Every code cell of an nbformat notebook dict with an output of type 'error'."""
    errors = []
    code_cells = 0
    for index, cell in enumerate(notebook.get("cells", [])):
        if cell.get("cell_type") != "code":
            continue
        code_cells += 1
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                head = next((line.strip() for line in _text(cell.get("source")).splitlines()
                             if line.strip()), "")
                errors.append(CellError(index, code_cells, cell.get("execution_count"),
                                        str(output.get("ename", "Error")),
                                        _text(output.get("evalue")).strip(), head))
                break
    return errors


def run_summary(notebook: dict) -> tuple[int, int]:
    """(code cells with an execution count, code cells) of a notebook dict."""
    code = [c for c in notebook.get("cells", []) if c.get("cell_type") == "code"]
    return sum(1 for c in code if c.get("execution_count") is not None), len(code)


# --------------------------------------------------------------------------------------
# processes
# --------------------------------------------------------------------------------------
def _descendants(proc: subprocess.Popen) -> list:
    try:
        import psutil
        return psutil.Process(proc.pid).children(recursive=True)
    except Exception:
        return []


def stop_process(proc: subprocess.Popen | None, name: str, grace: float = 10.0) -> None:
    """Terminate ``proc`` and every process below it (kernels, DataLoader workers, renderers)."""
    if proc is None:
        return
    children = _descendants(proc)
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    try:
        import psutil
        alive = [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
        for c in alive:
            with contextlib.suppress(psutil.Error):
                c.terminate()
        _, alive = psutil.wait_procs(alive, timeout=min(grace, 5))
        for c in alive:
            with contextlib.suppress(psutil.Error):
                c.kill()
        psutil.wait_procs(alive, timeout=3)
        if alive:
            print(f"browser-check: killed {len(alive)} leftover {name} process(es)", file=sys.stderr)
    except ImportError:
        pass


def _http_json(url: str, method: str = "GET", timeout: float = 5.0):
    req = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        body = resp.read()
    return json.loads(body) if body else None


def _log_tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


# --------------------------------------------------------------------------------------
# Chrome DevTools Protocol
# --------------------------------------------------------------------------------------
class Cdp:
    """A minimal synchronous CDP client over one page target's websocket."""

    def __init__(self, ws_url: str, timeout: float = 30.0):
        try:
            import websocket  # the websocket-client package
        except ImportError as exc:
            raise CheckError("The websocket-client package is missing: pip install -e '.[browser]' "
                             "(make browser-check installs it).") from exc
        # No Origin header: Chromium refuses websocket clients from foreign origins.
        self.ws = websocket.create_connection(ws_url, timeout=timeout, suppress_origin=True)
        self.ids = itertools.count(1)
        self.timeout = timeout

    def call(self, method: str, params: dict | None = None, timeout: float | None = None) -> dict:
        msg_id = next(self.ids)
        self.ws.send(json.dumps({"id": msg_id, "method": method, "params": params or {}}))
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            self.ws.settimeout(max(0.1, deadline - time.monotonic()))
            reply = json.loads(self.ws.recv())
            if reply.get("id") == msg_id:
                if "error" in reply:
                    raise CheckError(f"CDP {method} failed: {reply['error']}")
                return reply.get("result", {})
            if time.monotonic() > deadline:  # pragma: no cover - recv raises first
                raise CheckError(f"CDP {method}: no answer")

    def evaluate(self, expression: str, timeout: float | None = None):
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                "awaitPromise": True}, timeout)
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            raise CheckError(f"JavaScript error in the page: {text}")
        return result.get("result", {}).get("value")

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.ws.close()


# The notebook panel of PATH, as seen by JupyterLab: kernel status and the model as nbformat.
STATE_JS = r"""
(() => {
  const app = window.jupyterapp;
  if (!app || !app.shell) return {stage: 'app'};
  let panel = null;
  for (const w of app.shell.widgets('main')) {
    if (w.context && w.context.path === PATH) { panel = w; break; }
  }
  if (!panel) return {stage: 'panel'};
  if (!panel.context.isReady) return {stage: 'document'};
  const sc = panel.sessionContext;
  const kernel = sc.session && sc.session.kernel;
  const dialog = document.querySelector('.jp-Dialog');
  return {
    stage: (sc.isReady && kernel) ? 'ready' : 'kernel',
    kernel: kernel ? kernel.status : null,
    kernelName: kernel ? kernel.name : null,
    dialog: dialog ? dialog.innerText.slice(0, 300) : null,
    run: window.__browserCheck || null,
    notebook: panel.content.model ? panel.content.model.toJSON() : null,
  };
})()
"""

RUN_JS = r"""
(() => {
  const app = window.jupyterapp;
  let panel = null;
  for (const w of app.shell.widgets('main')) {
    if (w.context && w.context.path === PATH) { panel = w; break; }
  }
  app.shell.activateById(panel.id);
  window.__browserCheck = {done: false, started: Date.now()};
  app.commands.execute('notebook:run-all-cells').then(
    r => { window.__browserCheck.done = true; window.__browserCheck.result = r; },
    e => { window.__browserCheck.done = true; window.__browserCheck.error = String(e); });
  return true;
})()
"""

# Height the page needs to show the whole notebook: the window plus what scrolls inside it.
HEIGHT_JS = r"""
(() => {
  const nb = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-WindowedPanel-outer')
          || document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook');
  if (!nb) return window.innerHeight;
  nb.scrollTop = 0;
  return window.innerHeight + Math.max(0, nb.scrollHeight - nb.clientHeight);
})()
"""


# --------------------------------------------------------------------------------------
# the check
# --------------------------------------------------------------------------------------
class BrowserCheck:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.notebook = Path(args.notebook).resolve()
        if not self.notebook.is_file():
            raise CheckError(f"No such notebook: {args.notebook}")
        if self.notebook.suffix != ".ipynb":
            raise CheckError(f"Not a notebook (.ipynb): {args.notebook}")
        try:
            self.root_dir = ROOT
            self.notebook_rel = self.notebook.relative_to(ROOT).as_posix()
        except ValueError:
            self.root_dir = self.notebook.parent
            self.notebook_rel = self.notebook.name
        self.chromium = find_chromium(args.chromium)
        self.shot = screenshot_path(self.notebook, args.screenshot)
        self.jupyter: subprocess.Popen | None = None
        self.browser: subprocess.Popen | None = None
        self.cdp: Cdp | None = None
        self.token = secrets.token_hex(24)
        self.port = 0
        self.original = self.notebook.read_bytes()

    # -- start-up ----------------------------------------------------------------------
    def start_jupyter(self, tmp: Path) -> None:
        settings, workspaces = tmp / "lab-settings", tmp / "lab-workspaces"
        for rel, values in LAB_SETTINGS.items():
            target = settings / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(json.dumps(values))
        workspaces.mkdir()
        env = dict(os.environ)
        from course_utils.config import QUICK_ENV
        env[QUICK_ENV] = "0" if self.args.full else "1"
        env.pop("MPLBACKEND", None)  # the kernel's inline backend draws the figures
        env["JUPYTER_RUNTIME_DIR"] = str(tmp / "runtime")
        self.port = free_port()
        cmd = jupyter_command(sys.executable, self.port, self.token, self.root_dir, tmp,
                              as_root=hasattr(os, "geteuid") and os.geteuid() == 0)
        self.jupyter_log = self.shot.parent / "jupyterlab.log"
        log = open(self.jupyter_log, "wb")
        # own session: Ctrl-C reaches only this script, which then shuts everything down
        self.jupyter = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                        cwd=self.root_dir, start_new_session=True)
        log.close()
        deadline = time.monotonic() + self.args.start_timeout
        while True:
            if self.jupyter.poll() is not None:
                raise CheckError(f"JupyterLab exited with code {self.jupyter.returncode}:\n"
                                 + _log_tail(self.jupyter_log))
            try:
                _http_json(f"http://127.0.0.1:{self.port}/api/status?token={self.token}")
                return
            except (OSError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise CheckError(f"JupyterLab did not answer within {self.args.start_timeout:.0f} s:\n"
                                 + _log_tail(self.jupyter_log))
            time.sleep(0.3)

    def start_chromium(self, tmp: Path) -> None:
        profile = tmp / "chromium-profile"
        profile.mkdir()
        cmd = chromium_command(self.chromium, profile, self.args.width, self.args.height)
        self.browser_log = self.shot.parent / "chromium.log"
        log = open(self.browser_log, "wb")
        self.browser = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + self.args.start_timeout
        target = None
        while target is None:
            if self.browser.poll() is not None:
                raise CheckError(f"Chromium exited with code {self.browser.returncode}:\n"
                                 + _log_tail(self.browser_log))
            if time.monotonic() > deadline:
                raise CheckError(f"Chromium did not open its DevTools port within "
                                 f"{self.args.start_timeout:.0f} s:\n" + _log_tail(self.browser_log))
            try:
                port = int(port_file.read_text().split()[0])
                pages = _http_json(f"http://127.0.0.1:{port}/json/list")
                target = next((p for p in pages if p.get("type") == "page"), None)
            except (OSError, ValueError, IndexError):
                pass
            if target is None:
                time.sleep(0.2)
        self.cdp = Cdp(target["webSocketDebuggerUrl"])
        self.cdp.call("Page.enable")
        self.cdp.call("Runtime.enable")
        self.set_viewport(self.args.height)

    def set_viewport(self, height: int) -> None:
        self.cdp.call("Emulation.setDeviceMetricsOverride",
                      {"width": self.args.width, "height": height, "deviceScaleFactor": 1,
                       "mobile": False})

    def state(self) -> dict:
        return self.cdp.evaluate(STATE_JS.replace("PATH", json.dumps(self.notebook_rel))) or {}

    def open_notebook(self) -> dict:
        self.cdp.call("Page.navigate", {"url": lab_url(self.port, self.token, self.notebook_rel)})
        deadline = time.monotonic() + self.args.start_timeout
        state: dict = {}
        while True:
            with contextlib.suppress(CheckError):
                state = self.state()
                if state.get("stage") == "ready" and state.get("kernel") == "idle":
                    return state
            if time.monotonic() > deadline:
                stage = state.get("stage", "page")
                what = {"page": "the page to load", "app": "JupyterLab to start in the page",
                        "panel": "the notebook to open", "document": "the notebook to load",
                        "kernel": "the kernel to start"}.get(stage, f"the kernel (status {state.get('kernel')})")
                extra = f"\nA dialog is open: {state['dialog']}" if state.get("dialog") else ""
                raise CheckError(f"Timed out after {self.args.start_timeout:.0f} s waiting for {what}."
                                 + extra + f"\nJupyterLab log: {self.jupyter_log}")
            time.sleep(0.5)

    # -- the run -----------------------------------------------------------------------
    def run_all(self) -> tuple[dict, float, bool]:
        """Run all cells; returns (final state, seconds, timed_out)."""
        self.cdp.evaluate(RUN_JS.replace("PATH", json.dumps(self.notebook_rel)))
        start = time.monotonic()
        last_report = start
        state: dict = {}
        while True:
            time.sleep(1.0)
            state = self.state()
            run = state.get("run") or {}
            elapsed = time.monotonic() - start
            notebook = state.get("notebook") or {}
            if run.get("done") and state.get("kernel") == "idle":
                return state, elapsed, False
            if state.get("kernel") in ("dead", "unknown") or state.get("stage") != "ready":
                return state, elapsed, False
            if elapsed > self.args.timeout:
                return state, elapsed, True
            if time.monotonic() - last_report >= 15:
                done, total = run_summary(notebook)
                print(f"browser-check: {elapsed:4.0f} s, {done}/{total} code cells run", flush=True)
                last_report = time.monotonic()

    def screenshot(self) -> None:
        height = self.cdp.evaluate(HEIGHT_JS) or self.args.height
        height = int(min(max(height, self.args.height), self.args.max_height))
        self.set_viewport(height)
        time.sleep(1.5)  # let the layout settle at the new size
        self.cdp.evaluate(HEIGHT_JS)  # scroll the notebook to the top again
        time.sleep(0.5)
        data = self.cdp.call("Page.captureScreenshot", {"format": "png"}, timeout=60)["data"]
        self.shot.parent.mkdir(parents=True, exist_ok=True)
        self.shot.write_bytes(base64.b64decode(data))

    # -- shutdown ----------------------------------------------------------------------
    def shutdown(self) -> None:
        # a second Ctrl-C must not cut the clean-up short
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            self._shutdown()
        finally:
            signal.signal(signal.SIGINT, previous)

    def _shutdown(self) -> None:
        if self.cdp is not None:
            with contextlib.suppress(Exception):
                self.cdp.call("Browser.close", timeout=5)
            self.cdp.close()
        stop_process(self.browser, "Chromium", grace=5)
        if self.jupyter is not None and self.jupyter.poll() is None:
            kernels = _descendants(self.jupyter)
            with contextlib.suppress(Exception):  # shuts the kernels down, then the server
                _http_json(f"http://127.0.0.1:{self.port}/api/shutdown?token={self.token}", "POST")
                self.jupyter.wait(15)
            stop_process(self.jupyter, "JupyterLab")
            try:
                import psutil
                left = [k for k in kernels if k.is_running() and k.status() != psutil.STATUS_ZOMBIE]
                for k in left:
                    with contextlib.suppress(psutil.Error):
                        k.kill()
            except ImportError:
                pass
        else:
            stop_process(self.jupyter, "JupyterLab")
        if self.notebook.read_bytes() != self.original:  # autosave is off; belt and braces
            self.notebook.write_bytes(self.original)
            print(f"browser-check: restored {self.notebook_rel}, which JupyterLab had saved",
                  file=sys.stderr)

    def run(self) -> int:
        self.shot.parent.mkdir(parents=True, exist_ok=True)
        mode = "full" if self.args.full else "quick"
        with tempfile.TemporaryDirectory(prefix="browser-check-") as tmp_name:
            tmp = Path(tmp_name)
            try:
                t0 = time.monotonic()
                print(f"browser-check: JupyterLab for {self.notebook_rel} ({mode} mode)", flush=True)
                self.start_jupyter(tmp)
                print(f"browser-check: Chromium ({self.chromium})", flush=True)
                self.start_chromium(tmp)
                state = self.open_notebook()
                print(f"browser-check: kernel {state.get('kernelName')} ready after "
                      f"{time.monotonic() - t0:.0f} s; running all cells", flush=True)
                state, seconds, timed_out = self.run_all()
                try:
                    self.screenshot()
                except Exception as exc:  # the verdict matters more than the picture
                    print(f"browser-check: no screenshot: {exc}", file=sys.stderr)
                return self.report(state, seconds, timed_out)
            finally:
                self.shutdown()

    def report(self, state: dict, seconds: float, timed_out: bool) -> int:
        notebook = state.get("notebook") or {}
        done, total = run_summary(notebook)
        errors = find_errors(notebook)
        shot = self.shot if self.shot.is_file() else None
        print(f"browser-check: {self.notebook_rel}: {done}/{total} code cells run in "
              f"{seconds:.1f} s, {len(errors)} error(s)")
        print(f"browser-check: screenshot {shot.relative_to(ROOT) if shot and shot.is_relative_to(ROOT) else shot or 'not taken'}")
        problems = []
        if state.get("stage") != "ready" or state.get("kernel") in ("dead", "unknown"):
            problems.append(f"the kernel stopped (status {state.get('kernel')}, stage {state.get('stage')})")
        for err in errors:
            problems.append(err.describe())
        if timed_out:
            code = [(i, c) for i, c in enumerate(notebook.get("cells", [])) if c.get("cell_type") == "code"]
            pending = next(((n, i, c) for n, (i, c) in enumerate(code, 1)
                            if c.get("execution_count") is None), None)
            where = ""
            if pending is not None:
                n, i, c = pending
                head = next((line.strip() for line in _text(c.get("source")).splitlines() if line.strip()), "")
                where = (f"; code cell {n} (cell {i + 1} of the notebook) had not finished"
                         f"\n    first line: {head}")
            problems.append(f"timed out after {self.args.timeout:.0f} s{where}")
        run = state.get("run") or {}
        if run.get("error"):
            problems.append(f"run-all-cells failed in JupyterLab: {run['error']}")
        if not problems and done < total:
            problems.append(f"only {done} of {total} code cells ran")
        if problems:
            print("browser-check: FAILED", file=sys.stderr)
            for p in problems:
                print(f"  - {p}", file=sys.stderr)
            return 1
        print("browser-check: OK")
        return 0


def _raise_keyboard_interrupt(signum, frame):
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.find_chromium:
        try:
            print(find_chromium(args.chromium))
            return 0
        except ChromiumNotFound as exc:
            print(exc, file=sys.stderr)
            return 1
    previous = signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)  # clean up on kill too
    try:
        return BrowserCheck(args).run()
    except CheckError as exc:
        print(f"browser-check: FAILED\n  {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("browser-check: interrupted; JupyterLab and Chromium were shut down", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))  # course_utils from this checkout, installed or not
    sys.exit(main())
