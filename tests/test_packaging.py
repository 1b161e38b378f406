"""The install files agree with each other."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# conda-forge names that differ from PyPI names
CONDA_TO_PYPI = {"pytorch": "torch"}
NOT_PACKAGES = {"python", "pip", "-e ."}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _split(spec: str) -> tuple[str, str]:
    m = re.match(r"^\s*([A-Za-z0-9_.\-]+)\s*(.*)$", spec)
    assert m, spec
    return _norm(m.group(1)), m.group(2).replace(" ", "")


def pyproject_packages() -> dict[str, str]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    specs = data["project"]["dependencies"] + data["project"]["optional-dependencies"]["test"]
    return dict(_split(s) for s in specs)


def environment_packages() -> dict[str, str]:
    found: dict[str, str] = {}
    for line in (ROOT / "environment.yml").read_text().splitlines():
        m = re.match(r"^\s*-\s+(\S.*?)\s*$", line)
        if not m or m.group(1).endswith(":") or m.group(1) in NOT_PACKAGES:
            continue
        item = m.group(1)
        if item.startswith("python=") or item == "conda-forge":
            continue
        name, version = _split(item)
        found[CONDA_TO_PYPI.get(name, name)] = version
    return found


def test_environment_yml_lists_the_same_packages_as_pyproject():
    py, env = pyproject_packages(), environment_packages()
    assert sorted(py) == sorted(env), (
        f"only in pyproject.toml: {sorted(set(py) - set(env))}; "
        f"only in environment.yml: {sorted(set(env) - set(py))}")
    assert py == env, "version ranges differ: " + ", ".join(
        f"{k}: pyproject {py[k]!r} vs environment.yml {env[k]!r}" for k in py if py[k] != env[k])


def test_environment_pins_python_minor_and_installs_the_package():
    text = (ROOT / "environment.yml").read_text()
    assert re.search(r"^\s*-\s+python=3\.\d+\s*$", text, re.M), "pin the Python minor version"
    assert re.search(r"^\s*-\s+-e \.\s*$", text, re.M), "install the package itself through pip"


def test_ci_runs_make_test():
    run = (ROOT / ".ci" / "run").read_text()
    assert "make test" in run and "set -e" in run


def test_every_subpackage_and_data_file_is_packaged():
    from setuptools import find_packages
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    include = data["tool"]["setuptools"]["packages"]["find"]["include"]
    found = set(find_packages(str(ROOT), include=include))
    on_disk = {str(p.parent.relative_to(ROOT)).replace("/", ".")
               for package in ("course_utils", "course_authoring")
               for p in (ROOT / package).rglob("__init__.py")}
    assert on_disk <= found, f"not packaged: {sorted(on_disk - found)}"
    patterns = data["tool"]["setuptools"]["package-data"]["course_utils"]
    assert "reference_results/*.json" in patterns
