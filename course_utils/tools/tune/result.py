"""What the tuner (lesson 06) returns: :class:`LoaderSettings`, one :class:`Trial` per setting
tried, the whole run (:class:`TuningResult`), or :class:`TuningInterrupted` on Ctrl-C. Every
figure is ranked by :func:`epoch_score`; the raw figures are kept, the rest is derived.
"""
from __future__ import annotations

import dataclasses
import math
import textwrap
from dataclasses import dataclass, field
from typing import Any

from course_utils.checks import check_int
from course_utils.measurement import Comparison, Measurement, jsonable
from course_utils.plots import figure_title
from course_utils.threads import WorkerThreadLimiter, make_worker_init

from .rules import (COMPARE_SHARE, LADDER_FALL_FRACTION, LADDER_FALLS, PROBE_FRACTION,
                    PROBE_THRESHOLD)

__all__ = ["LoaderSettings", "Trial", "TuningResult", "TuningInterrupted", "epoch_score"]

#: the labels of the side-by-side comparison's rows
TUNED_LABEL = "tuned"
RECIPE_LABEL = "common recipe"
DEFAULTS_LABEL = "defaults"

_STAGES = ("num_workers", "batch_size", "prefetch/persistent", "pin_memory/threads")


def epoch_score(samples_per_s: float, startup_s: float, batch_size: int,
                epoch_samples: int) -> float:
    """Samples per second over one epoch of ``epoch_samples`` samples:
    ``epoch_samples / (startup_s + (epoch_samples - batch_size) / samples_per_s)``, where
    ``samples_per_s`` is the steady rate measured with the consumer in the loop and
    ``startup_s`` the seconds one epoch pays before its first batch (for persistent workers:
    their restart). 0 when nothing was delivered."""
    rest = max(0, epoch_samples - batch_size)
    return epoch_samples / (startup_s + rest / samples_per_s) if samples_per_s > 0 else 0.0


# ---- settings ------------------------------------------------------------------------

