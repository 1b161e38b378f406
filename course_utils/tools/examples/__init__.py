"""Learner-style training scripts for ``python -m course_utils diagnose`` (lesson 08, tests).

Each module defines ``make_loop()`` returning ``(loader, step)``, as a learner's script would:
``python -m course_utils diagnose course_utils.tools.examples.data_bound:make_loop``.
"""
