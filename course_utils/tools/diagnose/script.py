"""``python -m course_utils diagnose train.py [ARGS...]``: the learner's script, unchanged, measured.

:func:`diagnose_script` runs the script in a child process under the probe
(:mod:`course_utils.tools.diagnose.probe`) for part of the budget, picks the loader the loop spent
the most time on, gives the verdict (the same rule and threshold as ``diagnose MODULE:FUNCTION``),
names likely causes, then re-runs the script once per ``--try`` (or per default fix when it is
data-bound) with that loader's arguments overridden where it is made, and measures each side by
side. Each run has its own process group, killed when the run ends: no worker outlives it.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from course_utils.machine import usable_cpus

from .rules import DiagnoseError, runs_own_pools, verdict

#: what ``--try`` may change, and how its value is read
TRY_KEYS = {"num_workers": int, "batch_size": int, "prefetch_factor": int,
            "pin_memory": bool, "persistent_workers": bool}
#: the baseline run's share of the budget (the rest is split between the fixes)
BASELINE_SHARE = 0.5
#: a fix whose slice of the budget would be shorter than this many seconds is not run
MIN_SLICE_S = 2.0
#: seconds a run may go past its budget (a long step, the script's own start-up) before it is ended
GRACE_S = 15.0


def parse_try(text: str) -> dict[str, Any]:
    """``"num_workers=4,pin_memory=true"`` -> ``{"num_workers": 4, "pin_memory": True}``."""
    changes: dict[str, Any] = {}
    for part in str(text).split(","):
        key, sep, value = (x.strip() for x in part.partition("="))
        if not sep or key not in TRY_KEYS or not value:
            raise DiagnoseError(f"--try {text!r}: each change is KEY=VALUE with KEY one of "
                                f"{', '.join(TRY_KEYS)}, e.g. --try num_workers=4,pin_memory=true.")
        kind = TRY_KEYS[key]
        if kind is bool:
            if value.lower() not in ("true", "false", "1", "0"):
                raise DiagnoseError(f"--try {key}={value!r}: use true or false.")
            changes[key] = value.lower() in ("true", "1")
        else:
            try:
                changes[key] = int(value)
            except ValueError:
                raise DiagnoseError(f"--try {key}={value!r}: use a whole number.") from None
            if changes[key] < (0 if key == "num_workers" else 1):
                raise DiagnoseError(f"--try {key}={value!r}: too small.")
    return changes


def change_label(changes: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in changes.items())


@dataclass
class LoaderStats:
    """One loader's figures from one run (seconds; see :class:`~.probe.LoaderRecord`)."""

    raw: dict

    @property
    def index(self) -> int:
        return int(self.raw["index"])

    @property
    def loop_s(self) -> float:
        return float(sum(self.raw["waits_s"]) + sum(self.raw["steps_s"]))

    @property
    def timed_batches(self) -> int:
        return len(self.raw["waits_s"])

    @property
    def wait_fraction(self) -> float | None:
        """Time blocked in ``next`` over the loop's time (wait + step), after the warm-up."""
        return sum(self.raw["waits_s"]) / self.loop_s if self.loop_s > 0 else None

    @property
    def samples_per_s(self) -> float | None:
        return self.raw["samples"] / self.loop_s if self.loop_s > 0 else None

    def tail_s(self) -> dict[str, float | None]:
        waits = self.raw["waits_s"]
        return {f"p{q}": (float(np.percentile(waits, q)) if waits else None) for q in (50, 95, 99)}

    def mean_step_s(self) -> float | None:
        steps = self.raw["steps_s"]
        return float(np.mean(steps)) if steps else None

    def to_dict(self) -> dict:
        out = {k: v for k, v in self.raw.items() if k not in ("waits_s", "steps_s")}
        return {**out, "timed_batches": self.timed_batches, "wait_fraction": self.wait_fraction,
                "samples_per_s": self.samples_per_s, "wait_tail_s": self.tail_s(),
                "mean_step_s": self.mean_step_s()}


