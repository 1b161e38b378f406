"""What the tuner (lesson 06) returns: the settings of one DataLoader (:class:`LoaderSettings`),
one measured trial (:class:`Trial`), and the whole run (:class:`TuningResult`: the best settings,
every trial, the side-by-side comparison, a plot, the code to paste, JSON). Like
``torch.utils.benchmark``'s result objects: the raw figures are kept, the rest is derived.
Nothing happens at import time.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass, field
from typing import Any

from .bench import Comparison, Measurement, _jsonable
from .threads import make_worker_init

__all__ = ["LoaderSettings", "Trial", "TuningResult", "PROBE_FRACTION", "PROBE_THRESHOLD",
           "LADDER_FALL_FRACTION", "LADDER_FALLS", "COMPARE_SHARE"]

#: a probe window is this fraction of a full trial window
PROBE_FRACTION = 0.25
#: a probe whose score is below this fraction of the best score so far is not timed fully
PROBE_THRESHOLD = 0.8
#: a ladder rung "falls" when its score is below this fraction of the best rung so far
LADDER_FALL_FRACTION = 0.95
#: the num_workers ladder stops after this many falling rungs in a row (batch size: after one)
LADDER_FALLS = 2
#: share of the budget kept for the final side-by-side comparison
COMPARE_SHARE = 0.25

#: the labels of the side-by-side comparison's rows
TUNED_LABEL = "tuned"
RECIPE_LABEL = "common recipe"
DEFAULTS_LABEL = "defaults"

_STAGES = ("num_workers", "batch_size", "prefetch/persistent", "pin_memory/threads")


# --------------------------------------------------------------------------------------
# settings
# --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LoaderSettings:
    """The DataLoader settings a trial uses (and the best ones found).

    ``prefetch_factor`` is None when ``num_workers == 0`` (DataLoader refuses it then);
    ``threads_per_worker`` goes to ``worker_init_fn=make_worker_init(threads_per_worker)``;
    ``multiprocessing_context`` is None (the platform's default) or a start method name.
    """

    num_workers: int = 0
    batch_size: int = 64
    prefetch_factor: int | None = None
    persistent_workers: bool = False
    pin_memory: bool = False
    threads_per_worker: int = 1
    multiprocessing_context: str | None = None

    def __post_init__(self) -> None:
        for name, lo in (("num_workers", 0), ("batch_size", 1), ("threads_per_worker", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < lo:
                raise ValueError(f"LoaderSettings: {name} must be an int >= {lo}, got {value!r}.")
        if self.num_workers == 0:
            if self.persistent_workers or self.multiprocessing_context:
                raise ValueError("LoaderSettings: persistent_workers and multiprocessing_context "
                                 "need num_workers >= 1.")
            object.__setattr__(self, "prefetch_factor", None)
        elif self.prefetch_factor is None:
            object.__setattr__(self, "prefetch_factor", 2)

    def loader_kwargs(self) -> dict:
        """Keyword arguments for ``DataLoader(dataset, **kwargs)`` (shuffle=True)."""
        kwargs: dict[str, Any] = {"batch_size": self.batch_size, "shuffle": True,
                                  "num_workers": self.num_workers, "pin_memory": self.pin_memory}
        if self.num_workers:
            kwargs.update(prefetch_factor=self.prefetch_factor,
                          persistent_workers=self.persistent_workers,
                          worker_init_fn=make_worker_init(self.threads_per_worker))
            if self.multiprocessing_context:
                kwargs["multiprocessing_context"] = self.multiprocessing_context
        return kwargs

    def label(self) -> str:
        """A short label: ``w=2 bs=64 pf=2 persistent pin thr=1``."""
        parts = [f"w={self.num_workers}", f"bs={self.batch_size}"]
        if self.num_workers:
            parts.append(f"pf={self.prefetch_factor}")
            if self.persistent_workers:
                parts.append("persistent")
            if self.threads_per_worker != 1:
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


# --------------------------------------------------------------------------------------
# trials and the result
# --------------------------------------------------------------------------------------

@dataclass
class Trial:
    """One setting tried: its measurement (or why it has none) and its score.

    ``status``: ``"full"`` (probe + full window), ``"stopped after probe"`` (early stopping),
    or ``"failed: ..."``. ``score`` is samples/s over one epoch, start-up included (see the
    module docstring); ``startup_s`` the seconds from ``iter(loader)`` to the first batch;
    ``seconds`` the wall time the trial took.
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
        return _jsonable({"index": self.index, "stage": self.stage,
                          "settings": self.settings.to_dict(), "status": self.status,
                          "samples_per_s": self.samples_per_s,
                          "cpu_s_per_sample": self.cpu_s_per_sample,
                          "startup_s": self.startup_s, "score": self.score,
                          "seconds": self.seconds,
                          "measurement": None if self.measurement is None
                          else self.measurement.to_dict()})


def _fmt(x: float | None, digits: str = ",.0f") -> str:
    return "n/a" if x is None or not math.isfinite(x) else format(x, digits)


@dataclass
class TuningResult:
    """What :func:`tune_loader` found: ``best`` settings, every trial, what was not tried, and
    the side-by-side comparison with the common recipe and DataLoader defaults.

    ``print(result)`` gives the report; :meth:`table` the trials; :meth:`plot` a figure;
    :meth:`code` the DataLoader call to paste; :meth:`to_dict` JSON-ready data.
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

    # -- ratios ----------------------------------------------------------------------
    def ratio(self, other: str, metric: str = "samples_per_s") -> float:
        """``metric`` of the tuned loader divided by that of ``other`` ("common recipe" or
        "defaults"), from the side-by-side comparison (e.g. 2.0: tuned is twice as fast)."""
        if self.comparison is None:
            raise ValueError("no comparison was measured (compare=False, or no budget left).")
        tuned = self.comparison.row(TUNED_LABEL).metric(metric)
        base = self.comparison.row(other).metric(metric)
        if tuned is None or base is None or base == 0:
            return math.nan
        return tuned / base

    @property
    def speedup_vs_recipe(self) -> float:
        return self.ratio(RECIPE_LABEL)

    @property
    def speedup_vs_defaults(self) -> float:
        return self.ratio(DEFAULTS_LABEL)

    # -- text ------------------------------------------------------------------------
    def table(self) -> str:
        """Every trial, in the order tried."""
        header = ["#", "stage", "settings", "samples/s", "epoch samples/s", "CPU ms/sample",
                  "start-up s", "status"]
        rows = []
        for t in self.trials:
            mark = " <- best" if t is self.best_trial else ""
            cpu = None if t.cpu_s_per_sample is None else t.cpu_s_per_sample * 1e3
            rows.append([str(t.index), t.stage, t.settings.label(), _fmt(t.samples_per_s),
                         _fmt(t.score), _fmt(cpu, ".3g"), _fmt(t.startup_s, ".2f"),
                         t.status + mark])
        widths = [max(len(r[c]) for r in [header] + rows) for c in range(len(header))]
        left = {0, 1, 2, 7}

        def line(r: list[str]) -> str:
            return "  ".join(r[c].ljust(widths[c]) if c in left else r[c].rjust(widths[c])
                             for c in range(len(r))).rstrip()

        return "\n".join([line(header), "  ".join("-" * w for w in widths)]
                         + [line(r) for r in rows])

    def __str__(self) -> str:
        lines = [f"Loader tuning: {len(self.trials)} trials in {self.search_s:.1f} s of search, "
                 f"{self.elapsed_s:.1f} s in all (budget {self.budget_s:g} s)",
                 f"machine: {self.machine}", f"data:    {self.dataset}",
                 f"score:   samples/s over an epoch of {self.epoch_samples} samples, start-up "
                 f"included; probes below {PROBE_THRESHOLD:.0%} of the best were stopped early",
                 "", self.table(), "",
                 f"best: {self.best.label()} -> {_fmt(self.best_trial.score)} samples/s per epoch "
                 f"({_fmt(self.best_trial.samples_per_s)} steady)"]
        if self.comparison is not None:
            lines += ["", "Measured side by side (repeats interleaved):", str(self.comparison)]
            for other in (RECIPE_LABEL, DEFAULTS_LABEL):
                if other in [m.label for m in self.comparison.rows]:
                    lines.append(f"tuned vs {other}: {self.ratio(other):.2f}x samples/s, "
                                 f"{self.ratio(other, 'cpu_s_per_sample'):.2f}x CPU-s/sample")
        if self.skipped:
            lines += ["", "Skipped:"] + [f"  - {s}" for s in self.skipped]
        if self.not_tried:
            lines += ["", "Not tried (budget ran out):"] + [f"  - {s}" for s in self.not_tried]
        for note in self.notes:
            lines.append(f"note: {note}")
        lines += ["", "Code to paste:", self.code()]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"TuningResult(best={self.best!r}, trials={len(self.trials)}, "
                f"not_tried={len(self.not_tried)})")

    def code(self, dataset: str | None = None) -> str:
        """The imports and the ``DataLoader(...)`` call with the best settings, ready to paste.

        ``dataset``: the expression for your dataset in the pasted code (default: what was
        tuned, e.g. ``BatchedJpegDataset(dataset, size=224)``).
        """
        s = self.best
        args = [dataset or self.code_dataset, f"batch_size={s.batch_size}", "shuffle=True"]
        if self.code_dataset.startswith("BatchedJpegDataset") and dataset is None:
            args.append("collate_fn=keep_batch")
        args.append(f"num_workers={s.num_workers}")
        if s.num_workers:
            args += [f"prefetch_factor={s.prefetch_factor}",
                     f"persistent_workers={s.persistent_workers}"]
        args.append(f"pin_memory={s.pin_memory}")
        if s.num_workers:
            args.append(f"worker_init_fn=make_worker_init({s.threads_per_worker})")
            if s.multiprocessing_context:
                args.append(f"multiprocessing_context={s.multiprocessing_context!r}")
        call, width, lines = "loader = DataLoader(", 96, []
        current = call
        for i, a in enumerate(args):
            piece = a + (", " if i < len(args) - 1 else ")")
            if len(current) + len(piece) > width and current.strip() != call.strip():
                lines.append(current.rstrip())
                current = " " * len(call)
            current += piece
        lines.append(current)
        return "\n".join(self.code_imports + [""] + lines)

    def to_dict(self) -> dict:
        return _jsonable({
            "best": self.best.to_dict(), "best_trial": self.best_trial.index,
            "trials": [t.to_dict() for t in self.trials], "not_tried": self.not_tried,
            "skipped": self.skipped, "notes": self.notes,
            "comparison": None if self.comparison is None else self.comparison.to_dict(),
            "ratios": None if self.comparison is None else {
                other: {"samples_per_s": self.ratio(other),
                        "cpu_s_per_sample": self.ratio(other, "cpu_s_per_sample")}
                for other in (RECIPE_LABEL, DEFAULTS_LABEL)
                if other in [m.label for m in self.comparison.rows]},
            "budget_s": self.budget_s, "elapsed_s": self.elapsed_s, "search_s": self.search_s,
            "epoch_samples": self.epoch_samples, "dataset": self.dataset,
            "machine": self.machine, "thresholds": self.thresholds, "code": self.code()})

    # -- plot ------------------------------------------------------------------------
    def plot(self) -> Any:
        """A matplotlib Figure: every trial's score (left), the comparison (right); machine and
        best settings in the title. Never calls ``plt.show()``."""
        import matplotlib.pyplot as plt

        from .plots import figure_title, plot_measurements

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
            plot_measurements(self.comparison.rows, ax=axes[0][1],
                              baseline=self.comparison.baseline,
                              title="Side by side, repeats interleaved")
        settings = {"best": self.best.label(), "budget_s": f"{self.budget_s:g}",
                    "data": self.dataset[:60]}
        fig.suptitle(figure_title("Loader tuning", settings), fontsize=10)
        return fig
