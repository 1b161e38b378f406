"""What the tuner (lesson 06) returns: :class:`LoaderSettings`, one :class:`Trial` per setting
tried, the run (:class:`TuningResult`), or :class:`TuningInterrupted` on Ctrl-C.

Kept raw: each setting's windows and start-up (:class:`Trial`); derived: :func:`epoch_score`
(samples/s over one epoch, start-up included), the samples/s of the :func:`epoch_row` rows that
the core's :class:`~course_utils.measurement.Comparison` and ``plot_measurements`` show."""
from __future__ import annotations

import dataclasses
import textwrap
from dataclasses import dataclass, field
from typing import Any

from course_utils.checks import check_int
from course_utils.config import QUICK_STAMP, quick_mode
from course_utils.measurement import Comparison, Measurement, compare, fmt_time, jsonable
from course_utils.plots import figure_title, plot_measurements
from course_utils.threads import WorkerThreadLimiter, make_worker_init

__all__ = ["LoaderSettings", "Trial", "TuningResult", "TuningInterrupted", "epoch_score", "epoch_row"]

#: the labels of the side-by-side comparison's rows
TUNED_LABEL = "tuned"
RECIPE_LABEL = "common recipe"
DEFAULTS_LABEL = "defaults"


def epoch_score(samples_per_s: float, startup_s: float, batch_size: int, epoch_samples: int) -> float:
    """Samples per second over one epoch of ``epoch_samples`` samples,
    ``epoch_samples / (startup_s + (epoch_samples - batch_size) / samples_per_s)``: the steady rate
    with the consumer in the loop, plus the seconds to the first batch (persistent workers: their restart)."""
    rest = max(0, epoch_samples - batch_size)
    return epoch_samples / (startup_s + rest / samples_per_s) if samples_per_s > 0 else 0.0


def epoch_row(label: str, m: Measurement, startup_s: float, batch_size: int,
              epoch_samples: int) -> Measurement:
    """``m`` as one epoch of ``epoch_samples`` samples lasting ``epoch_samples / score`` seconds
    (its samples/s is :func:`epoch_score`); everything else (CPU, memory, ...) is ``m``'s."""
    score = epoch_score(m.samples_per_s, startup_s, batch_size, epoch_samples)
    return dataclasses.replace(m, label=label, times_s=[epoch_samples / score],
                               items_per_repeat=epoch_samples)


@dataclass(frozen=True)
class LoaderSettings:
    """The DataLoader settings of a trial. ``prefetch_factor`` is None without workers (DataLoader
    refuses it then); ``threads_per_worker`` goes to ``make_worker_init``, None: no
    ``worker_init_fn`` (the pools as the platform leaves them, like the common recipe)."""

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
        """A DataLoader's settings (``threads_per_worker`` read from a ``make_worker_init``
        worker_init_fn; None for any other)."""
        init, ctx, workers = loader.worker_init_fn, loader.multiprocessing_context, loader.num_workers
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
            kwargs.update(prefetch_factor=self.prefetch_factor, persistent_workers=self.persistent_workers)
            if self.threads_per_worker is not None:
                kwargs["worker_init_fn"] = make_worker_init(self.threads_per_worker)
            if self.multiprocessing_context:
                kwargs["multiprocessing_context"] = self.multiprocessing_context
        return kwargs

    def label(self) -> str:
        """``w=2 bs=64 pf=2 persistent thr=2 pin`` (``unlimited``: no worker_init_fn)."""
        n, threads = self.num_workers, self.threads_per_worker
        parts = [f"w={n}", f"bs={self.batch_size}"] + ([
            f"pf={self.prefetch_factor}", "persistent" if self.persistent_workers else "",
            "unlimited" if threads is None else f"thr={threads}" if threads != 1 else "",
            self.multiprocessing_context or ""] if n else []) + ["pin" if self.pin_memory else ""]
        return " ".join(p for p in parts if p)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> "LoaderSettings":
        return dataclasses.replace(self, **changes)

    def call_args(self, worker_init: str) -> list[str]:
        """:meth:`loader_kwargs` as code; ``worker_init`` is the expression for ``worker_init_fn``
        (``{n}``: the threads per worker)."""
        init = worker_init.format(n=self.threads_per_worker)
        return [f"{k}={init if k == 'worker_init_fn' else repr(v)}" for k, v in self.loader_kwargs().items()]


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


@dataclass
class Trial:
    """One setting tried. ``status``: "full" (probe and full window), "stopped after probe" or "failed:
    ..."; ``measurement``: its windows pooled (seconds per window, consumer included); ``startup_s``:
    median seconds to the first batch; ``score``: :func:`epoch_score`; ``seconds``: the trial's wall time."""

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
        """The steady samples/s (consumer included, start-up not)."""
        return None if self.measurement is None else self.measurement.samples_per_s

    @property
    def complete(self) -> bool:
        return self.status == "full"


