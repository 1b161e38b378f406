"""``python -m course_utils tune`` (lesson 06): :mod:`.search` (:func:`~.search.tune_loader`),
:mod:`.window` (how one setting and the side by side are measured), :mod:`.result` (what it returns)."""
