"""llama.cpp over the embedded GGUF through llama-cpp-python (the optional ``bench`` extra): loading it
so that it runs on this CPU, and its prompt-lookup decoding beside its AR.

A wheel built for a CPU that lists AMX (``GGML_NATIVE`` on a Sapphire Rapids host, say) repacks the
weights into AMX tiles ("extra buffer types"); inside a VM that lists the AMX flags but does not run
tile instructions, its first batched ``llama_decode`` dies (SIGILL at ``tilezero``, or SIGSEGV), while
one-token evals still work. ``extra_buffers_work`` probes that once per process in a child process
(a two-token eval) and ``load`` turns the extra buffer types off where the probe dies, so the comparison
runs on such a wheel too; a wheel built without AMX (docs/speed.md) passes the probe and loads as is.
"""
from __future__ import annotations

import contextlib
import functools
import subprocess
import sys

from jetflow.engine.load import embedded_gguf

PROBE = """
import sys
from llama_cpp import Llama
llm = Llama(model_path=sys.argv[1], n_ctx=64, n_threads=1, n_threads_batch=1, verbose=False)
llm.eval(llm.tokenize(b"1 2 3 4", special=True))
"""


def bench_extra():
    """The ``llama_cpp`` package, or a ValueError that names the extra to install."""
    try:
        import llama_cpp
    except ImportError as err:
        raise ValueError('llama.cpp needs the bench extra: pip install -e ".[bench]"') from err
    return llama_cpp


@functools.cache
def extra_buffers_work(path: str) -> bool:
    """Whether a batched eval survives with llama.cpp's default (extra, repacked) weight buffers: a child
    process evaluates two tokens; a crash there (signal or error) means they must be turned off here."""
    try:
        done = subprocess.run([sys.executable, "-c", PROBE, path], capture_output=True, timeout=300)
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0


@contextlib.contextmanager
def model_params(extra_buffers: bool):
    """While open, ``Llama(...)`` loads its model with ``use_extra_bufts=extra_buffers`` (llama-cpp-python
    builds its model parameters from ``llama_model_default_params`` and has no argument for this one)."""
    from llama_cpp import llama as module
    default = module.llama_cpp.llama_model_default_params

    def params():
        p = default()
        p.use_extra_bufts = extra_buffers
        return p
    module.llama_cpp.llama_model_default_params = params
    try:
        yield
    finally:
        module.llama_cpp.llama_model_default_params = default


def load(threads: int, n_ctx: int, **kwargs):
    """``llama_cpp.Llama`` over the embedded GGUF with ``threads`` threads for decode and batches alike;
    extra weight buffers only where ``extra_buffers_work``. ``kwargs`` go to ``Llama`` (draft_model, ...)."""
    llama_cpp = bench_extra()
    path = str(embedded_gguf())
    with model_params(extra_buffers_work(path)):
        return llama_cpp.Llama(model_path=path, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                               verbose=False, **kwargs)


def load_lookup(threads: int, n_ctx: int, num_pred_tokens: int = 10):
    """llama.cpp with llama-cpp-python's own prompt-lookup drafting (``LlamaPromptLookupDecoding``)."""
    bench_extra()
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
    return load(threads, n_ctx, draft_model=LlamaPromptLookupDecoding(num_pred_tokens=num_pred_tokens),
                logits_all=True)


def version() -> str:
    return bench_extra().__version__
