"""``python -m course_utils tune``: fast DataLoader settings within a time budget (lesson 06).

:mod:`.search` runs the search and the side by side (:func:`~.search.tune_loader`),
:mod:`.window` measures one setting, :mod:`.result` is what the tuner returns.
"""
