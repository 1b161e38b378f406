"""Reference results: the JSON round trip, clear errors, and the honesty of what ships."""
from __future__ import annotations

import datetime as dt
import json
import math
from pathlib import Path

import pytest

from course_utils import reference
from course_utils.reference import (LESSON04, LESSON05, REFERENCE_DIR, REQUIRED_KEYS, SUMMARY,
                                    MalformedReference, describe_machine,
                                    load_reference, missing_reference_text, reference_path,
                                    save_reference)

MACHINE = {"gpu_name": "test GPU (fake, for the round trip only)", "cpu_count": 2}


def test_round_trip(tmp_path):
    data = {"sweep": {"sizes": [1024, 4096], "gbps": [1.5, None]}, "ratio": 0.93, "nan": math.nan}
    path = save_reference("lesson04_transfer", data, machine=MACHINE, directory=tmp_path)
    assert path == tmp_path / "lesson04_transfer.json" and path.is_file()
    doc = load_reference("lesson04_transfer", directory=tmp_path)
    assert set(REQUIRED_KEYS) <= set(doc)
    assert doc["name"] == "lesson04_transfer"
    assert doc["measured_at"] == dt.date.today().isoformat()
    assert doc["machine"] == MACHINE
    assert doc["results"]["sweep"] == data["sweep"]
    assert doc["results"]["nan"] is None            # NaN is not JSON: stored as null
    json.loads(path.read_text())                    # strict JSON
    assert not list(tmp_path.glob("*.tmp"))         # written atomically
    assert sorted(p.stem for p in tmp_path.glob("*.json")) == ["lesson04_transfer"]


def test_absent_reference_is_none(tmp_path):
    assert load_reference("lesson04_transfer", directory=tmp_path) is None
    assert load_reference("nothing", directory=tmp_path / "no_such_dir") is None
    assert not (tmp_path / "no_such_dir").exists()


@pytest.mark.parametrize("text, match", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "JSON object"),
    ('{"name": "bad", "machine": {}}', "lacks measured_at, results"),
    ('{"name": "bad", "measured_at": "2024-01-01", "machine": [], "results": {}}', "must be JSON objects"),
])
def test_malformed_reference_names_the_file(tmp_path, text, match):
    (tmp_path / "bad.json").write_text(text)
    with pytest.raises(MalformedReference, match=match) as info:
        load_reference("bad", directory=tmp_path)
    assert "bad.json" in str(info.value)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("name", ["", "../x", "a/b", "x.json", 3, None])
def test_bad_names_are_refused(name):
    with pytest.raises(ValueError, match="name must be a plain file stem"):
        reference_path(name)


def test_describe_machine_has_the_documented_keys():
    info = describe_machine()
    for key in ("gpu_name", "gpu_memory_bytes", "torch_version", "cuda_version", "cpu_count",
                "accelerator", "summary"):
        assert key in info
    json.dumps(info)
    assert info["cpu_count"] >= 1


def test_missing_text_says_how_to_produce_results():
    text = missing_reference_text(LESSON04)
    assert "No reference GPU results have been measured yet" in text
    assert "python -m course_authoring gpu-check" in text


def test_the_folder_ships_a_readme_and_only_json_files():
    assert REFERENCE_DIR.is_dir()
    assert (REFERENCE_DIR / "README.md").is_file()
    others = [p.name for p in REFERENCE_DIR.iterdir()
              if p.name != "README.md" and p.suffix != ".json" and p.name != "__pycache__"]
    assert not others, f"only JSON files and the README belong in {REFERENCE_DIR}: {others}"


def not_measured_on_a_cuda_gpu(directory=None) -> list[str]:
    """Why each reference in ``directory`` (default: the shipped folder) is not a CUDA GPU's
    result, one line per problem; empty when every one is."""
    problems = []
    for name in sorted(p.stem for p in Path(directory or REFERENCE_DIR).glob("*.json")):
        doc = load_reference(name, directory)
        machine = doc["machine"]
        if doc["name"] != name:
            problems.append(f"{name}.json is named {doc['name']!r} inside")
        if machine.get("accelerator") != "cuda" or not machine.get("gpu_name") \
                or not machine.get("cuda_version"):
            problems.append(f"{name}.json does not describe a CUDA GPU (accelerator "
                            f"{machine.get('accelerator')!r}, gpu_name {machine.get('gpu_name')!r}, "
                            f"cuda_version {machine.get('cuda_version')!r}): reference results come "
                            f"only from 'python -m course_authoring gpu-check' on a CUDA machine")
        try:
            dt.date.fromisoformat(doc["measured_at"][:10])
        except ValueError:
            problems.append(f"{name}.json: measured_at {doc['measured_at']!r} is not a date")
    return problems


def test_every_shipped_reference_was_measured_on_a_cuda_gpu():
    assert not_measured_on_a_cuda_gpu() == []


def test_the_cuda_check_rejects_a_reference_measured_on_a_cpu(tmp_path):
    """The check above passes while nothing ships: here it must refuse what a CPU would write
    (with a CUDA build of torch, as on the course's CPU machines), and each other way of not
    being a CUDA GPU's result, and accept a CUDA GPU's."""
    cuda = {**MACHINE, "accelerator": "cuda", "cuda_version": "13.0"}
    bad = {"cpu_run": {**cuda, "accelerator": "cpu", "gpu_name": None},
           "mps_run": {**cuda, "accelerator": "mps", "gpu_name": "Apple M2"},
           "no_gpu_name": {**cuda, "gpu_name": None},
           "no_cuda_version": {**cuda, "cuda_version": None}}
    for name, machine in {**bad, LESSON04: cuda}.items():
        save_reference(name, {"gbps": [1.0]}, machine=machine, directory=tmp_path)
    problems = not_measured_on_a_cuda_gpu(tmp_path)
    assert sorted(p.split(" (")[0] for p in problems) == [
        f"{name}.json does not describe a CUDA GPU" for name in sorted(bad)], problems


def test_names_are_the_documented_ones():
    assert (LESSON04, LESSON05, SUMMARY) == ("lesson04_transfer", "lesson05_augment",
                                              "gpu_check_summary")
    assert reference.REFERENCE_DIR.name == "reference_results"
