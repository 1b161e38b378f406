"""Learner-style training scripts (argparse, ``main()``) that ``python -m course_utils diagnose``
runs unchanged (lesson 08, exercise 08, the GPU check, tests)."""
