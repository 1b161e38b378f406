"""Lesson 02's environment-variable cases: the thread pools fresh Python processes report when
the thread variables are set before the imports, after them, or when the pools are limited at
run time (:func:`env_after_vs_before_import`). Each case runs in its own subprocess, so "before
import" is real. Nothing happens at import time.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


from ..checks import check_int, check_seconds
from ..config import QUICK_ENV
from ..threads import THREAD_ENV_VARS, ThreadPools


__all__ = [
    "EnvCase",
    "env_cases",
    "ENV_CASES",
    "EnvReport",
    "env_after_vs_before_import",
]



# --------------------------------------------------------------------------------------
# environment variables: before vs after import, in fresh processes
# --------------------------------------------------------------------------------------
_CHILD_HEADER = "import json, os, sys\n"
_CHILD_IMPORTS = "import numpy, cv2, torch\n"
_CHILD_REPORT = ("from course_utils.threads import thread_pools\n"
                 "print('POOLS=' + json.dumps(thread_pools().to_dict()))\n")


@dataclass(frozen=True)
class EnvCase:
    """One way of limiting threads, run as a script in a fresh Python process."""

    name: str
    description: str
    before_imports: str = ""
    after_imports: str = ""

    def script(self) -> str:
        return (_CHILD_HEADER + self.before_imports + _CHILD_IMPORTS + self.after_imports
                + _CHILD_REPORT)


def _env_lines(names: Sequence[str], value: int) -> str:
    return "".join(f"os.environ[{n!r}] = '{value}'\n" for n in names)


def env_cases(n_threads: int = 1) -> list[EnvCase]:
    """The cases :func:`env_after_vs_before_import` runs, for a limit of ``n_threads``."""
    n = check_int("n_threads", n_threads, 1, "env_cases")
    return [
        EnvCase("nothing set", "no variable, no limit: the libraries' defaults"),
        EnvCase("OMP_NUM_THREADS before import",
                "os.environ['OMP_NUM_THREADS'] set at the top, before importing numpy/cv2/torch",
                before_imports=_env_lines(["OMP_NUM_THREADS"], n)),
        EnvCase("all variables before import",
                f"all of {', '.join(THREAD_ENV_VARS)} set before the imports",
                before_imports=_env_lines(THREAD_ENV_VARS, n)),
        EnvCase("all variables after import",
                "the same variables set right after importing numpy/cv2/torch (none used yet)",
                after_imports=_env_lines(THREAD_ENV_VARS, n)),
        EnvCase("run-time calls after import",
                f"threadpoolctl.threadpool_limits({n}), torch.set_num_threads({n}), "
                f"cv2.setNumThreads({0 if n == 1 else n}) after the imports",
                after_imports=("import threadpoolctl\n"
                               f"_limits = threadpoolctl.threadpool_limits(limits={n})\n"
                               f"torch.set_num_threads({n})\n"
                               f"cv2.setNumThreads({0 if n == 1 else n})\n")),
    ]


#: Names of the cases, in order.
ENV_CASES = tuple(c.name for c in env_cases())


@dataclass
class EnvReport:
    """Pools each fresh process reported (``pools[name]``), or why it could not (``errors``)."""

    cases: list[EnvCase]
    pools: dict[str, ThreadPools]
    errors: dict[str, str]
    n_threads: int
    seconds: float

    def limited(self, name: str) -> bool | None:
        """True when every pool of case ``name`` is at most ``n_threads`` (None if it failed)."""
        p = self.pools.get(name)
        return None if p is None else p.limited_to(self.n_threads)

    def unlimited_pools(self, name: str) -> dict[str, int]:
        """Pools of case ``name`` above ``n_threads``: {pool: threads}."""
        p = self.pools.get(name)
        if p is None:
            return {}
        return {k: v for k, v in p.pools.items() if v > self.n_threads}

    def table(self) -> str:
        """Rows = pools, columns = cases, cells = threads each fresh process reported."""
        names = [c.name for c in self.cases]
        pool_names: list[str] = []
        for name in names:
            for pool in (self.pools[name].pools if name in self.pools else {}):
                if pool not in pool_names:
                    pool_names.append(pool)
        head = ["pool"] + [f"({i + 1})" for i in range(len(names))]
        rows = []
        for pool in pool_names:
            rows.append([pool] + [str(self.pools[n].pools.get(pool, "-")) if n in self.pools
                                  else "error" for n in names])
        rows.append(["all limited?"] + [
            {True: "yes", False: "NO", None: "error"}[self.limited(n)] for n in names])
        widths = [max(len(r[c]) for r in [head] + rows) for c in range(len(head))]
        lines = ["  ".join([r[0].ljust(widths[0])] + [r[c].rjust(widths[c])
                                                     for c in range(1, len(r))])
                 for r in [head] + rows]
        lines.append("")
        lines += [f"({i + 1}) {c.name}: {c.description}" for i, c in enumerate(self.cases)]
        for name, err in self.errors.items():
            lines.append(f"error in {name!r}: {err}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def _child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in THREAD_ENV_VARS}
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop(QUICK_ENV, None)  # the child only reports; keep its config out of it
    return env


def env_after_vs_before_import(n_threads: int = 1, *, cases: Sequence[str] | None = None,
                               timeout_s: float = 120.0, parallel: bool = True) -> EnvReport:
    """Run each of :func:`env_cases` in a fresh Python process and collect its thread pools.

    Each child starts with none of :data:`THREAD_ENV_VARS` set (whatever this process has),
    runs the case's lines before/after ``import numpy, cv2, torch``, and reports
    :func:`course_utils.threads.thread_pools` (threads per pool). The children run at the same
    time when ``parallel`` (each imports torch: seconds). ``timeout_s`` bounds the whole run;
    a child that does not answer in time is killed and reported in ``errors``. ``cases``
    picks some of :data:`ENV_CASES` by name (each case costs a torch import); None runs all.
    """
    where = "env_after_vs_before_import"
    n = check_int("n_threads", n_threads, 1, where)
    timeout_s = check_seconds("timeout_s", timeout_s, where, positive=True)
    all_cases = env_cases(n)
    if cases is None:
        chosen = all_cases
    else:
        if isinstance(cases, str) or not isinstance(cases, Sequence) or not cases:
            raise TypeError(f"{where}: cases must be a non-empty list of case names from "
                            f"{list(ENV_CASES)}, got {cases!r}.")
        unknown = [c for c in cases if c not in ENV_CASES]
        if unknown:
            raise ValueError(f"{where}: unknown case(s) {unknown}; choose from {list(ENV_CASES)}.")
        chosen = [c for c in all_cases if c.name in cases]
    cases = chosen
    env = _child_env()
    start = time.perf_counter()
    pools: dict[str, ThreadPools] = {}
    errors: dict[str, str] = {}

    def launch(case: EnvCase) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", case.script()], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def collect(case: EnvCase, proc: subprocess.Popen) -> None:
        left = max(1.0, timeout_s - (time.perf_counter() - start))
        try:
            out, err = proc.communicate(timeout=left)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            errors[case.name] = f"no answer within timeout_s={timeout_s:g} s (killed)"
            return
        line = next((l for l in out.splitlines() if l.startswith("POOLS=")), None)
        if proc.returncode != 0 or line is None:
            tail = (err or out).strip().splitlines()[-3:]
            errors[case.name] = f"exit code {proc.returncode}: {' | '.join(tail)}"
            return
        pools[case.name] = ThreadPools.from_dict(json.loads(line[len("POOLS="):]))

    if parallel:
        procs = [(case, launch(case)) for case in cases]
        for case, proc in procs:
            collect(case, proc)
    else:
        for case in cases:
            collect(case, launch(case))
    return EnvReport(cases, pools, errors, n, time.perf_counter() - start)