@dataclass(frozen=True)
class LoaderSettings:
    """The DataLoader settings a trial uses (and the recommended ones).

    ``prefetch_factor`` is None when ``num_workers == 0`` (DataLoader refuses it then);
    ``threads_per_worker`` goes to ``make_worker_init``; None: no ``worker_init_fn`` at all (the
    pools as the platform leaves them, like the common recipe).
    """

    num_workers: int = 0
    batch_size: int = 64
    prefetch_factor: int | None = None
    persistent_workers: bool = False
    pin_memory: bool = False
    threads_per_worker: int | None = 1
    multiprocessing_context: str | None = None

    def __post_init__(self) -> None:
        for name, lo in (("num_workers", 0), ("batch_size", 1), ("threads_per_worker", 1)):
            check_int(name, getattr(self, name), lo, "LoaderSettings",
                      allow_none=name == "threads_per_worker")
        if self.num_workers == 0:
            if self.persistent_workers or self.multiprocessing_context:
                raise ValueError("LoaderSettings: persistent_workers and multiprocessing_context "
                                 "need num_workers >= 1.")
            object.__setattr__(self, "prefetch_factor", None)
        elif self.prefetch_factor is None:
            object.__setattr__(self, "prefetch_factor", 2)

    @classmethod
    def of(cls, loader: Any) -> "LoaderSettings":
        """The settings of a DataLoader (``threads_per_worker`` read from a
        :func:`~course_utils.make_worker_init` worker_init_fn; None for any other)."""
        init = getattr(loader, "worker_init_fn", None)
        ctx = getattr(loader, "multiprocessing_context", None)
        workers = loader.num_workers
        return cls(num_workers=workers, batch_size=loader.batch_size,
                   prefetch_factor=loader.prefetch_factor if workers else None,
                   persistent_workers=bool(workers and loader.persistent_workers),
                   pin_memory=bool(loader.pin_memory),
                   threads_per_worker=init.n_threads if isinstance(init, WorkerThreadLimiter)
                   else (None if workers else 1),
                   multiprocessing_context=None if ctx is None or not workers
                   else ctx if isinstance(ctx, str) else ctx.get_start_method())

    def loader_kwargs(self) -> dict:
        """Keyword arguments for ``DataLoader(dataset, **kwargs)`` (shuffle=True)."""
        kwargs: dict[str, Any] = {"batch_size": self.batch_size, "shuffle": True,
                                  "num_workers": self.num_workers, "pin_memory": self.pin_memory}
        if self.num_workers:
            kwargs.update(prefetch_factor=self.prefetch_factor,
                          persistent_workers=self.persistent_workers)
            if self.threads_per_worker is not None:
                kwargs["worker_init_fn"] = make_worker_init(self.threads_per_worker)
            if self.multiprocessing_context:
                kwargs["multiprocessing_context"] = self.multiprocessing_context
        return kwargs

    def label(self) -> str:
        """A short label: ``w=2 bs=64 pf=2 persistent thr=2 pin`` (``unlimited``: no
        worker_init_fn)."""
        parts = [f"w={self.num_workers}", f"bs={self.batch_size}"]
        if self.num_workers:
            parts.append(f"pf={self.prefetch_factor}")
            if self.persistent_workers:
                parts.append("persistent")
            if self.threads_per_worker is None:
                parts.append("unlimited")
            elif self.threads_per_worker != 1:
                parts.append(f"thr={self.threads_per_worker}")
            if self.multiprocessing_context:
                parts.append(self.multiprocessing_context)
        if self.pin_memory:
            parts.append("pin")
        return " ".join(parts)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> "LoaderSettings":
        """A copy with ``changes`` (prefetch_factor is reset to its default when workers go to 0)."""
        return dataclasses.replace(self, **changes)

    def call_args(self, worker_init: str) -> list[str]:
        """The DataLoader arguments after the dataset, as code; ``worker_init`` is the
        expression for ``worker_init_fn`` (``{n}`` stands for the threads per worker)."""
        args = [f"batch_size={self.batch_size}", "shuffle=True", f"num_workers={self.num_workers}"]
        if self.num_workers:
            args += [f"prefetch_factor={self.prefetch_factor}",
                     f"persistent_workers={self.persistent_workers}"]
        args.append(f"pin_memory={self.pin_memory}")
        if self.num_workers and self.threads_per_worker is not None:
            args.append(f"worker_init_fn={worker_init.format(n=self.threads_per_worker)}")
        if self.num_workers and self.multiprocessing_context:
            args.append(f"multiprocessing_context={self.multiprocessing_context!r}")
        return args


def _call(first: str, args: list[str], width: int = 96) -> list[str]:
    """``loader = DataLoader(first, args...)`` wrapped at ``width`` columns."""
    call, lines = "loader = DataLoader(", []
    current = call
    for i, a in enumerate([first] + args):
        piece = a + (", " if i < len(args) else ")")
        if len(current) + len(piece) > width and current.strip() != call.strip():
            lines.append(current.rstrip())
            current = " " * len(call)
        current += piece
    return lines + [current]


# ---- trials and the result -----------------------------------------------------------

@dataclass
class Trial:
    """One setting tried: its measurement and :func:`epoch_score` (samples/s per epoch).

    ``status``: ``"full"`` (probe + full window), ``"stopped after probe"`` or ``"failed: ..."``;
    ``startup_s``: the median seconds to the first batch; ``seconds``: the trial's wall time.
    """

    index: int
    stage: str
    settings: LoaderSettings
    status: str
    measurement: Measurement | None = None
    startup_s: float | None = None
    score: float | None = None
    seconds: float = 0.0

    @property
    def samples_per_s(self) -> float | None:
        return None if self.measurement is None else self.measurement.samples_per_s

    @property
    def cpu_s_per_sample(self) -> float | None:
        return None if self.measurement is None else self.measurement.cpu_s_per_sample

    @property
    def complete(self) -> bool:
        return self.status == "full"

    def to_dict(self) -> dict:
        return jsonable({"index": self.index, "stage": self.stage,
                          "settings": self.settings.to_dict(), "status": self.status,
                          "samples_per_s": self.samples_per_s,
                          "cpu_s_per_sample": self.cpu_s_per_sample,
                          "startup_s": self.startup_s, "score": self.score,
                          "seconds": self.seconds,
                          "measurement": None if self.measurement is None
                          else self.measurement.to_dict()})


