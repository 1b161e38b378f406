"""``python -m course_utils diagnose train.py [ARGS...]``: the learner's script, unchanged, measured.

:func:`diagnose_script` runs the script in a child process under :mod:`.probe` for half the budget,
takes the loader the loop spent the most time on, gives the verdict (:mod:`.rules`) and likely
causes, then re-runs the script once per ``--try`` (or default fix when data-bound) with that
loader's arguments changed where it is made. Each run's process group is killed when it ends.
"""
from __future__ import annotations

import contextlib
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
from course_utils.measurement import fmt_time, jsonable

from .rules import MIN_GAIN, DiagnoseError, runs_own_pools, verdict

#: how a run that the probe refused ends (``end`` in its JSON)
OUT_OF_SCOPE = "out of scope"
#: the loader settings the probe records, which ``--try`` may change, and how its value is read
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
        if TRY_KEYS[key] is bool:
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
    """One loader's figures from one run, as :class:`~.probe.LoaderRecord` wrote them."""

    raw: dict

    @property
    def index(self) -> int:
        return int(self.raw["index"])

    @property
    def loop_s(self) -> float:
        """Seconds of the timed batches: their waits in ``next`` and the steps after them."""
        return float(sum(self.raw["waits_s"]) + sum(self.raw["steps_s"]))

    @property
    def timed_batches(self) -> int:
        return len(self.raw["waits_s"])

    @property
    def wait_fraction(self) -> float | None:
        """Seconds waiting in ``next`` over :attr:`loop_s` (None: nothing timed)."""
        return sum(self.raw["waits_s"]) / self.loop_s if self.loop_s > 0 else None

    @property
    def samples_per_s(self) -> float | None:
        """The timed batches' samples over :attr:`loop_s`: a fix that removes a stall in the
        tail (workers restarting each epoch) shows here, where a median per batch would hide it."""
        return self.raw["samples"] / self.loop_s if self.loop_s > 0 else None

    def tail_s(self) -> dict[str, float | None]:
        """p50, p95 and p99 of the wait per timed batch, in seconds."""
        waits = self.raw["waits_s"]
        return {f"p{q}": (float(np.percentile(waits, q)) if waits else None) for q in (50, 95, 99)}

    def mean_step_s(self) -> float | None:
        """Mean seconds between a batch's arrival and the next ``next``."""
        steps = self.raw["steps_s"]
        return float(np.mean(steps)) if steps else None

    def to_dict(self) -> dict:
        return {**{k: v for k, v in self.raw.items() if k not in ("waits_s", "steps_s")},
                "timed_batches": self.timed_batches, "wait_fraction": self.wait_fraction,
                "samples_per_s": self.samples_per_s, "wait_tail_s": self.tail_s(),
                "mean_step_s": self.mean_step_s()}


@dataclass
class ScriptRun:
    """One run of the script under the probe: how it ended, seconds it ran, each loader."""

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

    def loader(self, index: int) -> LoaderStats | None:
        return next((s for s in self.loaders if s.index == index), None)


def run_script(target: str, argv: list[str], *, module: bool, budget_s: float,
               overrides: dict[int, dict] | None = None, label: str = "as it is") -> ScriptRun:
    """Run the script (or ``-m`` module) under the probe for at most ``budget_s`` seconds, in a
    new process group that is killed afterwards; ``overrides``: loader index -> ``--try``."""
    with tempfile.TemporaryDirectory(prefix="course_diagnose_") as tmp:
        out = Path(tmp) / "probe.json"
        config = {"script" if not module else "module": target, "argv": list(argv),
                  "budget_s": budget_s, "overrides": overrides or {}, "out": str(out),
                  "grace_s": GRACE_S}
        (Path(tmp) / "config.json").write_text(json.dumps(config))
        root = str(Path(__file__).resolve().parents[3])      # the course's package, wherever it is
        path = os.pathsep.join(filter(None, (root, os.environ.get("PYTHONPATH"))))
        child = subprocess.Popen([sys.executable, "-m", "course_utils.tools.diagnose.probe",
                                  str(Path(tmp) / "config.json")],
                                 env={**os.environ, "PYTHONPATH": path}, start_new_session=True)
        try:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=budget_s + 2 * GRACE_S + 30)
        except KeyboardInterrupt:
            _signal_group(child, signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=5)
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
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, sig)


