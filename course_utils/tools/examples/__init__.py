"""Learner-style training scripts (argparse, ``main()``) that ``python -m course_utils diagnose``
runs unchanged (lesson 08, exercise 08, the GPU check, tests): ``python -m course_utils diagnose
course_utils/tools/examples/data_bound.py --epochs 50``."""
