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
    assert decoder.why == "TorchCodec 0.17.0 failed to decode a JPEG on cpu: FFmpeg not found"
    assert decoder.device == "cpu" and str(decoder) == f"{decoder.name} ({decoder.why})"


def fake_device_decoders(monkeypatch, codec_ok_on, torchvision_ok_on):
    """TorchCodec and torchvision decoders that "decode" only on the device types given (a stand-in
    whose .device is the one asked for) and raise like a build without CUDA JPEG decode elsewhere."""
    def make(ok_on, error):
        def decode(data, device="cpu", mode=None):
            if torch.device(device).type not in ok_on:
                raise RuntimeError(error + "\nsecond line")
            return types.SimpleNamespace(device=torch.device(device))
        return decode
    codec_decode = make(codec_ok_on, "CUDA not available in this TorchCodec build")
    fake_import(monkeypatch, codec("0.17.0", lambda data, mode, device: codec_decode(data, device)))
    monkeypatch.setattr(J, "torchvision_decode_jpeg", make(torchvision_ok_on, "not compiled with nvJPEG"))


def test_a_torchcodec_without_cuda_leaves_cuda_decode_to_torchvision_saying_why(monkeypatch):
    fake_device_decoders(monkeypatch, codec_ok_on={"cpu"}, torchvision_ok_on={"cpu", "cuda"})
    decoder = J.tensor_decoder("cuda")
    assert decoder.name.startswith("torchvision") and decoder.device == "cuda"
    assert decoder.why == "TorchCodec 0.17.0 failed to decode a JPEG on cuda: CUDA not available in this TorchCodec build"
    assert J.tensor_decoder("cpu").name == "TorchCodec 0.17.0" and J.tensor_decoder("cpu").why is None


def test_cuda_torchcodec_is_kept_on_cuda(monkeypatch):
    fake_device_decoders(monkeypatch, codec_ok_on={"cpu", "cuda"}, torchvision_ok_on={"cpu"})
    decoder = J.tensor_decoder(torch.device("cuda"))
    assert (decoder.name, decoder.device, decoder.why) == ("TorchCodec 0.17.0", "cuda", None)
    assert str(decoder) == "TorchCodec 0.17.0 on cuda"


def test_no_cuda_jpeg_decode_at_all_falls_back_to_the_cpu_saying_why(monkeypatch):
    fake_device_decoders(monkeypatch, codec_ok_on={"cpu"}, torchvision_ok_on={"cpu"})
    decoder = J.tensor_decoder("cuda:0")
    assert (decoder.name, decoder.device) == ("TorchCodec 0.17.0", "cpu")     # the CPU's own choice
    assert decoder.why == ("torchvision " + J.torchvision.__version__ + " failed to decode a JPEG on cuda:0: "
                           "not compiled with nvJPEG; decoding on the CPU instead")
    seen = []
    monkeypatch.setattr(J, "tensor_decoder", lambda device: J.TensorDecoder(
        "fake", lambda data, device: seen.append(device) or "decoded", None, "cpu"))
    assert J.decode_jpeg_tensors([torch.zeros(4, dtype=torch.uint8)], device="cuda") == "decoded"
    assert seen == ["cpu"]                                  # decoded where the decoder can


def test_a_decoder_that_ignores_the_device_is_not_taken_for_one_that_decodes_there(monkeypatch):
    fake_import(monkeypatch, ImportError("No module named 'torchcodec'"))
    monkeypatch.setattr(J, "torchvision_decode_jpeg",
                        lambda data, device="cpu": types.SimpleNamespace(device=torch.device("cpu")))
    decoder = J.tensor_decoder("mps")                       # torchvision decodes on the CPU for "mps"
    assert decoder.device == "cpu" and "cannot decode on mps" in decoder.why


def test_the_real_decoders_fall_back_to_the_cpu_on_a_machine_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("this machine decodes on CUDA")
    decoder = J.tensor_decoder("cuda")
    assert decoder.device == "cpu" and decoder.why.endswith("; decoding on the CPU instead")
    data, encoded = jpegs(1)
    assert torch.equal(J.decode_jpeg_tensors(encoded[0], device="cuda"), J.tensor_decoder().decode(encoded[0]))
