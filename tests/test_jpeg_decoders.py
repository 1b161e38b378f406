"""course_utils.jpeg_decoders: TorchCodec's decode_jpeg where it loads, torchvision's otherwise,
each fallback with its reason; both give the same RGB (3, H, W) uint8 pixels."""
from __future__ import annotations

import types

import numpy as np
import pytest
import torch

from course_utils import JpegDataset
from course_utils import jpeg_decoders as J


@pytest.fixture(autouse=True)
def fresh_choice():
    J.tensor_decoder.cache_clear()
    yield
    J.tensor_decoder.cache_clear()


def jpegs(n=3):
    data = JpegDataset(n=n, progress=False)
    return data, [torch.from_numpy(data.encoded(i).copy()) for i in range(n)]


def test_the_decoder_in_use_gives_the_pixels_of_torchvisions_and_opencvs():
    data, encoded = jpegs()
    decoder = J.tensor_decoder()
    assert decoder.name.startswith(("TorchCodec", "torchvision"))
    assert (decoder.why is None) == decoder.name.startswith("TorchCodec")
    batch = J.decode_jpeg_tensors(encoded)
    assert isinstance(batch, list) and len(batch) == len(encoded)
    for i, (image, data_i) in enumerate(zip(batch, encoded)):
        assert image.dtype == torch.uint8 and image.shape[0] == 3
        assert torch.equal(image, J.torchvision_decode_jpeg(data_i))
        opencv = torch.from_numpy(np.ascontiguousarray(data[i][0])).permute(2, 0, 1)
        assert int((image.int() - opencv.int()).abs().max()) <= 1
    assert torch.equal(J.decode_jpeg_tensors(encoded[0]), batch[0])     # one in, one out


def fake_import(monkeypatch, outcome):
    real = J.importlib.import_module

    def import_module(name, *args):
        if name.startswith("torchcodec"):
            if isinstance(outcome, BaseException):
                raise outcome
            return outcome[name]
        return real(name, *args)
    monkeypatch.setattr(J.importlib, "import_module", import_module)


def codec(version, decode):
    return {"torchcodec": types.SimpleNamespace(__version__=version),
            "torchcodec.decoders": types.SimpleNamespace(decode_jpeg=decode)}


@pytest.mark.parametrize("outcome, words", [
    (ImportError("No module named 'torchcodec'"), "TorchCodec is not installed: pip install -e .[codec]"),
    (ImportError("libavutil.so.58: cannot open shared object file"), "did not load beside torch"),
    (OSError("undefined symbol: _ZN3c10"), "did not load beside torch"),
    (RuntimeError("Could not load libtorchcodec"), "did not load beside torch"),
])
def test_a_torchcodec_that_does_not_load_falls_back_to_torchvision_saying_why(monkeypatch, outcome, words):
    fake_import(monkeypatch, outcome)
    decoder = J.tensor_decoder()
    assert decoder.name.startswith("torchvision") and words in decoder.why
    assert decoder.decode is J.torchvision_decode_jpeg and words in str(decoder)


@pytest.mark.parametrize("version, used", [("0.15.9", False), ("0.16.0", True), ("0.17.0+cu130", True)])
def test_torchcodec_is_used_from_0_16_on(monkeypatch, version, used):
    fake_import(monkeypatch, codec(version, lambda data, mode, device: torch.zeros(3, 8, 8, dtype=torch.uint8)))
    decoder = J.tensor_decoder()
    assert decoder.name.startswith("TorchCodec") == used
    if not used:
        assert f"TorchCodec {version} predates its image decoders (0.16)" == decoder.why


def test_a_torchcodec_that_loads_but_cannot_decode_falls_back(monkeypatch):
    def broken(data, mode, device):
        raise RuntimeError("FFmpeg not found")
    fake_import(monkeypatch, codec("0.17.0", broken))
    decoder = J.tensor_decoder()
    assert decoder.name.startswith("torchvision")
    assert decoder.why == "TorchCodec 0.17.0 failed to decode a JPEG here: FFmpeg not found"
