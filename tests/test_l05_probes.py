"""Lesson 05's probes, as its %%writefile cells write them: whether nvJPEG has a hardware JPEG
engine on the GPU (lesson05_decode), and whether torch.compile has the toolchain it builds kernels
with (lesson05_compile). No GPU and no compiler are needed: nvJPEG and the PATH are stood in for."""
from __future__ import annotations

import contextlib
import types
from pathlib import Path

import pytest

from course_authoring.notebook_modules import notebook_module

NOTEBOOK = "05_gpu_augmentation.ipynb"


@pytest.fixture(scope="module")
def decode():
    return notebook_module(NOTEBOOK, "lesson05_decode")


@pytest.fixture(scope="module")
def compile_check():
    return notebook_module(NOTEBOOK, "lesson05_compile")


class FakeNvjpeg:
    """libnvjpeg's two calls the probe makes: nvjpegCreateEx answers `status`."""

    def __init__(self, status):
        self.status, self.created, self.destroyed = status, [], 0

    def nvjpegCreateEx(self, backend, dev_allocator, pinned_allocator, flags, handle):
        self.created.append((backend, dev_allocator, pinned_allocator, flags))
        return self.status

    def nvjpegDestroy(self, handle):
        self.destroyed += 1


def stand_in(monkeypatch, decode, lib):
    opened = []

    def cdll(path):
        opened.append(path)
        if isinstance(lib, BaseException):
            raise lib
        return lib
    monkeypatch.setattr(decode.ctypes, "CDLL", cdll)
    monkeypatch.setattr(decode.torch.cuda, "device", lambda device: contextlib.nullcontext())
    return opened


@pytest.mark.parametrize("status, engine", [(0, True), (7, False), (6, None), (1, None)])
def test_the_engine_is_what_nvjpeg_answers_for_its_hardware_backend(monkeypatch, decode, status, engine):
    lib = FakeNvjpeg(status)
    opened = stand_in(monkeypatch, decode, lib)
    assert decode.hardware_jpeg_engine("cuda:1", "/x/libnvjpeg.so.13") is engine
    assert opened == ["/x/libnvjpeg.so.13"]
    assert lib.created == [(3, None, None, 0)]            # NVJPEG_BACKEND_HARDWARE, default allocators
    assert lib.destroyed == (1 if engine else 0)           # a handle that opened is closed again


@pytest.mark.parametrize("error", [OSError("libnvjpeg.so: cannot open shared object file"),
                                   AttributeError("undefined symbol: nvjpegCreateEx")])
def test_a_library_that_does_not_load_gives_no_answer(monkeypatch, decode, error):
    stand_in(monkeypatch, decode, error)
    assert decode.hardware_jpeg_engine("cuda", None) is None


def test_the_library_is_the_decoders_own_first(monkeypatch, decode, tmp_path):
    for folder, name in (("torchcodec.libs", "libnvjpeg-1a35.so.13"), ("torchvision.libs", "libnvjpeg.36e1.so.13"),
                         ("torchvision.libs", "libnvjpeg2k.so.0"), ("nvidia/nvjpeg/lib", "libnvjpeg.so.12")):
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
        (tmp_path / folder / name).write_bytes(b"")
    (tmp_path / "torch").mkdir()
    monkeypatch.setattr(decode.importlib.util, "find_spec",
                        lambda name: types.SimpleNamespace(origin=str(tmp_path / "torch" / "__init__.py")))
    assert Path(decode.nvjpeg_library("torchcodec")).name == "libnvjpeg-1a35.so.13"
    assert Path(decode.nvjpeg_library("torchvision")).name == "libnvjpeg.36e1.so.13"   # not nvjpeg2k
    (tmp_path / "torchvision.libs" / "libnvjpeg.36e1.so.13").unlink()
    assert Path(decode.nvjpeg_library("torchvision")).name == "libnvjpeg.so.12"


def toolchain(monkeypatch, mod, tmp_path, on_path, env=(), headers=True, scheme="venv"):
    """Stand in for the PATH (`on_path`: names and the env paths that resolve), $CC/$CXX and
    sysconfig; the include folder is per scheme, so a check that reads the wrong one misses."""
    for name in ("CC", "CXX"):
        monkeypatch.delenv(name, raising=False)
    for name in env:
        monkeypatch.setenv(name, "/opt/bin/" + name.lower())
    monkeypatch.setattr(mod.shutil, "which",
                        lambda name: (name if name.startswith("/") else f"/usr/bin/{name}") if name in on_path else None)
    monkeypatch.setattr(mod.sys, "platform", "linux")
    folders = {s: tmp_path / s / "include" / "python3.x" for s in ("venv", "posix_prefix", "posix_local")}
    for folder in folders.values():
        folder.mkdir(parents=True, exist_ok=True)
    include = folders["posix_prefix" if scheme == "posix_local" else scheme]     # Triton's rule
    if headers:
        (include / "Python.h").write_text("")
    monkeypatch.setattr(mod.sysconfig, "get_default_scheme", lambda: scheme)
    monkeypatch.setattr(mod.sysconfig, "get_paths", lambda scheme=None: {
        "include": str(folders[scheme]), "stdlib": str(tmp_path / scheme / "lib" / "python3.x")})
    return include


