"""Re-running works: every lesson runs top to bottom in quick mode in one kernel, then every code
cell runs a second time, in order, in the same kernel, as a learner who goes back and re-runs
cells does; any error fails, and so does a traceback printed by a cell that did not fail (a
DataLoader worker's, under spawn or forkserver: ``make test START_METHOD=spawn``). This is the lessons' execution in ``make test`` (nbval runs the
solutions; ``make core-paths`` runs each core path alone)."""
from __future__ import annotations

import pytest

from _helpers import ROOT

pytest.importorskip("nbclient")
from course_authoring.core_path_runner import run_core_path  # noqa: E402

LESSONS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def _lesson_class(path):
    """One class per lesson: ``make test`` spreads tests over its processes by module and class
    (``--dist loadscope``), so each lesson runs beside the others, not all in one process."""
    class Lesson:
        @pytest.mark.timeout(1200)
        def test_every_cell_runs_again_after_the_whole_lesson_ran(self):
            run = run_core_path(path, passes=2, deep_dives=True)
            code_cells = sum(1 for c in run.executed.cells if c.cell_type == "code")
            assert run.error is None, f"{path.name}: {run.error}"
            assert run.cells_run == 2 * code_cells
            printed = [k for k, cell in enumerate(run.executed.cells) if cell.cell_type == "code"
                       for out in cell.get("outputs", []) if "Traceback (most recent call last)"
                       in out.get("text", "") + str(out.get("data", {}).get("text/plain", ""))]
            assert not printed, f"{path.name}: cells {sorted(set(printed))} printed a traceback"

    Lesson.__name__ = Lesson.__qualname__ = f"TestLesson{path.name[:2]}"
    return Lesson


for _path in LESSONS:
    globals()[f"TestLesson{_path.name[:2]}"] = _lesson_class(_path)


def test_passes_are_one_or_two():
    with pytest.raises(ValueError, match="passes must be 1 or 2"):
        run_core_path(LESSONS[0], passes=3)
