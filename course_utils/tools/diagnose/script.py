"""``python -m course_utils diagnose train.py [ARGS...]``: the learner's script, unchanged, measured.

:func:`diagnose_script` runs the script under :mod:`.probe` in a child process (its process group
killed after) for half the budget; the loop is its busiest loader with ``MIN_TIMED_BATCHES`` timed
(fewer give no figure); then the verdict (:mod:`.rules`), each ``--try`` (or default fix) that fits
the budget re-run with that loader changed where it is made, and the causes the figures support.
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
from course_utils.timing import MIN_TIMED_BATCHES

from .health import loader_health
from .rules import (DATA_BOUND_FRACTION, LOAD_BUSY, MIN_GAIN, DiagnoseError, named_failure, runs_own_pools,
                    verdict)

#: how a run ends (``end`` in its JSON): refused by the probe; argparse refused the arguments; budget
OUT_OF_SCOPE, USAGE_ERROR = "out of scope", "the script exited with a usage error"
BUDGET_ENDS = ("the budget was spent", "no batch boundary after the budget")
#: diagnose's own options that take a value (they go before the script)
VALUED_OPTIONS = ("--budget", "--try", "--json")
#: the loader settings the probe records, which ``--try`` may change, and how its value is read
TRY_KEYS = {"num_workers": int, "batch_size": int, "prefetch_factor": int,
            "pin_memory": bool, "persistent_workers": bool}
#: the baseline run's share of the budget (the rest is split between the fixes)
BASELINE_SHARE = 0.5
#: a fix gets a run of at least this many seconds, or none
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
        flag = TRY_KEYS[key] is bool
        if not (value.lower() in ("true", "false", "1", "0") if flag else value.lstrip("-").isdigit()):
            raise DiagnoseError(f"--try {key}={value!r}: use {'true or false' if flag else 'a whole number'}.")
        changes[key] = value.lower() in ("true", "1") if flag else int(value)
        if not flag and changes[key] < (0 if key == "num_workers" else 1):
            raise DiagnoseError(f"--try {key}={value!r}: too small.")
    return changes


def change_label(changes: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in changes.items())


@dataclass
class LoaderStats:
    """One loader's figures from one run, as :class:`~.probe.LoaderRecord` wrote them; each is
    None unless :attr:`measured` (the timing engine's rule)."""

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
    def measured(self) -> bool:
        """At least :data:`~course_utils.timing.MIN_TIMED_BATCHES` batches timed, in seconds > 0."""
        return self.timed_batches >= MIN_TIMED_BATCHES and self.loop_s > 0

    @property
    def wait_fraction(self) -> float | None:
        """Seconds waiting in ``next`` over :attr:`loop_s`."""
        return sum(self.raw["waits_s"]) / self.loop_s if self.measured else None

    @property
    def samples_per_s(self) -> float | None:
        """The timed batches' samples over :attr:`loop_s`: a fix that removes a stall in the
        tail (workers restarting each epoch) shows here, where a median per batch would hide it."""
        return self.raw["samples"] / self.loop_s if self.measured else None

    def tail_s(self) -> dict[str, float | None]:
        """p50, p95 and p99 of the wait per timed batch, in seconds."""
        waits = self.raw["waits_s"]
        return {f"p{q}": float(np.percentile(waits, q)) if self.measured else None for q in (50, 95, 99)}

    def mean_step_s(self) -> float | None:
        """Mean seconds between a batch's arrival and the next ``next``."""
        return float(np.mean(self.raw["steps_s"])) if self.measured else None

    def load_busy(self) -> float | None:
        """The share of its time the loading computed (the probe's ``busy_s``): the workers' over
        their sampled time, or (no workers) the loop thread's over its waits in ``next``."""
        raw, workers = self.raw, self.raw["settings"]["num_workers"]
        cpu, wall = ((raw["worker_busy_s"], raw["worker_wall_s"]) if workers
                     else (raw["wait_busy_s"], sum(raw["waits_s"])))
        return min(1.0, cpu / wall) if self.measured and wall > 0 else None

    def cpu_per_sample_s(self) -> float | None:
        """Seconds computing per sample: each worker's busy share over the samples/s (a data-bound
        loop takes what the workers make), or (no workers) the waits' busy seconds per sample."""
        busy, workers = self.load_busy(), self.raw["settings"]["num_workers"]
        if busy is None or not self.raw["samples"]:
            return None
        return busy * workers / self.samples_per_s if workers else self.raw["wait_busy_s"] / self.raw["samples"]

    def to_dict(self) -> dict:
        return {**{k: v for k, v in self.raw.items() if k not in ("waits_s", "steps_s")},
                "timed_batches": self.timed_batches, "measured": self.measured,
                "wait_fraction": self.wait_fraction, "samples_per_s": self.samples_per_s,
                "wait_tail_s": self.tail_s(), "mean_step_s": self.mean_step_s(),
                "load_busy": self.load_busy(), "cpu_per_sample_s": self.cpu_per_sample_s(),
                "health": loader_health(self.raw) if self.measured else None}


@dataclass
class ScriptRun:
    """One run under the probe: its end, seconds, loaders, what it raised and its traceback."""

    label: str
    changes: dict
    end: str
    status: int
    error: str | None
    elapsed_s: float
    cuda: bool
    loaders: list[LoaderStats]
    raised: dict | None = None

    def main_loader(self) -> LoaderStats | None:
        """The measured loader the loop spent the most time on (waiting + stepping), if any."""
        timed = [s for s in self.loaders if s.measured]
        return max(timed, key=lambda s: s.loop_s) if timed else None

    def batches(self) -> str:
        """``"37 batch(es) (loader 0: 32, loader 1: 5)"``: what the loaders handed over."""
        each = ", ".join(f"loader {s.index}: {s.raw['batches']}" for s in self.loaders)
        return f"{sum(s.raw['batches'] for s in self.loaders)} batch(es)" + (
            f" ({each})" if len(self.loaders) > 1 else "")

    def loader(self, index: int) -> LoaderStats | None:
        return next((s for s in self.loaders if s.index == index), None)


def run_script(target: str, argv: list[str], *, module: bool, budget_s: float,
               overrides: dict[int, dict] | None = None, label: str = "as it is") -> ScriptRun:
    """Run the script (or ``-m`` module) under the probe for at most ``budget_s`` seconds, in a
    new process group that is killed afterwards; ``overrides``: loader index -> ``--try``."""
    with tempfile.TemporaryDirectory(prefix="course_diagnose_") as tmp:
        out = Path(tmp) / "probe.json"
        config = {"script" if not module else "module": target, "argv": list(argv),
                  "budget_s": budget_s, "overrides": overrides or {}, "out": str(out), "grace_s": GRACE_S}
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
                     [LoaderStats(d) for d in data["loaders"]], data["raised"])