@dataclass
class ScriptRun:
    """One run of the script under the probe."""

    label: str
    changes: dict
    end: str
    status: int
    error: str | None
    elapsed_s: float
    cuda: bool
    loaders: list[LoaderStats]

    def main_loader(self) -> LoaderStats | None:
        """The loader the loop spent the most time on (waiting + stepping), if any was timed."""
        timed = [s for s in self.loaders if s.loop_s > 0]
        return max(timed, key=lambda s: s.loop_s) if timed else None


def _python_env() -> dict[str, str]:
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[3])      # the course's package, wherever it is
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


def run_script(target: str, argv: list[str], *, module: bool, budget_s: float,
               overrides: dict[int, dict] | None = None, label: str = "as it is") -> ScriptRun:
    """Run the script (or ``-m`` module) for at most ``budget_s`` seconds under the probe, in
    a new process group that is killed afterwards; what it measured."""
    with tempfile.TemporaryDirectory(prefix="course_diagnose_") as tmp:
        out = Path(tmp) / "probe.json"
        config = {"script" if not module else "module": target, "argv": list(argv),
                  "budget_s": budget_s, "overrides": overrides or {}, "out": str(out),
                  "grace_s": GRACE_S}
        (Path(tmp) / "config.json").write_text(json.dumps(config))
        child = subprocess.Popen([sys.executable, "-m", "course_utils.tools.diagnose.probe",
                                  str(Path(tmp) / "config.json")], env=_python_env(),
                                 start_new_session=True)
        try:
            child.wait(timeout=budget_s + 2 * GRACE_S + 30)
        except subprocess.TimeoutExpired:
            pass
        except KeyboardInterrupt:
            _signal_group(child, signal.SIGINT)
            try:
                child.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            raise
        finally:
            _signal_group(child, signal.SIGKILL)       # the workers too, whatever they do
            child.wait()
        if not out.is_file():
            raise DiagnoseError(f"the run {label!r} ended (exit {child.returncode}) before it "
                                f"wrote what it measured.")
        data = json.loads(out.read_text())
    return ScriptRun(label, dict(next(iter((overrides or {}).values()), {})), data["end"],
                     data["status"], data["error"], data["elapsed_s"], data["cuda"],
                     [LoaderStats(d) for d in data["loaders"]])


