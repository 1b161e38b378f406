"""Learner-style training scripts for ``python -m course_utils diagnose`` (lesson 08, tests).

Each is an ordinary script (argparse, ``main()``, run with ``python data_bound.py``) that
``diagnose`` runs unchanged: ``python -m course_utils diagnose
course_utils/tools/examples/data_bound.py --epochs 50``. Each also defines ``make_loop()``
returning ``(loader, step)`` for ``diagnose course_utils.tools.examples.data_bound:make_loop``.
"""
