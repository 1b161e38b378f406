"""``python -m course_utils bench``: the recipes learners run vs the course's pipeline, on files.

:mod:`.run` measures every row side by side; :mod:`.recipes` holds the loaders as learners
write them (and the course's on the same files); :mod:`.storage` the images as files on disk:
the ImageFolder layout, the page cache, a packed uint8 store.
"""