def default_tries(main: LoaderStats, cuda: bool) -> list[dict[str, Any]]:
    """At most three fixes to re-run a data-bound loader with: more workers (the fix candidates
    twice as many and one per usable CPU, at most twice the CPUs; kept across epochs when the
    script's epochs restarted them), persistent workers alone, pinned memory on CUDA."""
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
    if str(raw["batch"]).startswith("float32") and str(raw["batch"]).count(",") == 3:
        causes.append(f"float32 batches from the workers ({raw['batch']}); uint8 until the device "
                      f"sends a quarter of the bytes (lesson 01)")
    if workers and not s["persistent_workers"] and raw["epochs"] > 1:
        causes.append(f"the workers restart every epoch ({raw['epochs']} epochs, start-up {raw['startup_s']:.2f}"
                      f" s the first time) without persistent_workers=True (lesson 03)")
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
        """The baseline's busiest loader: the one the verdict and the fixes are about."""
        return self.baseline.main_loader()

    def gain(self, run: ScriptRun) -> float | None:
        """The run's samples/s on the main loader over the baseline's (None: not measured)."""
        base = self.main()
        fixed = None if base is None else run.loader(base.index)
        if fixed is None or not base.samples_per_s or not fixed.samples_per_s:
            return None
        return fixed.samples_per_s / base.samples_per_s

    def best_fix(self) -> ScriptRun | None:
        """The fix with the largest gain above :data:`~.rules.MIN_GAIN`, if one was measured."""
        scored = [(g, r) for r in self.fixes if (g := self.gain(r)) is not None and g > MIN_GAIN]
        return max(scored, key=lambda x: x[0])[1] if scored else None

    def to_dict(self) -> dict:
        def run(r: ScriptRun) -> dict:
            return {**{k: v for k, v in vars(r).items() if k != "error"}, "gain": self.gain(r)}
        best, main = self.best_fix(), self.main()
        return jsonable({"command": self.command, "verdict": self.verdict, "causes": self.causes,
                "main_loader": None if main is None else main.index,
                "data_wait_fraction": None if main is None else main.wait_fraction,
                "baseline": run(self.baseline), "fixes": [run(r) for r in self.fixes],
                "best_fix": None if best is None else best.changes, "notes": self.notes,
                "error": self.baseline.error})

    def __str__(self) -> str:
        main, best = self.main(), self.best_fix()
        lines = [f"diagnose {self.command}: " + (self.verdict or "no verdict").upper() + (
            "" if main is None else f" (loader {main.index} waited {main.wait_fraction:.0%} of its loop)")]
        for stats in self.baseline.loaders:
            lines += _loader_lines(stats, stats is main)
        lines += ["likely causes:"] * bool(self.causes) + [f"  - {c}" for c in self.causes]
        if self.fixes:
            lines.append(f"fixes, each a re-run of the script with loader {main.index}'s arguments "
                         f"changed where it is made:")
            for r in self.fixes:
                m, gain = r.loader(main.index), self.gain(r)
                lines.append(f"  - {change_label(r.changes):<28} " + (
                    "not measured (no timed batch)" if gain is None else
                    f"{m.samples_per_s:8,.0f} samples/s, data wait {m.wait_fraction:.0%}: {gain:.2f}x"))
            lines.append(f"none of the fixes gave more than {MIN_GAIN:.2f}x here." if best is None else
                         f"change: {main.raw['where']}: DataLoader(..., {change_label(best.changes)})"
                         f"  ({self.gain(best):.2f}x samples/s)")
        lines.append(f"the run ended: {self.baseline.end} after {self.baseline.elapsed_s:.1f} s")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def _loader_lines(stats: LoaderStats, main: bool) -> list[str]:
    s, raw, tail, gpu = stats.raw["settings"], stats.raw, stats.tail_s(), stats.raw["gpu_busy"]
    lines = [f"loader {stats.index}{' (the loop)' if main else ''}, made at {raw['where']}: "
             f"{s['dataset']} (transform {s['transform']}), "
             + "".join(f"{k}={s[k]}, " for k in TRY_KEYS) + f"start method {s['start_method']}"]
    if not stats.timed_batches:
        return lines + [f"  {raw['batches']} batch(es), none timed (the first "
                        f"{raw['warmup_batches']} are warm-up, the start-up's included)"]
    lines += [f"  {stats.timed_batches} timed batches of {raw['batches']} ({raw['epochs']} "
              f"epoch(s)), {stats.samples_per_s:,.0f} samples/s over the loop; start-up "
              f"{raw['startup_s']:.2f} s to the first batch; batches {raw['batch']}",
              f"  data wait {stats.wait_fraction:.0%} of the loop; wait per batch p50 "
              f"{fmt_time(tail['p50'])}, p95 {fmt_time(tail['p95'])}, p99 {fmt_time(tail['p99'])}; "
              f"step (between batches) {fmt_time(stats.mean_step_s())} mean",
              f"  workers: {raw['workers_seen']} seen, {raw['worker_cpu_s']:.2f} CPU-s sampled, OS "
              f"threads {raw['worker_threads'] or '-'}; GPU busy: " + (
                  "not measured (no CUDA steps)" if gpu is None else
                  f"{gpu:.0%} of the loop (CUDA events around each step)")]
    return lines


