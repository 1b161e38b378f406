"""The install files agree with each other."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

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


def _install_torch_module():
    import importlib.util
    spec = importlib.util.spec_from_file_location("install_torch", ROOT / "tools" / "install_torch.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_make_installs_torch_and_torchvision_as_one_pair():
    makefile = (ROOT / "Makefile").read_text()
    assert "tools/install_torch.py" in makefile
    assert "torchvision" in re.search(r"^TORCH_SPEC \?=(.*)$", makefile, re.M).group(1)
    assert "torchvision" in pyproject_packages()


def test_install_torch_keeps_a_pair_that_loads(monkeypatch, capsys):
    module = _install_torch_module()
    monkeypatch.setattr(module, "probe", lambda: (True, "torch 9 + torchvision 9"))
    monkeypatch.setattr(module, "pip_install", lambda *a: (_ for _ in ()).throw(AssertionError("installed")))
    assert module.main([]) == 0
    assert "kept" in capsys.readouterr().out


def test_install_torch_replaces_a_pair_older_than_the_spec(monkeypatch, capsys):
    module = _install_torch_module()
    calls = []
    monkeypatch.setattr(module, "probe", lambda: (True, "torch 2.2.2 + torchvision 0.17.2"))
    monkeypatch.setattr(module, "version", lambda name: {"torch": "2.2.2+cu121",
                                                         "torchvision": "0.17.2+cu121"}[name])
    monkeypatch.setattr(module, "pip_install", lambda spec, index, upgrade: calls.append(upgrade))
    assert module.main([]) == 0
    assert calls == [False]   # one `pip install torch>=2.5 torchvision>=0.20`, then it loads
    out = capsys.readouterr().out
    assert "torch 2.2.2+cu121 does not meet torch>=2.5" in out and "kept" not in out


def test_install_torch_names_a_bad_spec(capsys):
    with pytest.raises(SystemExit) as stop:
        _install_torch_module().main(["--spec", "torch>=>2 torchvision"])
    assert stop.value.code == 2
    assert "'torch>=>2' is not a pip requirement" in capsys.readouterr().err


def test_install_torch_upgrades_then_fails_with_advice(monkeypatch, capsys):
    module = _install_torch_module()
    calls = []
    monkeypatch.setattr(module, "probe", lambda: (False, "RuntimeError: operator torchvision::nms does not exist"))
    monkeypatch.setattr(module, "pip_install", lambda spec, index, upgrade: calls.append((spec, index, upgrade)))
    assert module.main(["--index-url", "https://example.invalid/cpu"]) == 2
    assert calls == [(["torch>=2.5", "torchvision>=0.20"], "https://example.invalid/cpu", False),
                     (["torch>=2.5", "torchvision>=0.20"], "https://example.invalid/cpu", True)]
    err = capsys.readouterr().err
    assert "same index" in err and "TORCH_INDEX_URL" in err


def test_install_torch_probe_sees_the_installed_pair():
    ok, said = _install_torch_module().probe()
    assert ok, said
    assert said.startswith("torch ") and "torchvision" in said
