#!/usr/bin/env python3
"""Open every page of the built website in headless Chromium and fail on what a reader would meet.

    make site-check                                    # the site make site built (build/site)
    .venv/bin/python tools/site_check.py build/site-small --screenshot notebooks/00_measure_first

The site is served from 127.0.0.1 by Python's own HTTP server (as ``python -m http.server``
would), and each page is loaded in Chromium, driven over the DevTools protocol (the same client
as tools/browser_check.py). For every page it reports: JavaScript errors and console errors
(collected by a script installed before the page's own), images that did not load, internal
links that point at no file, and any resource fetched from another host (the site must work
offline). It saves a screenshot of one lesson page (build/site-check/<page>.png) and exits 1
when any page has a problem.
"""
from __future__ import annotations

import argparse
import base64
import contextlib
import functools
import http.server
import json
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from browser_check import Cdp, CheckError, chromium_command, find_chromium, stop_process  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / "build" / "site-check"
#: Installed before each page's own scripts: every error the reader's console would show.
COLLECT_JS = r"""
window.__siteErrors = [];
window.addEventListener('error', e => {
  const t = e.target;
  if (t && t !== window && (t.src || t.href)) window.__siteErrors.push('failed to load ' + (t.src || t.href));
  else window.__siteErrors.push('JavaScript error: ' + (e.message || e));
}, true);
window.addEventListener('unhandledrejection', e => window.__siteErrors.push('unhandled rejection: ' + e.reason));
const __error = console.error;
console.error = (...a) => { window.__siteErrors.push('console.error: ' + a.join(' ')); __error(...a); };
"""
#: What the loaded page shows: errors, broken images, its links and every resource it fetched.
PAGE_JS = r"""
(() => ({
  ready: document.readyState,
  errors: window.__siteErrors || [],
  broken: [...document.images].filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src),
  images: document.images.length,
  links: [...document.querySelectorAll('a[href]')].map(a => a.href),
  resources: performance.getEntriesByType('resource').map(r => r.name),
}))()
"""


def pages_of(site: Path) -> list[str]:
    """Every HTML page of the site, relative to it (search and the index of terms included)."""
    return sorted(p.relative_to(site).as_posix() for p in site.rglob("*.html") if "_static" not in p.parts)


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    """``python -m http.server``'s handler, without a log line per request."""

    def log_message(self, format: str, *args: object) -> None:
        pass


def serve(site: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    """Serve ``site`` on 127.0.0.1 in a background thread; (server, base URL)."""
    handler = functools.partial(QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


@functools.lru_cache(maxsize=None)
def link_problem(url: str, base: str) -> str | None:
    """Why an internal link is broken (None when it is external, an anchor, or resolves)."""
    parts = urllib.parse.urlsplit(url)
    if not url.startswith(base) or parts.scheme not in ("http", "https"):
        return None
    target = urllib.parse.urlunsplit(parts._replace(fragment="", query=""))
    try:
        with urllib.request.urlopen(urllib.request.Request(target, method="HEAD"), timeout=10):
            return None
    except urllib.error.HTTPError as exc:
        return f"{target[len(base):]}: HTTP {exc.code}"
    except OSError as exc:
        return f"{target[len(base):]}: {exc}"


def start_browser(tmp: Path, width: int, height: int) -> tuple[subprocess.Popen, Cdp]:
    """Headless Chromium with a fresh profile in ``tmp``; (process, CDP client of its page)."""
    profile = tmp / "profile"
    profile.mkdir()
    proc = subprocess.Popen(chromium_command(find_chromium(), profile, width, height),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError, IndexError):
            port = int((profile / "DevToolsActivePort").read_text().split()[0])
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5) as r:
                page = next(p for p in json.load(r) if p.get("type") == "page")
            cdp = Cdp(page["webSocketDebuggerUrl"])
            for domain in ("Page.enable", "Runtime.enable"):
                cdp.call(domain)
            cdp.call("Page.addScriptToEvaluateOnNewDocument", {"source": COLLECT_JS})
            cdp.call("Emulation.setDeviceMetricsOverride",
                     {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
            return proc, cdp
        if proc.poll() is not None:
            raise CheckError(f"Chromium exited with code {proc.returncode}")
        time.sleep(0.2)
    raise CheckError("Chromium did not open its DevTools port within 60 s")


def check_page(cdp: Cdp, base: str, page: str, timeout: float = 30.0) -> tuple[list[str], dict]:
    """Load one page; (its problems, what it showed)."""
    cdp.call("Page.navigate", {"url": base + page})
    deadline = time.monotonic() + timeout
    state: dict = {}
    while time.monotonic() < deadline:
        time.sleep(0.2)
        with contextlib.suppress(CheckError):
            state = cdp.evaluate(PAGE_JS) or {}
            if state.get("ready") == "complete" and not [s for s in state.get("broken", []) if not s]:
                break
    if state.get("ready") != "complete":
        return [f"did not finish loading within {timeout:.0f} s"], state
    problems = list(state["errors"]) + [f"image did not load: {src}" for src in state["broken"]]
    problems += [f"fetched from another host: {url}" for url in state["resources"]
                 if not url.startswith(base) and not url.startswith(("data:", "blob:"))]
    problems += [f"broken link: {p}" for p in dict.fromkeys(
        link_problem(url, base) for url in state["links"]) if p]
    return problems, state


def screenshot(cdp: Cdp, base: str, page: str, path: Path, width: int) -> None:
    cdp.call("Page.navigate", {"url": base + page})
    time.sleep(1.5)
    height = int(min(cdp.evaluate("document.documentElement.scrollHeight") or 1200, 6000))
    cdp.call("Emulation.setDeviceMetricsOverride",
             {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
    time.sleep(0.5)
    data = cdp.call("Page.captureScreenshot", {"format": "png"}, timeout=60)["data"]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(base64.b64decode(data))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="tools/site_check.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("site", nargs="?", default=str(ROOT / "build" / "site"),
                        help="the built site's folder (default: build/site)")
    parser.add_argument("--screenshot", default=None, metavar="PAGE",
                        help="the page to photograph, without .html (default: the first lesson)")
    parser.add_argument("--width", type=int, default=1200, help="window width in pixels")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    site = Path(args.site)
    if not (site / "index.html").is_file():
        print(f"site-check: {site} holds no index.html; build the site first: make site", file=sys.stderr)
        return 2
    pages = pages_of(site)
    shot_page = (args.screenshot + ".html" if args.screenshot else
                 next((p for p in pages if p.startswith("notebooks/")), "index.html"))
    server, base = serve(site)
    proc = None
    failed: dict[str, list[str]] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="site-check-") as tmp:
            try:
                proc, cdp = start_browser(Path(tmp), args.width, 900)
            except CheckError as exc:
                print(f"site-check: {exc}", file=sys.stderr)
                return 2
            images = 0
            for page in pages:
                problems, state = check_page(cdp, base, page)
                images += state.get("images", 0)
                if problems:
                    failed[page] = problems
            shot = OUT_DIR / (Path(shot_page).with_suffix(".png").name)
            screenshot(cdp, base, shot_page, shot, args.width)
            cdp.close()
    finally:
        stop_process(proc, "Chromium")
        server.shutdown()
    print(f"site-check: {len(pages)} pages, {images} images, in headless Chromium from {base}")
    for page, problems in failed.items():
        print(f"  {page}:")
        for problem in problems[:10]:
            print(f"    {problem}")
    print(f"screenshot of {shot_page}: {shot}")
    print("every page loaded with no console error, every image and internal link resolved, "
          "nothing fetched from another host" if not failed else f"{len(failed)} page(s) with problems")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
