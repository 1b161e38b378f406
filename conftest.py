"""pytest hooks for this repository's own suite (``make test``).

Each stage of ``make test`` runs in three pytest processes (``-n 3 --dist loadscope``): each
notebook and each test file goes whole to one process, in collection order
(``--no-loadscope-reorder``: pytest-xdist would otherwise put the scopes with the most tests
first, and a 5-test file that takes 45 s last). A long scope near the end leaves the other
process idle until it ends, so the longest lessons and test files go to the front. The order
within a scope is unchanged.
"""
from __future__ import annotations

#: test id prefixes of the longest scopes, longest first; everything else follows in its own order.
#: ``make test`` runs the lessons (tests/test_rerun.py, each run twice) in a stage of their own,
#: ordered by CPU-seconds of one quick pass on 2 cores (2026-12-06: 07 49, 05 46, 02 44, 08 39,
#: 06 30, 03 26, 01 20, 00 14, 04 11, 09 10: most of 09's 35 s of wall time is spent waiting on
#: purpose, for timeouts and dead workers); then the quick suite's longest test files (its --durations).
_RERUN = "tests/test_rerun.py::TestLesson"
LONGEST_FIRST = (*(f"{_RERUN}{n}" for n in ("07", "05", "02", "08", "06", "03", "01", "00", "04", "09")),
                 "tests/test_notebooks.py", "tests/test_diagnose_script.py",
                 "tests/test_diagnose_cli.py", "tests/test_tuning.py", "tests/test_ddp.py",
                 "tests/test_site.py", "tests/test_diagnose.py", "solutions/")


def scope_rank(nodeid: str) -> int:
    """Where a test id's scope goes: its place in LONGEST_FIRST, or after all of them."""
    return next((i for i, prefix in enumerate(LONGEST_FIRST) if nodeid.startswith(prefix)),
                len(LONGEST_FIRST))


def pytest_collection_modifyitems(session, config, items) -> None:  # noqa: D103 - pytest hook
    items.sort(key=lambda item: scope_rank(item.nodeid))      # stable: each scope keeps its order
