"""What this machine computes fast: the CPU model, native bf16 support, and the dtype to decode in.

    describe()      -> "AMD EPYC 9B14, 2 cores, 2 torch threads, bf16: native (avx512_bf16)"
    fast_dtype()    -> ("bfloat16", "the CPU has avx512_bf16") or ("float32", "bf16 is emulated here ...")
    environment(target) -> the setup fields every timed or replayed row carries (dtype, device, versions, hardware)

bf16 pays only where the hardware has it: CUDA, or a CPU with AVX-512 BF16 or AMX. Elsewhere torch
emulates bf16 matmuls and a many-token verify gets several times slower than in fp32, so fp32 is the
fast path there. Output that must equal plain decoding token for token is checked in fp32 regardless.
"""
from __future__ import annotations

import os
import platform
from importlib.metadata import version
from functools import lru_cache
from pathlib import Path

import torch

BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


@lru_cache(maxsize=1)
def _cpuinfo() -> tuple[str, frozenset[str]]:
    """(model name, flags) from /proc/cpuinfo; the platform's processor string and no flags elsewhere."""
    model, flags = platform.processor() or platform.machine(), frozenset()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model in ("", platform.processor() or platform.machine()):
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = frozenset(value.split())
    except OSError:
        pass
    return model, flags


def cpu_model() -> str:
    return _cpuinfo()[0]


def cpu_bf16_flags() -> tuple[str, ...]:
    """The CPU's native bf16 instruction sets among ``BF16_CPU_FLAGS`` (empty where bf16 is emulated)."""
    return tuple(f for f in BF16_CPU_FLAGS if f in _cpuinfo()[1])


def fast_dtype(device: str | torch.device = "cpu") -> tuple[str, str]:
    """(dtype name, the reason) of the fastest decoding dtype on ``device``."""
    if torch.device(device).type == "cuda":
        return "bfloat16", "CUDA computes bf16 natively"
    flags = cpu_bf16_flags()
    if flags:
        return "bfloat16", f"the CPU has {' and '.join(flags)}"
    return "float32", "the CPU has no AVX-512 BF16 or AMX, so bf16 would be emulated (several times slower)"


def fast_backend(device: str | torch.device = "cpu", file_blocks: bool = True) -> tuple[str, str]:
    """(backend name, the reason) of the fastest lossless backend on ``device`` for every decoding method:
    "bf16" where bf16 is native, "fp32" elsewhere (the packed kernels are 10-40x slower with fp32 inputs). q4
    decodes AR fastest on the embedded target (50.4 against bf16's and fp32's ~21-24 tok/s here) but its head
    methods measured 4.3 tok/s (the draft pass on a q4 target is slow, not yet found why), so it is one flag away
    (``--quant q4``), not the default; ``file_blocks`` is kept for that switch."""
    dtype, why = fast_dtype(device)
    return ("bf16" if dtype == "bfloat16" else "fp32"), why


def describe() -> str:
    """One line for every timed result: CPU model, cores, torch threads, bf16 support, GPU if any."""
    flags = cpu_bf16_flags()
    bf16 = f"native ({', '.join(flags)})" if flags else "emulated"
    text = f"{cpu_model()}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads, bf16: {bf16}"
    if torch.cuda.is_available():
        text += f"; GPU {torch.cuda.get_device_name()}"
    return text


def environment(target) -> dict:
    """The setup fields of a row: dtype, device, torch and transformers versions, hardware (``target``: any
    object with a ``dtype`` and a ``device``)."""
    return {"dtype": str(target.dtype).removeprefix("torch."), "device": str(target.device),
            "torch": torch.__version__, "transformers": version("transformers"), "hardware": describe()}
