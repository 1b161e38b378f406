"""Harness code that a lesson notebook cannot hold, one module per lesson part, named like the
notebook it serves (``l04_copies`` for notebooks/04_host_to_device.ipynb). The mechanism each
lesson teaches is written in the notebook itself; these modules run the bigger measurements
around it. Nothing here is imported by ``import course_utils``.
"""
