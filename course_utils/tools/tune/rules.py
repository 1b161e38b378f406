"""The tuner's search rules: when a probe stops, when a ladder stops, and the budget's share for
the side-by-side comparison (the search applies them; the result reports them)."""
from __future__ import annotations

__all__ = ["PROBE_FRACTION", "PROBE_THRESHOLD", "LADDER_FALL_FRACTION", "LADDER_FALLS",
           "COMPARE_SHARE"]

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