def _fmt(x: float | None, digits: str = ",.0f") -> str:
    return "n/a" if x is None or not math.isfinite(x) else format(x, digits)


def _table(header: list[str], rows: list[list[str]], left: set[int]) -> str:
    widths = [max(len(r[c]) for r in [header] + rows) for c in range(len(header))]

    def line(r: list[str]) -> str:
        return "  ".join(r[c].ljust(widths[c]) if c in left else r[c].rjust(widths[c])
                         for c in range(len(r))).rstrip()

    rule = "  ".join(("-" if h else " ") * w for h, w in zip(header, widths)).rstrip()
    return "\n".join([line(header), rule] + [line(r) for r in rows])


@dataclass
class TuningResult:
    """What :func:`tune_loader` found: every trial and the side by side with the baselines.

    The side by side decides: ``winner`` is its row with the highest score (``"tuned"``,
    ``"common recipe"`` or ``"defaults"``), ``best`` that row's settings and :meth:`code` the
    code for it; ``best_trial`` is the search's best (the "tuned" row).
    """

    best: LoaderSettings
    best_trial: Trial
    trials: list[Trial]
    not_tried: list[str]
    skipped: list[str]
    comparison: Comparison | None
    budget_s: float
    elapsed_s: float
    search_s: float
    epoch_samples: int
    dataset: str
    machine: str
    code_dataset: str = "dataset"
    code_imports: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    thresholds: dict = field(default_factory=lambda: {
        "probe_fraction": PROBE_FRACTION, "probe_threshold": PROBE_THRESHOLD,
        "ladder_fall_fraction": LADDER_FALL_FRACTION, "ladder_falls": LADDER_FALLS,
        "compare_share": COMPARE_SHARE})
    winner: str = TUNED_LABEL
    scores: dict[str, float] = field(default_factory=dict)
    startups: dict[str, float] = field(default_factory=dict)
    candidates: dict[str, LoaderSettings] = field(default_factory=dict)
    consumer: str = "none: the loader alone"

    # -- ratios ----------------------------------------------------------------------
    def ratio(self, other: str, metric: str = "score") -> float:
        """``metric`` of the tuned row over that of ``other`` ("common recipe" or "defaults"):
        "score" (what decides), "samples_per_s" (steady) or "cpu_s_per_sample"."""
        if self.comparison is None:
            raise ValueError("no comparison was measured (compare_with_baselines=False, or the "
                             "run was interrupted).")
        if metric == "score":
            tuned, base = self.scores.get(TUNED_LABEL), self.scores.get(other)
            if base is None and other not in self.scores:
                raise ValueError(f"other={other!r} is not a row of the comparison: "
                                 f"{list(self.scores)}.")
        else:
            tuned = self.comparison.row(TUNED_LABEL).metric(metric)
            base = self.comparison.row(other).metric(metric)
        if tuned is None or base is None or base == 0:
            return math.nan
        return tuned / base

    @property
    def speedup_vs_recipe(self) -> float:
        """Tuned vs the common recipe, samples/s per epoch (the score)."""
        return self.ratio(RECIPE_LABEL)

    @property
    def speedup_vs_defaults(self) -> float:
        """Tuned vs DataLoader defaults, samples/s per epoch (the score)."""
        return self.ratio(DEFAULTS_LABEL)

    # -- text ------------------------------------------------------------------------
    def table(self) -> str:
        """Every trial, in the order tried."""
        header = ["#", "stage", "settings", "samples/s", "epoch samples/s", "CPU ms/sample",
                  "start-up s", "status"]
        rows = []
        for t in self.trials:
            mark = " <- best of the search" if t is self.best_trial else ""
            cpu = None if t.cpu_s_per_sample is None else t.cpu_s_per_sample * 1e3
            rows.append([str(t.index), t.stage, t.settings.label(), _fmt(t.samples_per_s),
                         _fmt(t.score), _fmt(cpu, ".3g"), _fmt(t.startup_s, ".2f"),
                         t.status + mark])
        return _table(header, rows, {0, 1, 2, 7})

    def side_by_side(self) -> str:
        """The comparison's rows: settings, score, steady samples/s, start-up, CPU."""
        if self.comparison is None:
            return "(no side-by-side comparison)"
        header = ["loader", "settings", "epoch samples/s", "samples/s", "start-up s",
                  "CPU ms/sample", ""]
        rows = []
        for m in self.comparison.rows:
            cpu = None if m.cpu_s_per_sample is None else m.cpu_s_per_sample * 1e3
            settings = self.candidates.get(m.label)
            rows.append([m.label, settings.label() if settings else "",
                         _fmt(self.scores.get(m.label)), _fmt(m.samples_per_s),
                         _fmt(self.startups.get(m.label), ".2f"), _fmt(cpu, ".3g"),
                         "<- recommended" if m.label == self.winner else ""])
        return _table(header, rows, {0, 1, 6})

    def verdict(self) -> str:
        """One sentence: what is recommended, and why (the side by side's winner)."""
        best = f"{self.best.label()} -> {_fmt(self.scores.get(self.winner))} samples/s per epoch"
        if self.comparison is None:
            return (f"Recommended: the search's best, {self.best.label()} -> "
                    f"{_fmt(self.best_trial.score)} samples/s per epoch (no side by side).")
        if self.winner == TUNED_LABEL:
            return f"Recommended: the tuned setting, {best}: it won the side by side."
        return (f"Recommended: the {self.winner} ({best}). It beat the tuned setting "
                f"({self.best_trial.settings.label()} -> {_fmt(self.scores.get(TUNED_LABEL))} "
                f"samples/s per epoch) side by side, so the tuner recommends it; the code below "
                f"is the {self.winner}'s.")

    def __str__(self) -> str:
        lines = [f"Loader tuning: {len(self.trials)} trials in {self.search_s:.1f} s of search, "
                 f"{self.elapsed_s:.1f} s in all (budget {self.budget_s:g} s)",
                 f"machine:  {self.machine}", f"data:     {self.dataset}",
                 f"consumer: {self.consumer}",
                 f"score:    samples/s over an epoch of {self.epoch_samples} samples with that "
                 f"consumer, start-up included (persistent workers: only their restart); "
                 f"probes below {PROBE_THRESHOLD:.0%} of the best were stopped early",
                 "", self.table(), "",
                 f"search's best: {self.best_trial.settings.label()} -> "
                 f"{_fmt(self.best_trial.score)} samples/s per epoch "
                 f"({_fmt(self.best_trial.samples_per_s)} steady)"]
        if self.comparison is not None:
            lines += ["", "Side by side (the same score and consumer as the search, repeats "
                          "interleaved):", self.side_by_side()]
            for other in (RECIPE_LABEL, DEFAULTS_LABEL):
                if other in self.scores:
                    lines.append(f"tuned vs {other}: {self.ratio(other):.2f}x samples/s per "
                                 f"epoch, {self.ratio(other, 'cpu_s_per_sample'):.2f}x "
                                 f"CPU-s/sample")
        lines += ["", self.verdict()]
        if self.skipped:
            lines += ["", "Skipped:"] + [f"  - {s}" for s in self.skipped]
        if self.not_tried:
            lines += ["", "Not tried (budget ran out):"] + [f"  - {s}" for s in self.not_tried]
        for note in self.notes:
            lines.append(f"note: {note}")
        lines += ["", "Code to paste:", self.code()]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"TuningResult(best={self.best!r}, winner={self.winner!r}, "
                f"trials={len(self.trials)}, not_tried={len(self.not_tried)})")

    def code(self, dataset: str | None = None) -> str:
        """The code to paste for ``best``: :meth:`code_plain`, then :meth:`code_course`."""
        return "\n".join(["# Plain PyTorch (no course_utils needed):", self.code_plain(), "",
                          "# Or with course_utils (the pipeline as measured):",
                          self.code_course(dataset)])

    def code_plain(self, dataset: str = "dataset") -> str:
        """``DataLoader(dataset, ...)`` with ``best``'s settings in plain torch, and the
        ``worker_init_fn`` written out when it limits threads (lesson 02 shows it)."""
        s = self.best
        lines = [f"# `{dataset}`: your map-style Dataset (measured on: "
                 f"{textwrap.shorten(self.dataset, 60, placeholder=' ...')})"]
        limit = s.num_workers and s.threads_per_worker is not None
        if limit:
            n = s.threads_per_worker
            lines += ["import cv2", "import threadpoolctl", "import torch",
                      "from torch.utils.data import DataLoader", "", "",
                      "def worker_init_fn(worker_id):",
                      f'    """Every thread pool of this DataLoader worker at {n} '
                      f'thread{"s" if n > 1 else ""}, for its whole life."""',
                      f"    cv2.setNumThreads({0 if n == 1 else n})"
                      + ("                       # OpenCV: 0 = sequential" if n == 1 else ""),
                      f"    threadpoolctl.threadpool_limits(limits={n})   # BLAS/OpenMP pools "
                      f"(NumPy's)", f"    torch.set_num_threads({n})", "", "",
                      "# under spawn/forkserver (macOS, Windows, Linux from Python 3.14) "
                      "worker_init_fn must", "# live in a module the workers can import, not "
                      "in a notebook cell"]
        else:
            lines += ["from torch.utils.data import DataLoader", ""]
        return "\n".join(lines + _call(dataset, s.call_args("worker_init_fn")))

    def code_course(self, dataset: str | None = None) -> str:
        """``best`` as code with the course's classes; ``dataset``: the expression for your
        dataset (default: what was measured, e.g. ``BatchedJpegDataset(dataset, size=224)``)."""
        s = self.best
        args = s.call_args("make_worker_init({n})")
        if self.code_dataset.startswith("BatchedJpegDataset") and dataset is None:
            args.insert(2, "collate_fn=keep_batch")
        imports = list(self.code_imports)
        if not s.num_workers or s.threads_per_worker is None:   # no make_worker_init
            imports = [i.replace(", make_worker_init", "").replace("make_worker_init, ", "")
                       for i in imports if not i.endswith("import make_worker_init")]
        return "\n".join(imports + [""] + _call(dataset or self.code_dataset, args))

    def to_dict(self) -> dict:
        return jsonable({
            "best": self.best.to_dict(), "winner": self.winner,
            "best_trial": self.best_trial.index,
            "trials": [t.to_dict() for t in self.trials], "not_tried": self.not_tried,
            "skipped": self.skipped, "notes": self.notes, "consumer": self.consumer,
            "comparison": None if self.comparison is None else self.comparison.to_dict(),
            "scores": self.scores, "startups": self.startups,
            "candidates": {k: v.to_dict() for k, v in self.candidates.items()},
            "ratios": None if self.comparison is None else {
                other: {"score": self.ratio(other),
                        "samples_per_s": self.ratio(other, "samples_per_s"),
                        "cpu_s_per_sample": self.ratio(other, "cpu_s_per_sample")}
                for other in (RECIPE_LABEL, DEFAULTS_LABEL) if other in self.scores},
            "budget_s": self.budget_s, "elapsed_s": self.elapsed_s, "search_s": self.search_s,
            "epoch_samples": self.epoch_samples, "dataset": self.dataset,
            "machine": self.machine, "thresholds": self.thresholds, "code": self.code(),
            "code_plain": self.code_plain(), "code_course": self.code_course()})

    # -- plot ------------------------------------------------------------------------
    def plot(self) -> Any:
        """A matplotlib Figure: every trial's score (left), the side by side's (right).
        Never calls ``plt.show()``."""
        import matplotlib.pyplot as plt  # lazy: kept out of `import course_utils` (workers)

        ncols = 2 if self.comparison is not None else 1
        fig, axes = plt.subplots(1, ncols, figsize=(13 if ncols == 2 else 8,
                                                    max(3.5, 1.5 + 0.28 * len(self.trials))),
                                 layout="constrained", squeeze=False)
        ax = axes[0][0]
        colors = dict(zip(_STAGES, ("tab:blue", "tab:orange", "tab:green", "tab:purple")))
        y = list(range(len(self.trials)))
        for i, t in enumerate(self.trials):
            value = t.score if t.score is not None else 0.0
            full = t.complete
            ax.barh(i, value, color=colors.get(t.stage, "tab:gray"),
                    alpha=1.0 if full else 0.35, hatch=None if full else "//",
                    edgecolor="black" if t is self.best_trial else None,
                    linewidth=2 if t is self.best_trial else 0)
            text = _fmt(t.score) + ("" if full else f"  ({t.status})")
            ax.text(value, i, " " + text, va="center", fontsize=8)
        ax.set_yticks(y, [f"{t.index}. {t.settings.label()}" for t in self.trials], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel(f"samples/s over an epoch of {self.epoch_samples}, start-up included")
        handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colors.values()]
        ax.legend(handles, list(colors), fontsize=7, loc="best", framealpha=0.6)
        scores = [t.score for t in self.trials if t.score is not None]
        ax.set_xlim(0, 1.35 * max(scores) if scores else 1.0)
        ax.set_title(f"{len(self.trials)} trials (hatched: stopped after the probe)",
                     fontsize=10, loc="left")
        if self.comparison is not None:
            ax = axes[0][1]
            labels = [m.label for m in self.comparison.rows]
            values = [self.scores.get(label, 0.0) for label in labels]
            for i, (label, value) in enumerate(zip(labels, values)):
                won = label == self.winner
                ax.barh(i, value, color="tab:green" if label == TUNED_LABEL else "tab:gray",
                        edgecolor="black" if won else None, linewidth=2 if won else 0)
                ax.text(value, i, f" {_fmt(value)}" + ("  recommended" if won else ""),
                        va="center", fontsize=8)
            ax.set_yticks(range(len(labels)), [f"{label}\n{self.candidates[label].label()}"
                                                if label in self.candidates else label
                                                for label in labels], fontsize=8)
            ax.invert_yaxis()
            ax.set_xlim(0, 1.35 * max(values + [1e-9]))
            ax.set_xlabel("samples/s per epoch (the search's score)")
            ax.set_title("Side by side, repeats interleaved", fontsize=10, loc="left")
        settings = {"best": self.best.label(), "winner": self.winner,
                    "budget_s": f"{self.budget_s:g}", "consumer": self.consumer[:40],
                    "data": self.dataset[:60]}
        fig.suptitle(figure_title("Loader tuning", settings), fontsize=10)
        return fig


