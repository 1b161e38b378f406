"""Lesson 07's torchrun launcher (:mod:`.launch`) and the program every rank runs (:mod:`.rank`);
exercise 07's grader runs the learner's loader in real ranks with it."""