@dataclass
class TuningResult:
    """What :func:`tune_loader` found. ``comparison``: the side by side's windows (defaults, the
    common recipe, ``"tuned"``: the search's ``best_trial``), ``startups`` their start-ups in
    seconds, ``candidates`` their settings. It decides: ``winner`` is its row with the best
    :attr:`scores`, ``best`` that row's settings and :meth:`code` the code for them."""

    best: LoaderSettings
    best_trial: Trial
    trials: list[Trial]
    not_tried: list[str]
    skipped: list[str]
    comparison: Comparison | None
    startups: dict[str, float]
    candidates: dict[str, LoaderSettings]
    budget_s: float
    elapsed_s: float
    search_s: float
    epoch_samples: int
    dataset: str
    consumer: str
    code_dataset: str = "dataset"
    code_imports: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    winner: str = TUNED_LABEL
    quick: bool = field(default_factory=quick_mode)     # measured in quick mode: printed rough

    def side_by_side_rows(self) -> Comparison | None:
        """The side by side as :func:`epoch_row` rows (samples/s per epoch), labelled with their
        settings and start-up; baseline: the common recipe (else the first row)."""
        if self.comparison is None:
            return None
        rows = [epoch_row(f"{m.label}: {self.candidates[m.label].label()}, start-up "
                          f"{fmt_time(self.startups[m.label])}"
                          + (" <- recommended" if m.label == self.winner else ""),
                          m, self.startups[m.label], self.candidates[m.label].batch_size,
                          self.epoch_samples) for m in self.comparison.rows]
        labels = [m.label for m in self.comparison.rows]
        return compare(rows, baseline=labels.index(RECIPE_LABEL) if RECIPE_LABEL in labels else 0)

    def _rows_by_label(self) -> dict[str, Measurement]:
        rows = self.side_by_side_rows()
        return {} if rows is None else dict(zip((m.label for m in self.comparison.rows), rows.rows))

    @property
    def scores(self) -> dict[str, float]:
        """Samples/s per epoch (:func:`epoch_score`) of each side-by-side row, by label."""
        return {label: row.samples_per_s for label, row in self._rows_by_label().items()}

    def ratio(self, other: str, metric: str = "samples_per_s") -> float:
        """The tuned row's ``metric`` over ``other``'s ("common recipe" or "defaults"), per epoch:
        "samples_per_s" (the score: what decides) or any other of the core's metrics."""
        rows = self._rows_by_label()
        if other not in rows:
            raise ValueError(f"other={other!r} is not a row of the side by side: {list(rows)} "
                             f"(none with compare_with_baselines=False, or after Ctrl-C).")
        tuned, base = rows[TUNED_LABEL].metric(metric), rows[other].metric(metric)
        return float("nan") if tuned is None or not base else tuned / base

    def trial_rows(self) -> Comparison:
        """Every measured trial as an :func:`epoch_row`, in the order tried (baseline: the first)."""
        return compare([epoch_row(f"{t.index}. {t.settings.label()}, start-up {fmt_time(t.startup_s)}"
                                  + ("" if t.complete else " (probe only)")
                                  + (" <- best of the search" if t is self.best_trial else ""),
                                  t.measurement, t.startup_s, t.settings.batch_size, self.epoch_samples)
                        for t in self.trials if t.measurement is not None])

    def table(self) -> str:
        """Every trial: the measured ones as a comparison table, then the failed ones."""
        failed = [f"{t.index}. {t.settings.label()}: {t.status}" for t in self.trials
                  if t.measurement is None]
        return "\n".join([str(self.trial_rows()), *failed])

    def verdict(self) -> str:
        """One sentence: what is recommended, and why (the side by side's winner)."""
        if self.comparison is None:
            return (f"Recommended: the search's best, {self.best.label()} -> "
                    f"{self.best_trial.score:,.0f} samples/s per epoch (no side by side).")
        scores = self.scores
        best = f"{self.best.label()} -> {scores[self.winner]:,.0f} samples/s per epoch"
        if self.winner == TUNED_LABEL:
            return f"Recommended: the tuned setting, {best}: it won the side by side."
        return (f"Recommended: the {self.winner} ({best}). It beat the tuned setting "
                f"({self.best_trial.settings.label()} -> {scores[TUNED_LABEL]:,.0f} samples/s per epoch) "
                f"side by side, so the tuner recommends it; the code below is the {self.winner}'s.")

    def __str__(self) -> str:
        lines = [f"Loader tuning: {len(self.trials)} trials in {self.search_s:.1f} s of search, "
                 f"{self.elapsed_s:.1f} s in all (budget {self.budget_s:g} s)",
                 f"data:     {self.dataset}", f"consumer: {self.consumer}",
                 f"samples/s below: over an epoch of {self.epoch_samples} samples with that "
                 f"consumer, start-up included (persistent workers: only their restart); probe "
                 f"only: stopped after a probe window clearly below the best", "", self.table()]
        if self.comparison is not None:
            lines += ["", "Side by side (the same score and consumer as the search, repeats "
                          "interleaved):", str(self.side_by_side_rows())]
            lines += [f"tuned vs {other}: {self.ratio(other):.2f}x samples/s per epoch, "
                      f"{self.ratio(other, 'cpu_s_per_sample'):.2f}x CPU-s/sample"
                      for other in (RECIPE_LABEL, DEFAULTS_LABEL) if other in self.candidates]
        lines += ["", "(quick mode) " * self.quick + self.verdict()]
        for title, items in (("Skipped:", self.skipped), ("Not tried (budget ran out):", self.not_tried)):
            if items:
                lines += ["", title] + [f"  - {s}" for s in items]
        lines += [f"note: {note}" for note in self.notes]
        return "\n".join([QUICK_STAMP] * self.quick + lines + ["", "Code to paste:", self.code()])

    def __repr__(self) -> str:
        return (f"TuningResult(best={self.best!r}, winner={self.winner!r}, "
                f"trials={len(self.trials)}, not_tried={len(self.not_tried)})")

    def code(self, dataset: str | None = None) -> str:
        """The code to paste for ``best``: :meth:`code_plain`, then :meth:`code_course`."""
        return "\n".join(["# Plain PyTorch (no course_utils needed):", self.code_plain(), "",
                          "# Or with course_utils (the pipeline as measured):", self.code_course(dataset)])

    def code_plain(self, dataset: str = "dataset") -> str:
        """``DataLoader(dataset, ...)`` with ``best``'s settings in plain torch, and the
        ``worker_init_fn`` written out when it limits threads (lesson 02 shows it)."""
        s = self.best
        lines = [f"# `{dataset}`: your map-style Dataset (measured on: "
                 f"{textwrap.shorten(self.dataset, 60, placeholder=' ...')})"]
        if s.num_workers and s.threads_per_worker is not None:
            n = s.threads_per_worker
            lines += ["import cv2", "import threadpoolctl", "import torch",
                      "from torch.utils.data import DataLoader", "", "",
                      "def worker_init_fn(worker_id):",
                      f'    """Every thread pool of this DataLoader worker at {n} '
                      f'thread{"s" if n > 1 else ""}, for its whole life."""',
                      f"    cv2.setNumThreads({0 if n == 1 else n})"
                      + ("                       # OpenCV: 0 = sequential" if n == 1 else ""),
                      f"    threadpoolctl.threadpool_limits(limits={n})   # BLAS/OpenMP pools (NumPy's)",
                      f"    torch.set_num_threads({n})", "", "",
                      "# under spawn/forkserver (macOS, Windows, Linux from Python 3.14) worker_init_fn must",
                      "# live in a module the workers can import, not in a notebook cell"]
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
        imports = ["from torch.utils.data import DataLoader", *self.code_imports]
        if not s.num_workers or s.threads_per_worker is None:   # no make_worker_init
            imports = [i.replace(", make_worker_init", "").replace("make_worker_init, ", "")
                       for i in imports if not i.endswith("import make_worker_init")]
        return "\n".join(imports + [""] + _call(dataset or self.code_dataset, args))

    def to_dict(self) -> dict:
        return jsonable({f.name: getattr(self, f.name) for f in dataclasses.fields(self)} | {
            "best_trial": self.best_trial.index, "scores": self.scores,
            "machine": self.best_trial.measurement.machine,
            "trials": [dataclasses.asdict(t) for t in self.trials],
            "code": self.code(), "code_plain": self.code_plain(), "code_course": self.code_course()})

    def plot(self) -> Any:
        """A matplotlib Figure: every trial's samples/s per epoch (left), the side by side's
        (right), through :func:`~course_utils.plots.plot_measurements`. Never calls ``plt.show()``."""
        import matplotlib.pyplot as plt  # lazy: kept out of `import course_utils` (workers)

        ncols = 2 if self.comparison is not None else 1
        fig, axes = plt.subplots(1, ncols, figsize=(8 * ncols, max(3.5, 1.5 + 0.4 * len(self.trials))),
                                 layout="constrained", squeeze=False)
        settings = {"best": self.best.label(), "winner": self.winner, "budget_s": f"{self.budget_s:g}",
                    "consumer": self.consumer[:40], "data": self.dataset[:60]}
        plot_measurements(self.trial_rows(), ax=axes[0][0], baseline=0, title=figure_title(
            f"Loader tuning: samples/s per epoch of {self.epoch_samples}, start-up included", settings))
        if self.comparison is not None:
            plot_measurements(self.side_by_side_rows(), ax=axes[0][1],
                              title="Side by side, repeats interleaved")
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
        if r.comparison is None:
            score, m = r.best_trial.score, r.best_trial.measurement
        else:
            score, m = r.scores[r.winner], r.comparison.row(r.winner)
        who = "" if r.winner == TUNED_LABEL else f"the {r.winner}, "
        return (f"{head} and {len(r.trials)} trial(s); best measured so far: {who}"
                f"{r.best.label()} -> {score:,.0f} samples/s per epoch of {r.epoch_samples} "
                f"({fmt_time(m.cpu_s_per_sample)} CPU per sample)")
