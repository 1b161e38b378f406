"""Force the default multiprocessing start method of every Python process of a test run.

Used by ``make test START_METHOD=forkserver`` (or ``spawn``/``fork``): the Makefile puts this
folder on ``PYTHONPATH`` and sets ``COURSE_FORCE_START_METHOD``, so pytest, every notebook
kernel, every torchrun rank and every helper subprocess starts with that default — as on
Python >= 3.14 on Linux (forkserver) or on macOS and Windows (spawn). Nothing in the course
reads the variable: the course sees an ordinary default start method. Not a learner tool.
"""
import os

_METHOD = os.environ.get("COURSE_FORCE_START_METHOD", "").strip()
if _METHOD:
    import multiprocessing

    if _METHOD not in multiprocessing.get_all_start_methods():
        raise SystemExit(f"COURSE_FORCE_START_METHOD={_METHOD!r} is not a start method on this "
                         f"platform; use one of {multiprocessing.get_all_start_methods()}.")
    multiprocessing.set_start_method(_METHOD, force=True)
