import pytest
import torch

from jetflow.util import hardware


@pytest.mark.parametrize("flags, expected", [(frozenset({"avx2", "avx512_bf16"}), "bfloat16"),
                                             (frozenset({"amx_bf16"}), "bfloat16"),
                                             (frozenset({"avx2", "avx512f"}), "float32")])
def test_fast_dtype_follows_the_cpu_flags(monkeypatch, flags, expected):
    monkeypatch.setattr(hardware, "_cpuinfo", lambda: ("Some CPU", flags))
    dtype, why = hardware.fast_dtype("cpu")
    assert dtype == expected
    assert ("emulated" in why) == (expected == "float32")
    assert ("native" in hardware.describe()) == (expected == "bfloat16")


def test_cuda_is_bf16(monkeypatch):
    assert hardware.fast_dtype("cuda")[0] == "bfloat16"


def test_describe_names_the_cpu_and_threads():
    text = hardware.describe()
    assert hardware.cpu_model() in text and f"{torch.get_num_threads()} torch threads" in text
