"""The tuner's side by side (lesson 06): DataLoader defaults, the common recipe and the tuned
setting measured like the search (the same windows, consumer and score), one window per row per
round, rounds interleaved: the recommendation is the winner of one run on one machine."""
from __future__ import annotations

import gc
from contextlib import nullcontext
from typing import Any, Callable

from torch.utils.data import DataLoader

from course_utils.config import pick
from course_utils.data import CommonRecipeTransform
from course_utils.measurement import Comparison, Measurement, compare
from course_utils.pipelines import (TransformedDataset, common_recipe_loader,
                                    recipe_process_settings)

from .result import DEFAULTS_LABEL, RECIPE_LABEL, TUNED_LABEL, LoaderSettings
from .window import Timed, measure_window, pooled, rebuilt

__all__ = ["SideBySide"]


class SideBySide:
    """The rows (module docstring) over the search's pipeline ``pipe``; a note goes to ``notes``
    when the common recipe cannot run on it."""

    def __init__(self, pipe: Any, tuned: LoaderSettings, batch_size: int,
                 notes: list[str]) -> None:
        self.entries: list[tuple[str, DataLoader, Callable[[], Any]]] = []
        if pipe.base is not None:
            recipe = common_recipe_loader(pipe.base, batch_size=batch_size, size=pipe.size)
            defaults = DataLoader(TransformedDataset(pipe.base, CommonRecipeTransform(pipe.size)),
                                  batch_size=batch_size, shuffle=True)
            self.entries += [(DEFAULTS_LABEL, defaults, nullcontext),
                             (RECIPE_LABEL, recipe, recipe_process_settings)]
        else:
            self.entries.append((DEFAULTS_LABEL, DataLoader(pipe.dataset, batch_size=batch_size,
                                                            shuffle=True), nullcontext))
            notes.append("the common recipe needs images as HxWx3 uint8 arrays (a JpegDataset "
                         "or ImageFolderDataset without a transform); compared with defaults only")
        tuned_loader = DataLoader(pipe.dataset, collate_fn=pipe.collate_fn, **tuned.loader_kwargs())
        self.entries.append((TUNED_LABEL, tuned_loader, nullcontext))
        self.settings = {label: LoaderSettings.of(loader) for label, loader, _ in self.entries}
        self.settings[TUNED_LABEL] = tuned
        self.runs: dict[str, list[tuple[Measurement, float]]] = {k: [] for k in self.settings}

    def measure(self, search: Any, min_batches: int) -> None:
        """Round 1 times ``min_batches`` batches per row (and its rate); later rounds give every
        row a window of the same seconds, sized to fit the rounds (two at least) in what is left
        of ``search``'s budget."""
        rounds, t0 = pick(full=4, quick=3), search.elapsed()
        left_s = max(0.0, search.budget_s - t0)
        timed: dict[str, Timed] = {}
        try:
            timed.update((label, Timed(rebuilt(loader), search.device, search.consumer))
                         for label, loader, _ in self.entries)
            for r in range(rounds):
                window_s = 0.0
                if r:
                    spent_per_round = (search.elapsed() - t0) / r   # warm-ups, start-ups
                    if r >= 2 and left_s - (search.elapsed() - t0) < spent_per_round:
                        break
                    window_s = max(0.0, (left_s - (search.elapsed() - t0)) / (rounds - r)
                                   - spent_per_round) / len(self.entries)
                for label, _, context in self.entries:
                    t, parts = timed[label], self.runs[label]
                    rate = pooled(parts, label)[0].samples_per_s if parts else 0.0
                    batches = max(min_batches, round(window_s * rate / t.batch_size))
                    with context():
                        parts.append(measure_window(t, batches, label))
                    search.tick(f"side by side, round {r + 1}: {label}")
        finally:
            for t in timed.values():
                t.close()
            gc.collect()

    def summary(self) -> tuple[Comparison, dict[str, float]] | None:
        """(the rows' pooled windows, their median start-ups in seconds); None until every row
        has a window."""
        if not all(self.runs.values()):
            return None
        rows = {label: pooled(parts, label) for label, parts in self.runs.items()}
        return (compare([m for m, _ in rows.values()],
                        baseline=RECIPE_LABEL if RECIPE_LABEL in rows else 0),
                {label: startup for label, (_, startup) in rows.items()})