def _signal_group(child: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(child.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def default_tries(main: LoaderStats, cuda: bool) -> list[dict[str, Any]]:
    """The cheap fixes worth a re-run for a data-bound loader: more workers (twice as many, and
    one per usable CPU, at most twice the CPUs; kept across epochs when the script's epochs
    restarted them), persistent workers alone when it has workers, pinned memory on CUDA. At
    most three."""
    s, usable = main.raw["settings"], usable_cpus()
    workers = s["num_workers"] or 0
    restarts = not s["persistent_workers"] and main.raw["epochs"] > 1
    keep = {"persistent_workers": True} if restarts else {}
    tries: list[dict[str, Any]] = [{"num_workers": n, **keep}
                                   for n in sorted({max(1, 2 * workers), usable})
                                   if workers < n <= 2 * usable]
    if workers and restarts:
        tries.insert(0, {"persistent_workers": True})
    if cuda and not s["pin_memory"]:
        tries.append({"pin_memory": True})
    return tries[:3]


def likely_causes(main: LoaderStats, cuda: bool) -> list[str]:
    """Reasons a data-bound loader is slow, each from a recorded figure or setting."""
    s, raw, usable = main.raw["settings"], main.raw, usable_cpus()
    causes = []
    workers = s["num_workers"] or 0
    if workers < usable:
        causes.append(f"too few workers: num_workers={workers} on {usable} usable CPUs")
    if runs_own_pools(raw["worker_threads"]):
        causes.append(f"thread pools inside the workers: up to {max(raw['worker_threads'])} OS "
                      f"threads in a worker (oversubscription, lesson 02)")
    if str(raw.get("batch")).startswith("float32") and str(raw.get("batch")).count(",") == 3:
        causes.append(f"float32 batches from the workers ({raw['batch']}); uint8 until the device "
                      f"sends a quarter of the bytes (lesson 01)")
    if workers and not s["persistent_workers"] and raw["epochs"] > 1:
        causes.append(f"the workers restart every epoch ({raw['epochs']} epochs, start-up "
                      f"{raw['startup_s']:.2f} s the first time) without persistent_workers=True "
                      f"(lesson 03)")
    if cuda and not s["pin_memory"]:
        causes.append("unpinned memory: the copy to the GPU cannot overlap (lesson 04)")
    return causes


@dataclass
class ScriptDiagnosis:
    """What ``diagnose train.py`` measured and concluded."""

    command: str
    baseline: ScriptRun
    verdict: str | None
    causes: list[str]
    fixes: list[ScriptRun] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def main(self) -> LoaderStats | None:
        return self.baseline.main_loader()

    def gain(self, run: ScriptRun) -> float | None:
        """The fix's samples/s on the main loader over the baseline's (None: not measured)."""
        base, main = self.main(), None
        if base is not None:
            main = next((s for s in run.loaders if s.index == base.index), None)
        if base is None or main is None or not base.samples_per_s or not main.samples_per_s:
            return None
        return main.samples_per_s / base.samples_per_s

    def best_fix(self) -> ScriptRun | None:
        """The fix with the largest gain above 1.05x, if one was measured."""
        scored = [(g, r) for r in self.fixes if (g := self.gain(r)) is not None and g > 1.05]
        return max(scored, key=lambda x: x[0])[1] if scored else None

    def to_dict(self) -> dict:
        def run(r: ScriptRun) -> dict:
            return {"label": r.label, "changes": r.changes, "end": r.end, "status": r.status,
                    "elapsed_s": r.elapsed_s, "cuda": r.cuda, "gain": self.gain(r),
                    "loaders": [s.to_dict() for s in r.loaders]}
        best = self.best_fix()
        main = self.main()
        return {"command": self.command, "verdict": self.verdict, "causes": self.causes,
                "main_loader": None if main is None else main.index,
                "data_wait_fraction": None if main is None else main.wait_fraction,
                "baseline": run(self.baseline), "fixes": [run(r) for r in self.fixes],
                "best_fix": None if best is None else best.changes, "notes": self.notes,
                "error": self.baseline.error}

    def __str__(self) -> str:
        main = self.main()
        lines = [f"diagnose {self.command}: "
                 + (self.verdict.upper() if self.verdict else "NO VERDICT")
                 + ("" if main is None else f" (loader {main.index} waited {main.wait_fraction:.0%} "
                                            f"of its loop)")]
        for stats in self.baseline.loaders:
            lines += _loader_lines(stats, stats is main)
        if self.causes:
            lines += ["likely causes:"] + [f"  - {c}" for c in self.causes]
        if self.fixes:
            lines.append(f"fixes, each a re-run of the script with loader {main.index}'s arguments "
                         f"changed where it is made:")
            for r in self.fixes:
                m = next((s for s in r.loaders if s.index == main.index), None)
                gain = self.gain(r)
                lines.append(f"  - {change_label(r.changes):<28} " + (
                    "not measured (no timed batch)" if m is None or gain is None else
                    f"{m.samples_per_s:8,.0f} samples/s, data wait {m.wait_fraction:.0%}: "
                    f"{gain:.2f}x"))
            best = self.best_fix()
            if best is not None:
                lines.append(f"change: {main.raw['where']}: DataLoader(..., "
                             f"{change_label(best.changes)})  ({self.gain(best):.2f}x samples/s)")
            else:
                lines.append("none of the fixes gave more than 1.05x here.")
        lines.append(f"the run ended: {self.baseline.end} after {self.baseline.elapsed_s:.1f} s")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def _loader_lines(stats: LoaderStats, main: bool) -> list[str]:
    s, raw = stats.raw["settings"], stats.raw
    ms = lambda x: "-" if x is None else f"{x * 1e3:.1f} ms"  # noqa: E731
    tail = stats.tail_s()
    gpu = raw.get("gpu_busy")
    lines = [f"loader {stats.index}{' (the loop)' if main else ''}, made at {raw['where']}: "
             f"{s['dataset']} (transform {s['transform']}), num_workers={s['num_workers']}, "
             f"batch_size={s['batch_size']}, pin_memory={s['pin_memory']}, persistent_workers="
             f"{s['persistent_workers']}, prefetch_factor={s['prefetch_factor']}, "
             f"start method {s['start_method']}"]
    if not stats.timed_batches:
        return lines + [f"  {raw['batches']} batch(es), none timed (the first "
                        f"{raw['warmup_batches'] + 1} are start-up and warm-up)"]
    lines += [f"  {stats.timed_batches} timed batches of {raw['batches']} ({raw['epochs']} "
              f"epoch(s)), {stats.samples_per_s:,.0f} samples/s over the loop; start-up "
              f"{raw['startup_s']:.2f} s to the first batch; batches {raw['batch']}",
              f"  data wait {stats.wait_fraction:.0%} of the loop; wait per batch p50 "
              f"{ms(tail['p50'])}, p95 {ms(tail['p95'])}, p99 {ms(tail['p99'])}; step (between "
              f"batches) {ms(stats.mean_step_s())} mean",
              f"  workers: {raw['workers_seen']} seen, {raw['worker_cpu_s']:.2f} CPU-s sampled, OS threads "
              f"{raw['worker_threads'] or '-'}; GPU busy: "
              + ("not measured (no CUDA here)" if gpu is None else
                 f"{gpu:.0%} of the loop ({raw.get('gpu_busy_source')})")]
    return lines


def diagnose_script(target: str, argv: list[str] | None = None, *, module: bool = False,
                    budget_s: float = 60.0, tries: list[dict[str, Any]] | None = None,
                    progress: bool = True) -> ScriptDiagnosis:
    """Run the script as it is, give the verdict, and measure the fixes (module docstring).
    ``tries``: the changes to measure (None: the default fixes when it is data-bound)."""
    argv = list(argv or [])
    if not module and not Path(target).is_file():
        raise DiagnoseError(f"{target!r}: no such script; pass your training script (diagnose "
                            f"train.py --epochs 1), -m package.module, or MODULE:FUNCTION.")
    if not budget_s > 0:
        raise DiagnoseError(f"--budget must be a positive number of seconds, got {budget_s!r}.")
    command = " ".join([("-m " if module else "") + target, *argv])
    share = BASELINE_SHARE if tries != [] else 1.0
    say = print if progress else (lambda *_a, **_k: None)
    say(f"diagnose: running {command} as it is for {share * budget_s:.0f} s ...", file=sys.stderr)
    t0 = time.perf_counter()
    baseline = run_script(target, argv, module=module, budget_s=share * budget_s)
    # Python's and torch's start-up in each run's process come before its budget begins
    overhead_s = max(0.0, time.perf_counter() - t0 - baseline.elapsed_s)
    main = baseline.main_loader()
    if main is None:
        return ScriptDiagnosis(command, baseline, None, [], notes=[
            f"the script iterated no DataLoader batch to time within {share * budget_s:.0f} s "
            f"({baseline.end}); run it for longer with --budget, or check that it reaches its loop"])
    bound = verdict(main.wait_fraction)
    causes = likely_causes(main, baseline.cuda) if bound == "data-bound" else []
    if tries is None:
        tries = default_tries(main, baseline.cuda) if bound == "data-bound" else []
    result = ScriptDiagnosis(command, baseline, bound, causes)
    if baseline.status != 0:
        return result
    slice_s = (1 - share) * budget_s / max(1, len(tries))
    for changes in tries:
        if slice_s < MIN_SLICE_S:
            result.notes.append(f"not tried: {change_label(changes)} ({slice_s:.1f} s each is "
                                f"under {MIN_SLICE_S:g} s; raise --budget)")
            continue
        say(f"diagnose: re-running with {change_label(changes)} for {slice_s:.0f} s ...",
            file=sys.stderr)
        result.fixes.append(run_script(target, argv, module=module, budget_s=slice_s,
                                       overrides={main.index: changes}, label=change_label(changes)))
    result.notes.append(f"each run also spent {overhead_s:.1f} s starting Python and torch before "
                        f"its share of --budget {budget_s:g} s began")
    return result