class TuningInterrupted(KeyboardInterrupt):
    """Ctrl-C during :func:`tune_loader`: ``result`` is a :class:`TuningResult` of what was
    measured (None: no setting measured fully yet); every worker has been shut down."""

    def __init__(self, result: TuningResult | None, elapsed_s: float, stage: str) -> None:
        super().__init__(result, elapsed_s, stage)
        self.result, self.elapsed_s, self.stage = result, elapsed_s, stage

    def __str__(self) -> str:
        r = self.result
        head = f"interrupted during the {self.stage} after {self.elapsed_s:.1f} s"
        if r is None:
            return f"{head}, before any setting was measured fully; nothing to recommend."
        score = r.scores.get(r.winner, r.best_trial.score) if r.comparison else r.best_trial.score
        m = (r.comparison.row(r.winner) if r.comparison is not None else r.best_trial.measurement)
        cpu = None if m is None or m.cpu_s_per_sample is None else m.cpu_s_per_sample * 1e3
        who = "" if r.winner == TUNED_LABEL else f"the {r.winner}, "
        return (f"{head} and {len(r.trials)} trial(s); best measured so far: {who}"
                f"{r.best.label()} -> {_fmt(score)} samples/s per epoch of {r.epoch_samples} "
                f"({_fmt(None if m is None else m.samples_per_s)} steady, {_fmt(cpu, '.3g')} "
                f"CPU ms/sample)")