def _signal_group(child: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, sig)


def default_tries(main: LoaderStats, cuda: bool) -> list[dict[str, Any]]:
    """A data-bound loader's fixes, best expected first: pinned memory on CUDA, persistent workers
    if its epochs restarted them, more workers (one per CPU, then twice as many, kept if so)."""
    s, usable = main.raw["settings"], usable_cpus()
    workers = s["num_workers"] or 0
    restarts = not s["persistent_workers"] and main.raw["epochs"] > 1
    keep = {"persistent_workers": True} if restarts else {}
    more = sorted({usable, max(1, 2 * workers)}, key=lambda n: (n > usable, -n))
    return ([{"pin_memory": True}] * (cuda and not s["pin_memory"])
            + [{"persistent_workers": True}] * bool(workers and restarts)
            + [{"num_workers": n, **keep} for n in more if workers < n <= 2 * usable])


def likely_causes(main: LoaderStats, cuda: bool, tried: list[tuple[dict, float | None]] = ()) -> list[str]:
    """Why a data-bound loader is slow, each from a measured figure, unless refuted by ``tried``
    ((changes, gain) per fix run: every try setting its key gained at most ``MIN_GAIN``)."""
    s, raw, usable = main.raw["settings"], main.raw, usable_cpus()
    workers, busy, restart_s = s["num_workers"] or 0, main.load_busy(), raw["epoch_start_wait_s"]

    def refuted(key: str) -> bool:
        gains = [gain for changes, gain in tried if key in changes and gain is not None]
        return bool(gains) and max(gains) <= MIN_GAIN
    per_sample, causes = main.cpu_per_sample_s(), []
    if busy is not None and busy > LOAD_BUSY and per_sample:
        causes.append(f"the per-sample CPU cost in {s['dataset']} (decode, transforms, conversions):"
                      f" {per_sample * 1e3:.1f} ms computing per sample, the loading busy {busy:.0%} "
                      f"of its time on a CPU or queued for one (lessons 01, 05)")
    if workers < usable and not refuted("num_workers"):
        causes.append(f"too few workers: num_workers={workers} on {usable} usable CPUs")
    if runs_own_pools(raw["worker_threads"]):
        causes.append(f"thread pools inside the workers: up to {max(raw['worker_threads'])} OS "
                      f"threads in a worker (oversubscription, lesson 02)")
    if cuda and str(raw["batch"]).startswith("float32") and str(raw["batch"]).count(",") == 3:
        causes.append(f"float32 batches from the loader ({raw['batch']}); uint8 until the device "
                      f"copies a quarter of the bytes (lesson 01)")
    if (workers and not s["persistent_workers"] and restart_s > DATA_BOUND_FRACTION * main.loop_s
            and not refuted("persistent_workers")):
        causes.append(f"the workers restart every epoch: the epochs' first batches waited "
                      f"{restart_s:.2f} s, {restart_s / main.loop_s:.0%} of the loop, without "
                      f"persistent_workers=True (lesson 03)")
    if cuda and not s["pin_memory"] and not refuted("pin_memory"):
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
                "error": self.baseline.error, "raised": self.baseline.raised,
                "failure": named_failure(self.baseline.error)})

    def __str__(self) -> str:
        main, best, run = self.main(), self.best_fix(), self.baseline
        lines = [f"diagnose {self.command}: " + (self.verdict or "no verdict").upper() + (
            f" (no loader had {MIN_TIMED_BATCHES} timed batches)" if main is None else
            f" (loader {main.index} waited {main.wait_fraction:.0%} of its loop)")]
        for stats in self.baseline.loaders:
            lines += _loader_lines(stats, stats is main)
        lines += ["likely causes:"] * bool(self.causes) + [f"  - {c}" for c in self.causes]
        if self.fixes:
            lines.append(f"fixes, each a re-run of the script with loader {main.index}'s arguments "
                         f"changed where it is made:")
            for r in self.fixes:
                m, gain = r.loader(main.index), self.gain(r)
                lines.append(f"  - {change_label(r.changes):<28} " + (
                    f"not measured (fewer than {MIN_TIMED_BATCHES} timed batches)" if gain is None else
                    f"{m.samples_per_s:8,.0f} samples/s, data wait {m.wait_fraction:.0%}: {gain:.2f}x"))
            lines.append(f"none of the fixes gave more than {MIN_GAIN:.2f}x here." if best is None else
                         f"change: {main.raw['where']}: DataLoader(..., {change_label(best.changes)})"
                         f"  ({self.gain(best):.2f}x samples/s)")
        failure = named_failure(run.error)
        lines.append("the run ended: " + (f"{run.end} after {run.elapsed_s:.1f} s" if not run.raised else
                     f"the script raised {run.raised['error']} at {run.raised['where']}, after "
                     f"{run.batches()}; its own traceback follows on stderr" if not failure else
                     f"the script died of {failure[0]} at {run.raised['where']}, after {run.batches()} "
                     f"(lesson 09); fix: {failure[1]}"))
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def _loader_lines(stats: LoaderStats, main: bool) -> list[str]:
    s, raw, tail, gpu = stats.raw["settings"], stats.raw, stats.tail_s(), stats.raw["gpu_busy"]
    lines = [f"loader {stats.index}{' (the loop)' if main else ''}, made at {raw['where']}: "
             f"{s['dataset']} (transform {s['transform']}), "
             + "".join(f"{k}={s[k]}, " for k in TRY_KEYS) + f"start method {s['start_method']}"]
    if not stats.measured:
        return lines + [f"  no figures: {raw['batches']} batch(es), {stats.timed_batches} timed after "
                        f"the {raw['warmup_batches']} of warm-up, fewer than the {MIN_TIMED_BATCHES} "
                        f"a figure needs (a batch is timed once its step has ended)"]
    lines += [f"  {stats.timed_batches} timed batches of {raw['batches']} ({raw['epochs']} "
              f"epoch(s)), {stats.samples_per_s:,.0f} samples/s over the loop; start-up "
              f"{raw['startup_s']:.2f} s to the first batch; batches {raw['batch']}",
              f"  data wait {stats.wait_fraction:.0%} of the loop; wait per batch p50 "
              f"{fmt_time(tail['p50'])}, p95 {fmt_time(tail['p95'])}, p99 {fmt_time(tail['p99'])}; "
              f"step (between batches) {fmt_time(stats.mean_step_s())} mean",
              "  loading: " + ("CPU not sampled twice" if stats.load_busy() is None else
                               f"{stats.load_busy():.0%} busy (on a CPU or queued)") + "; workers: "
              f"{raw['workers_seen']} seen, OS threads {raw['worker_threads'] or '-'}; GPU busy: " + (
                  "not measured (no CUDA steps)" if gpu is None else
                  f"{gpu:.0%} of the loop (CUDA events around each step)")]
    rows = [f"    {r['what']}: {r['said']}: " + (f"AT RISK; fix: {r['fix']}" if r["verdict"] == "at risk"
            else r["verdict"]) for r in loader_health(raw)]
    return lines + ["  health (lesson 09):"] + rows


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
        return ScriptDiagnosis(command, baseline, None, [], notes=_why_no_figures(
            baseline, argv, share * budget_s))
    bound = verdict(main.wait_fraction)
    result = ScriptDiagnosis(command, baseline, bound, [])
    if tries is None:
        tries = default_tries(main, baseline.cuda) if bound == "data-bound" else []
    if baseline.status == 0:
        left = (1 - share) * budget_s
        fit = min(len(tries), int(left // MIN_SLICE_S))
        for changes in tries[:fit]:
            say(f"diagnose: re-running with {change_label(changes)} for {left / fit:.1f} s ...",
                file=sys.stderr)
            result.fixes.append(run_script(target, argv, module=module, budget_s=left / fit,
                                           overrides={main.index: changes}, label=change_label(changes)))
        result.notes += [f"not tried: {'; '.join(map(change_label, tries[fit:]))} (the {left:.1f} s "
                         f"left for fixes fits {fit} run(s) of {MIN_SLICE_S:g} s or more; raise "
                         f"--budget)"] * bool(tries[fit:]) + [
            f"each run also spent {overhead_s:.1f} s starting Python and torch before its share of "
            f"--budget {budget_s:g} s began"]
    if bound == "data-bound":
        result.causes = likely_causes(main, baseline.cuda, [(r.changes, result.gain(r)) for r in result.fixes])
    return result


def _why_no_figures(run: ScriptRun, argv: list[str], seconds: float) -> list[str]:
    """Why no loader was measured and what to do, unless the run's last line says it."""
    if run.raised or run.end == OUT_OF_SCOPE:
        return []
    if run.end == USAGE_ERROR:
        ours = [" ".join(argv[k:k + 1 + (a in VALUED_OPTIONS)]) for k, a in enumerate(argv)
                if a.split("=")[0] in (*VALUED_OPTIONS, "--no-progress")]
        return [f"the script rejected its arguments (exit {run.status}; its usage message is on stderr)"
                + (f": {' '.join(ours)} went to the script" if ours else "") + "; everything "
                "after the script is the script's, so diagnose's options go before it: python -m "
                "course_utils diagnose --budget 60 train.py [ARGS]"]
    if run.end in BUDGET_ENDS:
        return [f"no loader had {MIN_TIMED_BATCHES} timed batches within {seconds:.0f} s ({run.end}); "
                f"run it for longer with --budget, or check that it reaches its loop"]
    return [f"{run.end} after {run.batches()}" + (f" (exit status {run.status})" if run.status else
            f": give it more data or epochs (its own arguments) so that a loader has "
            f"{MIN_TIMED_BATCHES} timed after its warm-up")]
