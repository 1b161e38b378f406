"""pytest hooks for this repository's own suite (``make test``).

The suite runs in three pytest processes (``-n 3 --dist loadscope``): each notebook and each test
file goes whole to one process, in collection order (``--no-loadscope-reorder``: pytest-xdist would
otherwise put the scopes with the most tests first, and a 5-test file that takes 45 s last). A
long scope near the end leaves the other process idle until it ends, so the longest lessons and
test files go to the front. The order within a scope is unchanged.
"""
from __future__ import annotations

#: path prefixes of the longest scopes, longest first (quick mode on 2 cores, make suite-cpu,
#: 2026-12-03: 63 s for lesson 07 down to ~25 s for test_ddp); everything else follows
#: in its own order
LONGEST_FIRST = ("notebooks/07_", "notebooks/05_", "notebooks/02_", "tests/test_notebooks.py",
                 "tests/test_tuning.py", "tests/test_site.py", "tests/test_diagnose_script.py",
                 "tests/test_diagnose_cli.py", "notebooks/03_", "notebooks/08_", "tests/test_ddp.py",
                 "notebooks/", "solutions/")


def scope_rank(nodeid: str) -> int:
    """Where a test id's scope goes: its place in LONGEST_FIRST, or after all of them."""
    path = nodeid.split("::", 1)[0]
    return next((i for i, prefix in enumerate(LONGEST_FIRST) if path.startswith(prefix)),
                len(LONGEST_FIRST))


def pytest_collection_modifyitems(session, config, items) -> None:  # noqa: D103 - pytest hook
    items.sort(key=lambda item: scope_rank(item.nodeid))      # stable: each scope keeps its order
