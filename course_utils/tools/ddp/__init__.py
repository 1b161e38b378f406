"""Lesson 07's torchrun launcher (:mod:`.launch`) and the program every rank runs (:mod:`.rank`).

Lesson 07 writes the launcher's mechanism in its own cells first; the grader of exercise 07
runs the learner's loader in real ranks with it.
"""
