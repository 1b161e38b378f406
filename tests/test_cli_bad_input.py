"""Bad input on the command line: `grade` on paths that are not notebooks or a cell timeout of 0,
`bench` on too few images, `tune` on folders with damaged images. One line on stderr naming the
argument, exit status 2, never a traceback; damaged images are skipped (and reported) as long as
enough remain."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from course_utils.__main__ import main
from course_utils.image_folder import ImageFolderDataset, image_damage
from course_utils.machine import usable_cpus
from course_utils.tools import tune_loader
from course_utils.tools.bench.run import min_batches
from course_utils.tools.tune.search import MIN_FOLDER_IMAGES

from _helpers import ROOT

pytestmark = pytest.mark.timeout(120)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "course_utils", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=100)


def _jpeg(seed: int, side: int = 24) -> bytes:
    img = np.random.default_rng(seed).integers(0, 256, (side, side, 3), dtype=np.uint8)
    return cv2.imencode(".jpg", img)[1].tobytes()


def _one_line_error(err: str, *words: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err and "error:" in lines[0]
    for word in words:
        assert word in lines[0], (word, lines[0])


@pytest.fixture()
def damaged_folder(tmp_path: Path) -> Path:
    """MIN_FOLDER_IMAGES good JPEGs in two classes, a truncated JPEG, a text file named .jpg."""
    for i in range(MIN_FOLDER_IMAGES):
        (tmp_path / f"c{i % 2}").mkdir(exist_ok=True)
        (tmp_path / f"c{i % 2}" / f"{i}.jpg").write_bytes(_jpeg(i))
    (tmp_path / "c0" / "truncated.jpg").write_bytes(_jpeg(99)[:300])
    (tmp_path / "c1" / "notes.jpg").write_text("not an image, only named like one")
    return tmp_path


# ---- grade ----------------------------------------------------------------------------------

def test_grade_missing_path_is_one_line_exit_2():
    proc = _cli("grade", "no/such/notebook.ipynb")
    assert proc.returncode == 2
    _one_line_error(proc.stderr, "NOTEBOOK 'no/such/notebook.ipynb'", "does not exist", "pass")
    assert proc.stdout == ""


@pytest.mark.parametrize("make, words", [
    (lambda p: p.mkdir(), ["is a folder", "*.ipynb"]),
    (lambda p: p.with_suffix(".py").write_text("x = 1\n"), ["not a notebook", ".ipynb"]),
    (lambda p: p.write_text('{"cells": [\n'), ["not valid notebook JSON", "restore it"]),
    (lambda p: p.write_bytes(b"\xff\xfe\x00"), ["not valid notebook JSON"]),
    (lambda p: p.write_text("[1, 2]"), ["not a notebook", "cells"]),
])
def test_grade_bad_paths_name_the_argument(tmp_path, capsys, make, words):
    target = tmp_path / "bad.ipynb"
    make(target)
    path = target if target.exists() else target.with_suffix(".py")
    assert main(["grade", str(path)]) == 2
    out = capsys.readouterr()
    _one_line_error(out.err, f"NOTEBOOK {str(path)!r}", *words)
    assert out.out == ""


def test_grade_checks_every_path_before_running_any(tmp_path, capsys):
    good = ROOT / "exercises" / "00_measure_first.ipynb"
    assert main(["grade", str(good), str(tmp_path / "missing.ipynb")]) == 2
    out = capsys.readouterr()
    assert out.out == "" and "missing.ipynb" in out.err


@pytest.mark.parametrize("value", ["0", "-5"])
def test_grade_cell_timeout_must_be_more_than_0(value, capsys):
    good = ROOT / "exercises" / "00_measure_first.ipynb"
    assert main(["grade", str(good), "--cell-timeout", value]) == 2
    out = capsys.readouterr()
    _one_line_error(out.err, f"--cell-timeout {value}", "more than 0", "pass e.g.")
    assert out.out == ""                                 # nothing was run


# ---- bench ----------------------------------------------------------------------------------

def test_bench_too_few_images_is_one_line_exit_2(capsys):
    assert main(["bench", "--images", "10", "--no-progress"]) == 2      # the default batch size
    out = capsys.readouterr()
    _one_line_error(out.err, "--images 10 is too few images for --batch-size",
                    f"{min_batches()} batches", "pass --images")
    assert out.out == ""                                 # nothing was written or measured


def test_bench_names_the_smallest_size_that_works(capsys):
    need = min_batches()
    assert need == 2 * max(4, usable_cpus()) + 10          # 4 recipe workers, or one per CPU
    assert main(["bench", "--images", str(need * 8 - 1), "--batch-size", "8"]) == 2
    _one_line_error(capsys.readouterr().err, f"--images {need * 8 - 1} is too few",
                    "--batch-size 8", f"pass --images {need * 8} or more")


# ---- ImageFolderDataset ---------------------------------------------------------------------

def test_image_damage_finds_truncated_and_fake_images(tmp_path):
    good, cut, fake = tmp_path / "good.jpg", tmp_path / "cut.jpg", tmp_path / "fake.jpg"
    good.write_bytes(_jpeg(1))
    cut.write_bytes(_jpeg(1)[:-2])                       # only the end-of-image marker lost
    fake.write_text("hello")
    assert image_damage(good) is None
    assert image_damage(cut) == "truncated JPEG"
    assert image_damage(fake) == "OpenCV cannot decode it"
    (tmp_path / "empty.png").write_bytes(b"")
    assert image_damage(tmp_path / "empty.png") == "empty file"
    assert image_damage(tmp_path / "missing.jpg").startswith("cannot be read")


def test_image_damage_steps_over_thumbnails_and_trailers(tmp_path):
    main_image, thumb = _jpeg(2, side=64), _jpeg(3, side=8)
    app1 = b"Exif\x00\x00" + thumb                      # a whole JPEG inside a header segment
    with_thumb = main_image[:2] + b"\xff\xe1" + (len(app1) + 2).to_bytes(2, "big") + app1 \
        + main_image[2:]
    (tmp_path / "thumb.jpg").write_bytes(with_thumb)
    (tmp_path / "thumb_cut.jpg").write_bytes(with_thumb[:len(with_thumb) - 200])
    (tmp_path / "trailer.jpg").write_bytes(main_image + b"\xff\xda video data" * 50)
    assert image_damage(tmp_path / "thumb.jpg") is None
    assert image_damage(tmp_path / "thumb_cut.jpg") == "truncated JPEG"
    assert image_damage(tmp_path / "trailer.jpg") is None


def test_image_folder_skip_damaged(damaged_folder):
    plain = ImageFolderDataset(damaged_folder)
    assert len(plain) == MIN_FOLDER_IMAGES + 2 and not plain.checked and plain.damaged == []
    bad = [i for i, p in enumerate(plain.paths) if p.endswith("notes.jpg")][0]
    with pytest.raises(ValueError, match=r"notes\.jpg.*skip_damaged=True"):
        plain[bad]
    ds = ImageFolderDataset(damaged_folder, skip_damaged=True)
    assert len(ds) == MIN_FOLDER_IMAGES and ds.checked
    assert sorted(Path(p).name for p, _ in ds.damaged) == ["notes.jpg", "truncated.jpg"]
    assert all(ds[i][0].shape == (24, 24, 3) for i in range(len(ds)))
    summary = ds.damaged_summary()
    assert summary.startswith("skipped 2 damaged file(s)") and "c0/truncated.jpg" in summary
    assert "2 damaged files skipped" in ds.describe() and "skip_damaged=True" in repr(ds)
    small = ds.with_transform(lambda img: torch.from_numpy(img[:4, :4].copy()))
    assert len(small) == len(ds) and small[0][0].shape == (4, 4, 3) and ds.transform is None


# ---- tune -----------------------------------------------------------------------------------

_FAST = ["--budget", "2", "--size", "16", "--batch-size", "8", "--no-compare", "--no-progress"]


def test_tune_skips_damaged_images_and_says_which(damaged_folder, capsys):
    assert main(["tune", str(damaged_folder), *_FAST]) == 0
    out = capsys.readouterr()
    warning = [line for line in out.err.splitlines() if "warning:" in line]
    assert len(warning) == 1 and "Traceback" not in out.err
    assert "skipped 2 damaged file(s)" in warning[0]
    assert "truncated.jpg" in warning[0] and "notes.jpg" in warning[0]
    assert f"tuning the {MIN_FOLDER_IMAGES} others" in warning[0]
    assert "note: skipped 2 damaged file(s)" in out.out
    assert "skip_damaged=True" in out.out                # the code to paste skips them too


def test_tune_loader_on_a_dataset_checks_it_first(damaged_folder):
    r = tune_loader(ImageFolderDataset(damaged_folder), budget_s=2, size=16, batch_size=8,
                    worker_counts=[0], batch_sizes=[8], compare_with_baselines=False,
                    progress=False)
    assert any("skipped 2 damaged" in note for note in r.notes)
    assert "2 damaged files skipped" in r.dataset


def test_tune_only_damaged_images_is_one_line_exit_2(tmp_path):
    (tmp_path / "cut.jpg").write_bytes(_jpeg(5)[:200])
    (tmp_path / "text.jpg").write_text("nope")
    proc = _cli("tune", str(tmp_path), *_FAST)
    assert proc.returncode == 2
    _one_line_error(proc.stderr, f"FOLDER {str(tmp_path)!r}", "only 0 readable",
                    "skipped 2 damaged", f"at least {MIN_FOLDER_IMAGES}")


def test_tune_too_few_images_left(damaged_folder, capsys):
    for path in sorted(damaged_folder.glob("c0/[0-9]*.jpg"))[:2]:
        path.unlink()
    assert main(["tune", str(damaged_folder), *_FAST]) == 2
    _one_line_error(capsys.readouterr().err, f"only {MIN_FOLDER_IMAGES - 2} readable",
                    "truncated.jpg", "Add images or replace the damaged ones")
    with pytest.raises(ValueError, match=f"data=.*at least {MIN_FOLDER_IMAGES}"):
        tune_loader(damaged_folder, budget_s=2, progress=False)