def diagnose_script(target: str, argv: list[str] | None = None, *, module: bool = False,
                    budget_s: float = 60.0, tries: list[dict[str, Any]] | None = None,
                    progress: bool = True) -> ScriptDiagnosis:
    """Run the script as it is for half of ``budget_s`` seconds, give the verdict, and measure
    ``tries`` (None: the default fixes when data-bound) in the other half (module docstring)."""
    argv = list(argv or [])
    if not module and not Path(target).is_file():
        raise DiagnoseError(f"{target!r}: no such script; pass your training script (diagnose "
                            f"train.py --epochs 1) or -m package.module.")
    if not budget_s > 0:
        raise DiagnoseError(f"--budget must be a positive number of seconds, got {budget_s!r}.")
    command = " ".join([("-m " if module else "") + target, *argv])
    share = BASELINE_SHARE if tries != [] else 1.0
    say = print if progress else (lambda *_a, **_k: None)
    say(f"diagnose: running {command} as it is for {share * budget_s:.0f} s ...", file=sys.stderr)
    t0 = time.perf_counter()
    baseline = run_script(target, argv, module=module, budget_s=share * budget_s)
    overhead_s = max(0.0, time.perf_counter() - t0 - baseline.elapsed_s)   # Python's, torch's start
    main = baseline.main_loader()
    if main is None:
        return ScriptDiagnosis(command, baseline, None, [], notes=[
            f"the script iterated no DataLoader batch to time within {share * budget_s:.0f} s "
            f"({baseline.end}); run it for longer with --budget, or check that it reaches its loop"])
    bound = verdict(main.wait_fraction)
    result = ScriptDiagnosis(command, baseline, bound,
                             likely_causes(main, baseline.cuda) if bound == "data-bound" else [])
    if tries is None:
        tries = default_tries(main, baseline.cuda) if bound == "data-bound" else []
    if baseline.status != 0:
        return result
    slice_s = (1 - share) * budget_s / max(1, len(tries))
    for changes, label in zip(tries, map(change_label, tries)):
        if slice_s < MIN_SLICE_S:
            result.notes.append(f"not tried: {label} ({slice_s:.1f} s each is under {MIN_SLICE_S:g} s;"
                                f" raise --budget)")
            continue
        say(f"diagnose: re-running with {label} for {slice_s:.0f} s ...", file=sys.stderr)
        result.fixes.append(run_script(target, argv, module=module, budget_s=slice_s,
                                       overrides={main.index: changes}, label=label))
    result.notes.append(f"each run also spent {overhead_s:.1f} s starting Python and torch before "
                        f"its share of --budget {budget_s:g} s began")
    return result
