"""Lesson 02's fork hazard: what ``cv2.setNumThreads(n)`` does in a forked child of a process
that has used OpenCV's pool — the tries that finished and that hung (killed after a timeout),
run in a subprocess so nothing can hang the caller (:func:`fork_cv2_demo`). Nothing happens at
import time.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..checks import check_int, check_seconds
from ..config import QUICK_ENV
from ..threads import THREAD_ENV_VARS


__all__ = [
    "ForkCv2Report",
    "fork_cv2_demo",
]



def _child_env() -> dict[str, str]:
    """This process's environment for a child: no thread variable, course_utils importable, and
    no quick-mode setting (the child only reports)."""
    env = {k: v for k, v in os.environ.items() if k not in THREAD_ENV_VARS and k != QUICK_ENV}
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


# --------------------------------------------------------------------------------------
# cv2.setNumThreads in a forked child (run in a subprocess: it can hang)
# --------------------------------------------------------------------------------------
_FORK_DEMO = textwrap.dedent("""
    import json, os, sys, time
    import numpy as np, cv2
    args, tries, per_try = json.loads(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    if cv2.getNumThreads() < 2:
        cv2.setNumThreads(2)
    img = np.random.default_rng(0).integers(0, 255, (1024, 1024, 3), dtype=np.uint8)
    cv2.GaussianBlur(img, (15, 15), 0)          # the parent uses OpenCV's pool
    parent = {"opencv": cv2.getNumThreads(), "os_threads": len(os.listdir("/proc/self/task"))
              if os.path.isdir("/proc/self/task") else None}
    result = {"parent": parent, "cases": {}}
    for arg in args:
        done = hung = 0
        child_info = None
        for t in range(tries):
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(r)
                info = {"reads": cv2.getNumThreads(), "os_threads":
                        len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else None}
                os.write(w, (json.dumps(info) + "\\n").encode())
                if arg is not None:
                    cv2.setNumThreads(arg)
                cv2.GaussianBlur(img, (15, 15), 0)
                os._exit(0)
            os.close(w)
            deadline = time.monotonic() + per_try
            while True:
                finished, _ = os.waitpid(pid, os.WNOHANG)
                if finished:
                    done += 1
                    break
                if time.monotonic() > deadline:
                    os.kill(pid, 9)
                    os.waitpid(pid, 0)
                    hung += 1
                    break
                time.sleep(0.01)
            data = os.read(r, 4096).decode()
            os.close(r)
            if child_info is None and data.strip():
                child_info = json.loads(data.splitlines()[0])
        result["cases"][json.dumps(arg)] = {"done": done, "hung": hung, "child": child_info}
    print("RESULT=" + json.dumps(result))
""")


@dataclass
class ForkCv2Report:
    """What ``cv2.setNumThreads(arg)`` did in forked children of a process that used OpenCV.

    ``cases[arg] = (finished, hung)`` out of ``tries`` forks (arg None: no call at all); a
    child is declared hung after ``per_try_s`` seconds and killed. ``child_reads`` is what
    ``cv2.getNumThreads()`` read in a child and ``child_os_threads`` how many OS threads it
    really had; ``parent_opencv`` / ``parent_os_threads`` the same in the parent.
    """

    cases: dict[Any, tuple[int, int]]
    tries: int
    per_try_s: float
    parent_opencv: int | None
    parent_os_threads: int | None
    child_reads: int | None
    child_os_threads: int | None
    available: bool = True
    error: str = ""

    def hung(self, arg: Any) -> int:
        return self.cases[arg][1]

    def __str__(self) -> str:
        if not self.available:
            return f"fork demo not run: {self.error}"
        lines = [f"parent: cv2.getNumThreads() = {self.parent_opencv}, "
                 f"{self.parent_os_threads} OS threads after using OpenCV's pool",
                 f"forked child: cv2.getNumThreads() reads {self.child_reads}, "
                 f"the child has {self.child_os_threads} OS thread(s)"]
        for arg, (done, hung) in self.cases.items():
            call = "no call" if arg is None else f"cv2.setNumThreads({arg})"
            lines.append(f"  {call:<22} finished {done}/{self.tries}, hung {hung}/{self.tries} "
                         f"(killed after {self.per_try_s:g} s)")
        return "\n".join(lines)


def fork_cv2_demo(args: Sequence[int | None] = (None, 0, 1), *, tries: int = 3,
                  per_try_s: float = 2.0, timeout_s: float = 60.0) -> ForkCv2Report:
    """Fork children of a process that has used OpenCV's pool and call ``cv2.setNumThreads``.

    Everything runs in a separate Python process (``sys.executable``): it uses OpenCV's pool
    (a Gaussian blur of a 1024x1024 image with at least 2 threads), then for each value in
    ``args`` forks ``tries`` children that call ``cv2.setNumThreads(value)`` (``None``: no
    call) and blur once more. A child that has not finished after ``per_try_s`` seconds counts
    as hung and is killed; ``timeout_s`` bounds the whole demo. Where ``os.fork`` does not exist
    the report says so (``available=False``).
    """
    where = "fork_cv2_demo"
    tries = check_int("tries", tries, 1, where)
    per_try_s = check_seconds("per_try_s", per_try_s, where, positive=True)
    timeout_s = check_seconds("timeout_s", timeout_s, where, positive=True)
    args = list(args)
    for a in args:
        if a is not None:
            check_int("args item", a, 0, where)
    if not hasattr(os, "fork"):
        return ForkCv2Report({}, tries, per_try_s, None, None, None, None, available=False,
                             error="this platform has no fork (Windows): workers always start "
                                   "fresh, and this hazard does not exist here.")
    try:
        proc = subprocess.run([sys.executable, "-c", _FORK_DEMO, json.dumps(args), str(tries),
                               str(per_try_s)], env=_child_env(), capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return ForkCv2Report({}, tries, per_try_s, None, None, None, None, available=False,
                             error=f"the demo did not finish within timeout_s={timeout_s:g} s.")
    line = next((l for l in proc.stdout.splitlines() if l.startswith("RESULT=")), None)
    if proc.returncode != 0 or line is None:
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
        return ForkCv2Report({}, tries, per_try_s, None, None, None, None, available=False,
                             error=f"the demo process failed (exit {proc.returncode}): {tail}")
    data = json.loads(line[len("RESULT="):])
    cases: dict[Any, tuple[int, int]] = {}
    child: dict = {}
    for key, value in data["cases"].items():
        cases[json.loads(key)] = (int(value["done"]), int(value["hung"]))
        if not child and value.get("child"):
            child = value["child"]
    return ForkCv2Report(cases, tries, per_try_s, data["parent"].get("opencv"),
                         data["parent"].get("os_threads"), child.get("reads"),
                         child.get("os_threads"))