@pytest.mark.parametrize("device, on_path, env, compiler, missing", [
    ("cuda", {"gcc", "clang"}, (), "/usr/bin/gcc", None),                # gcc before clang, as Triton
    ("cuda", {"clang"}, (), "/usr/bin/clang", None),
    ("cuda", {"gcc", "/opt/bin/cc"}, ("CC",), "/opt/bin/cc", None),      # $CC wins
    ("cuda", {"gcc"}, ("CC",), None, "no C compiler: $CC=/opt/bin/cc is not a program on PATH"),
    ("cuda", {"g++"}, (), None, "no C compiler: $CC is not set and no gcc or clang is on PATH"),  # Triton wants C
    ("cpu", {"g++"}, (), "/usr/bin/g++", None),
    ("cpu", {"g++", "/opt/bin/cxx"}, ("CXX",), "/opt/bin/cxx", None),
    ("cpu", {"gcc", "clang", "clang++"}, (), None, "no C++ compiler: $CXX is not set and no g++ is on PATH"),
])
def test_torch_compile_needs_the_compiler_of_its_backend(monkeypatch, compile_check, tmp_path, device,
                                                        on_path, env, compiler, missing):
    include = toolchain(monkeypatch, compile_check, tmp_path, on_path, env)
    found = compile_check.compile_toolchain(device)
    assert found == {"compiler": compiler, "python_h": str(include / "Python.h"), "missing": missing}


@pytest.mark.parametrize("platform, cxx", [("darwin", "clang++"), ("win32", "cl")])
def test_inductors_compiler_elsewhere(monkeypatch, compile_check, tmp_path, platform, cxx):
    toolchain(monkeypatch, compile_check, tmp_path, {"g++", cxx})
    monkeypatch.setattr(compile_check.sys, "platform", platform)
    assert compile_check.compile_toolchain("cpu")["compiler"] == f"/usr/bin/{cxx}"
    toolchain(monkeypatch, compile_check, tmp_path, {"g++"})
    monkeypatch.setattr(compile_check.sys, "platform", platform)
    assert compile_check.compile_toolchain("cpu")["missing"] == f"no C++ compiler: $CXX is not set and no {cxx} is on PATH"


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_torch_compile_needs_the_python_headers(monkeypatch, compile_check, tmp_path, device):
    include = toolchain(monkeypatch, compile_check, tmp_path, {"gcc", "g++"}, headers=False)
    found = compile_check.compile_toolchain(device)
    assert found["python_h"] is None and found["compiler"] is not None
    assert found["missing"] == (f"no Python.h in {include}: install this Python's development headers "
                                f"(python3-dev or the like)")
    framework = tmp_path / "venv" / "Headers"                  # a macOS framework build keeps them here
    framework.mkdir()
    (framework / "Python.h").write_text("")
    assert compile_check.compile_toolchain(device) == {"compiler": found["compiler"],
                                                       "python_h": str(framework / "Python.h"), "missing": None}


def test_debians_posix_local_scheme_reads_posix_prefix(monkeypatch, compile_check, tmp_path):
    include = toolchain(monkeypatch, compile_check, tmp_path, {"gcc"}, scheme="posix_local")
    assert include == tmp_path / "posix_prefix" / "include" / "python3.x"
    assert compile_check.compile_toolchain("cuda")["python_h"] == str(include / "Python.h")


def test_both_missing_are_both_said(monkeypatch, compile_check, tmp_path):
    include = toolchain(monkeypatch, compile_check, tmp_path, set(), headers=False)
    assert compile_check.compile_toolchain("cpu")["missing"] == (
        f"no C++ compiler: $CXX is not set and no g++ is on PATH; no Python.h in {include}: install "
        f"this Python's development headers (python3-dev or the like)")


def test_the_decode_is_labelled_where_it_ran():
    """Section 7 and the advice table label the batched decode with the device tensor_decoder decodes on (the CPU when
    CUDA JPEG decode fell back), never with the device it was asked for."""
    import json
    cells = json.loads((Path(__file__).resolve().parents[1] / "notebooks" / NOTEBOOK).read_text(encoding="utf-8"))["cells"]
    text = "\n".join(c["source"] for c in cells if c["cell_type"] == "code")
    assert "decoded_on = tensor_decoder(decode_device).device" in text
    labels = [line for line in text.splitlines() if "decode_jpeg on {" in line or "decode on {" in line]
    assert len(labels) == 4 and all("{decoded_on}" in line for line in labels), labels


def test_os_is_imported_by_a_cell_gpu_check_runs():
    """gpu-check runs the notebook without its hosted-install cell, the one that imports os first:
    the compile cell reads os.environ, so another cell must import os (it once raised NameError)."""
    import ast
    import json
    from course_authoring.hosted import is_install_cell
    cells = json.loads((Path(__file__).resolve().parents[1] / "notebooks" / NOTEBOOK).read_text(encoding="utf-8"))["cells"]
    run = [c["source"] for c in cells if c["cell_type"] == "code" and not is_install_cell(c)
           and not c["source"].startswith("%%")]
    trees = [ast.parse(source) for source in run]
    uses = any(isinstance(n, ast.Name) and n.id == "os" for t in trees for n in ast.walk(t))
    imports = any(isinstance(n, ast.Import) and any(a.name == "os" and a.asname is None for a in n.names)
                  for t in trees for n in ast.walk(t))
    assert uses and imports
