""""The common advice, checked": the table of claim | what was measured | verdict that ends each
lesson (the lesson computes figures and verdicts; :class:`AdviceTable` lays them out, as HTML in a
notebook and as text elsewhere), and :func:`reveal`, which answers a "Predict first" guess."""
from __future__ import annotations

import html
import textwrap

import numpy as np

from .config import QUICK_STAMP, quick_mode

__all__ = ["AdviceTable", "reveal", "verdict_word"]

#: Column widths of the text table (characters); longer cells wrap onto more lines.
WIDTHS = (30, 58, 14)
_HEADER = ("advice", "measured here", "verdict")


def verdict_word(held: bool | str | None) -> str:
    """``"held"`` (True), ``"did not hold"`` (False), ``"not measured"`` (None), or the lesson's
    own short word (a string, e.g. ``"a trade-off"``)."""
    if held is None:
        return "not measured"
    if isinstance(held, str) and held.strip():
        return held.strip()
    if not isinstance(held, (bool, np.bool_)):
        raise TypeError(f"held must be True, False, None (not measured) or a short verdict "
                        f"string, got {type(held).__name__} {held!r}; compare the figure with "
                        f"its threshold first.")
    return "held" if held else "did not hold"


class AdviceTable:
    """Rows of (claim, what was measured, verdict): ``add`` one per piece of advice, then show
    the table as a cell's last expression (or ``print`` it); one made in quick mode says so."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str]] = []
        self.quick = quick_mode()

    def add(self, claim: str, measured: str, held: bool | str | None) -> "AdviceTable":
        """Add a row; ``held`` is the lesson's computed verdict (:func:`verdict_word`)."""
        for name, value in (("claim", claim), ("measured", measured)):
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"AdviceTable.add: {name} must be a non-empty string, got "
                                 f"{value!r}.")
        self.rows.append((claim, measured, verdict_word(held)))
        return self

    def skipped(self, claim: str, where: str) -> "AdviceTable":
        """The row of a claim a skipped deep dive (``where``, e.g. ``"deep dive 4"``) measures."""
        if not isinstance(where, str) or not where.strip():
            raise ValueError(f"AdviceTable.skipped: where must name the deep dive that measures "
                             f"{claim!r}, got {where!r}.")
        return self.add(claim, f"{where.strip()} measures this; run it to check", None)

    def __str__(self) -> str:
        lines = [QUICK_STAMP] if self.quick else []
        for row in (_HEADER, *self.rows):
            cells = [textwrap.wrap(text, width) or [""] for text, width in zip(row, WIDTHS)]
            for k in range(max(len(c) for c in cells)):
                parts = [(c[k] if k < len(c) else "").ljust(w) for c, w in zip(cells, WIDTHS)]
                lines.append("  ".join(parts).rstrip())
            if row is _HEADER:
                lines.append("  ".join("-" * w for w in WIDTHS))
        return "\n".join(lines)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        cell = '<td style="text-align:left; vertical-align:top">{}</td>'
        body = "".join("<tr>" + "".join(cell.format(html.escape(x)) for x in row) + "</tr>"
                       for row in self.rows)
        head = "".join(f'<th style="text-align:left">{x}</th>' for x in _HEADER)
        caption = f"<caption>{QUICK_STAMP}</caption>" if self.quick else ""
        return f"<table>{caption}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def reveal(guess: object, measured: object, what: str) -> str | None:
    """Print and return the line answering a "Predict first" guess, when one was made."""
    if guess is None:
        return None
    line = f"your guess, {what}: {guess}; measured here: {measured}"
    print(line)
    return line
