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


def toolchain(monkeypatch, mod, tmp_path, on_path, env=(), headers=True):
    for name in ("CC", "CXX"):
        monkeypatch.delenv(name, raising=False)
    for name in env:
        monkeypatch.setenv(name, "/opt/bin/" + name.lower())
    monkeypatch.setattr(mod.shutil, "which", lambda name: f"/usr/bin/{name}" if name in on_path else None)
    monkeypatch.setattr(mod.sys, "platform", "linux")
    include = tmp_path / "include" / "python3.x"
    include.mkdir(parents=True, exist_ok=True)
    if headers:
        (include / "Python.h").write_text("")
    monkeypatch.setattr(mod.sysconfig, "get_paths", lambda: {"include": str(include),
                                                             "stdlib": str(tmp_path / "lib" / "python3.x")})
    return include


@pytest.mark.parametrize("device, on_path, env, missing", [
    ("cuda", {"gcc"}, (), None),
    ("cuda", {"clang"}, (), None),
    ("cuda", set(), ("CC",), None),
    ("cuda", {"g++"}, (), "no C compiler: $CC is not set and gcc nor clang is on PATH"),   # Triton wants C
    ("cpu", {"g++"}, (), None),
    ("cpu", set(), ("CXX",), None),
    ("cpu", {"gcc", "clang"}, (), "no C++ compiler: $CXX is not set and g++ is on PATH"),  # Inductor wants C++
])
def test_torch_compile_needs_the_compiler_of_its_backend(monkeypatch, compile_check, tmp_path, device,
                                                        on_path, env, missing):
    toolchain(monkeypatch, compile_check, tmp_path, on_path, env)
    assert compile_check.compile_toolchain_missing(device) == missing


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_torch_compile_needs_the_python_headers(monkeypatch, compile_check, tmp_path, device):
    include = toolchain(monkeypatch, compile_check, tmp_path, {"gcc", "g++"}, headers=False)
    missing = compile_check.compile_toolchain_missing(device)
    assert missing.startswith(f"no Python.h in {include}") and "development headers" in missing
    framework = tmp_path / "Headers"                           # a macOS framework build keeps them here
    framework.mkdir()
    (framework / "Python.h").write_text("")
    assert compile_check.compile_toolchain_missing(device) is None
