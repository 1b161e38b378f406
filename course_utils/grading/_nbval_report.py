"""pytest plugin used by ``grade``: writes one JSON line per notebook cell outcome, with the
notebook's absolute path, so one run can grade several notebooks."""
from __future__ import annotations

import json
import os

_PATHS: dict[str, str] = {}          # nodeid -> absolute path of the notebook that holds it


def pytest_itemcollected(item):  # noqa: D103 - pytest hook
    _PATHS[item.nodeid] = os.path.realpath(str(item.path))


def pytest_runtest_logreport(report):  # noqa: D103 - pytest hook
    target = os.environ.get("COURSE_GRADE_REPORT")
    if not target or report.when != "call" and not (report.when == "setup" and report.failed):
        return
    with open(target, "a", encoding="utf-8") as fh:
        fh.write(json.dumps({"nodeid": report.nodeid, "path": _PATHS.get(report.nodeid, ""),
                             "outcome": report.outcome,
                             "longrepr": str(report.longrepr or "")}) + "\n")
