""""The common advice, checked": a table of claim | what was measured | verdict.

Each lesson ends by checking the advice learners meet against what it just measured. The lesson
computes the figures and the verdicts; :class:`AdviceTable` only lays them out, as HTML in a
notebook and as a plain text table everywhere else.
"""
from __future__ import annotations

import html
import textwrap

import numpy as np

__all__ = ["AdviceTable", "reveal", "verdict_word"]

#: Column widths of the text table (characters); longer cells wrap onto more lines.
WIDTHS = (30, 58, 14)


def verdict_word(held: bool | str | None) -> str:
    """``"held"`` (True), ``"did not hold"`` (False), ``"not measured"`` (None: nothing here
    could check it), or the lesson's own short word (a string, e.g. ``"a trade-off"``)."""
    if held is None:
        return "not measured"
    if isinstance(held, str):
        if not held.strip():
            raise ValueError("held must be True, False, None or a short verdict of your own; got "
                             "an empty string.")
        return held.strip()
    if not isinstance(held, (bool, np.bool_)):
        raise TypeError(f"held must be True, False, None (not measured) or a short verdict "
                        f"string, got {type(held).__name__} {held!r}; compare the figure with "
                        f"its threshold first.")
    return "held" if held else "did not hold"


class AdviceTable:
    """Rows of (claim, what was measured, verdict); ``add`` one per piece of advice, then show
    the table as a cell's last expression (or ``print`` it)."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str]] = []

    def add(self, claim: str, measured: str, held: bool | str | None) -> "AdviceTable":
        """Add a row; ``held`` is the lesson's computed verdict (:func:`verdict_word`)."""
        for name, value in (("claim", claim), ("measured", measured)):
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"AdviceTable.add: {name} must be a non-empty string, got "
                                 f"{value!r}.")
        self.rows.append((claim, measured, verdict_word(held)))
        return self

    def skipped(self, claim: str, where: str) -> "AdviceTable":
        """Add the row of a claim that a skipped deep dive measures: "not measured", and where
        to measure it (``where`` names the deep dive, e.g. ``"deep dive 4"``)."""
        if not isinstance(where, str) or not where.strip():
            raise ValueError(f"AdviceTable.skipped: where must name the deep dive that measures "
                             f"{claim!r}, got {where!r}.")
        return self.add(claim, f"{where.strip()} measures this; run it to check", None)

    def verdict(self, claim: str) -> str:
        """The verdict recorded for ``claim`` (KeyError, naming the claims, if there is none)."""
        for row in self.rows:
            if row[0] == claim:
                return row[2]
        raise KeyError(f"no row for {claim!r}; the claims are {[r[0] for r in self.rows]}.")

    def __str__(self) -> str:
        header = ("advice", "measured here", "verdict")
        lines = []
        for row in (header, *self.rows):
            cells = [textwrap.wrap(text, width) or [""] for text, width in zip(row, WIDTHS)]
            for k in range(max(len(c) for c in cells)):
                parts = [(c[k] if k < len(c) else "").ljust(w) for c, w in zip(cells, WIDTHS)]
                lines.append("  ".join(parts).rstrip())
            if row is header:
                lines.append("  ".join("-" * w for w in WIDTHS))
        return "\n".join(lines)

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        cell = '<td style="text-align:left; vertical-align:top">{}</td>'
        body = "".join("<tr>" + "".join(cell.format(html.escape(x)) for x in row) + "</tr>"
                       for row in self.rows)
        head = "".join(f'<th style="text-align:left">{x}</th>'
                       for x in ("advice", "measured here", "verdict"))
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def reveal(guess: object, measured: object, what: str) -> str | None:
    """The line answering a "Predict first" guess right after its measurement: printed, and
    returned, only when the learner made the guess (``guess`` is not None)."""
    if guess is None:
        return None
    line = f"your guess, {what}: {guess}; measured here: {measured}"
    print(line)
    return line
