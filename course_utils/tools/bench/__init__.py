"""``python -m course_utils bench``: :mod:`.run` (every row side by side), :mod:`.recipes` (the
loaders as learners write them, and the course's), :mod:`.storage` (files, page cache, packed
store), :mod:`.dali` (the ImageNet recipe as a DALI pipeline)."""
