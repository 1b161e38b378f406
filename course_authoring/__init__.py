"""The course authors' commands, kept out of the learner's package (``course_utils``).

* :mod:`course_authoring.exercises` — ``exercises/`` generated from ``solutions/`` (the
  ``### BEGIN SOLUTION`` / ``### END SOLUTION`` regions become ``NotImplementedError`` stubs);
* :mod:`course_authoring.hosted` — the three-line Colab/Kaggle install cell of every notebook;
* :mod:`course_authoring.gpu_check` and :mod:`course_authoring.notebook_runner` — the check run on
  a lent CUDA machine, which writes the reference results ``course_utils`` ships.

Commands: ``python -m course_authoring make-exercises | hosted-cell | gpu-check``.
"""
