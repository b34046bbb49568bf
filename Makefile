# gptmini — `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV ?= .venv
PY := $(VENV)/bin/python
# The torch wheel; where no CUDA GPU is found it comes from TORCH_INDEX (PyTorch's CPU-only wheels; empty: the
# configured registry), or from the configured registry when TORCH_INDEX does not answer within 5 s.
TORCH ?= torch==2.13.0
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
ARGS ?=
CKPT ?= last
PROMPT ?= ROMEO:
TEXT ?= ROMEO: But soft, what light through yonder window breaks?
YES ?=
PORT ?= 6006
STAMP := $(VENV)/.installed

.PHONY: help install data train sample attention analyze tensorboard test test-slow test-full bench bench-tokenizers gpu-check lint format clean

help: ## Show this help (target names in colour on a terminal only)
	@if [ -t 1 ]; then on=$$'\033[36m' off=$$'\033[0m'; else on= off=; fi; \
	awk -v on="$$on" -v off="$$off" 'BEGIN {FS = ":.*## "; printf "Usage: make <target> [ARGS=\"hydra overrides\"]\n\n"} \
		/^[a-zA-Z_-]+:.*## / {printf "  %s%-17s%s %s\n", on, $$1, off, $$2}' $(MAKEFILE_LIST)

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	@if nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then \
		echo "a CUDA GPU found: $(TORCH), its CUDA build (about 3 GB to download; .venv about 6 GB)"; \
		index=; \
	elif [ -n "$(TORCH_INDEX)" ] && $(PY) -c 'import sys, urllib.request as u; u.urlopen(sys.argv[1], timeout=5)' \
		"$(TORCH_INDEX)" 2>/dev/null; then \
		echo "no CUDA GPU found: $(TORCH), its CPU build from $(TORCH_INDEX) (about 200 MB to download; .venv about 2 GB)"; \
		index="--index-url $(TORCH_INDEX)"; \
	else \
		echo "no CUDA GPU found$(if $(TORCH_INDEX), and $(TORCH_INDEX) not reachable): $(TORCH) from pip's configured" \
			"index (PyPI's Linux x86-64 wheel is the CUDA build: about 3 GB to download)"; \
		index=; \
	fi; \
	echo "$(PY) -m pip install $${index:+$$index }\"$(TORCH)\""; \
	$(PY) -m pip install $$index "$(TORCH)"
	@echo "installing gptmini with its dev extras"
	PYTHONWARNINGS="ignore:Editable installation" $(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

install: $(STAMP) ## Create .venv and install gptmini with its dev extras
	@echo "installed into $(VENV)"

data: $(STAMP) ## Prepare the data `make train` reads, without training; same ARGS, e.g. ARGS="data=fineweb"
	$(VENV)/bin/gptmini data $(ARGS)

train: $(STAMP) ## Train (default: small GPT on embedded Shakespeare); overrides via ARGS="key=value ..."
	$(VENV)/bin/gptmini train $(ARGS)

sample: $(STAMP) ## Generate from a checkpoint: CKPT=path|last PROMPT="..." ARGS="--max-new-tokens 200"
	$(VENV)/bin/gptmini sample --ckpt "$(CKPT)" --prompt "$(PROMPT)" $(ARGS)

attention: $(STAMP) ## Attention maps of a checkpoint as PNG, a new outputs/attention_png/N/ per call: CKPT=path|last TEXT="..."
	$(VENV)/bin/gptmini attention --ckpt "$(CKPT)" --text "$(TEXT)" $(ARGS)

analyze: $(STAMP) ## Head report of a checkpoint (report.html + report.json): CKPT=path|last ARGS="--out DIR"
	$(VENV)/bin/gptmini analyze --ckpt "$(CKPT)" $(ARGS)

tensorboard: $(STAMP) ## Open TensorBoard on every run under outputs/: PORT=6006
	$(VENV)/bin/gptmini board --logdir outputs --port $(PORT)

# one pytest-xdist worker per core; a test file's tests stay on one worker, so its module fixtures run once
PYTEST_PARALLEL = -n auto --dist loadfile

test: $(STAMP) ## Fast test suite (what CI runs)
	$(PY) -m pytest -m "not slow" -q $(PYTEST_PARALLEL)

test-slow: $(STAMP) ## The slow tests alone (what `make test` leaves out: processes, DDP, long runs)
	$(PY) -m pytest -m slow -q $(PYTEST_PARALLEL)

test-full: $(STAMP) ## Every test, the slow ones too
	$(PY) -m pytest -q $(PYTEST_PARALLEL)

bench: $(STAMP) ## Benchmarks: attention, training, host cost per step, the whole run, generation, data, the attention tab, runs (tables in results/)
	$(PY) scripts/bench.py $(ARGS)

bench-tokenizers: $(STAMP) ## Tokenizers by bits per byte at equal training time (ARGS="--seconds 300", "--quick")
	$(PY) -m benchmarks.tokenizers $(ARGS)

gpu-check: $(STAMP) ## The GPU proof (results/gpu.md); ARGS="--nanogpt DIR --tinyshakespeare FILE" adds the speedrun against nanoGPT
	$(PY) -m benchmarks.gpu $(ARGS)

lint: $(STAMP) ## Ruff lint and format check
	$(VENV)/bin/ruff check gptmini benchmarks scripts tests
	$(VENV)/bin/ruff format --check gptmini benchmarks scripts tests

format: $(STAMP) ## Apply ruff's fixes and formatting
	$(VENV)/bin/ruff check --fix gptmini benchmarks scripts tests
	$(VENV)/bin/ruff format gptmini benchmarks scripts tests

clean: ## Remove caches; then list outputs/, data/ and results/ with their sizes and ask before deleting them (YES=1: no question)
	rm -rf .pytest_cache .ruff_cache
	find . -name __pycache__ -type d -not -path "./$(VENV)/*" -exec rm -rf {} +
	@paths=$$( { ls -d outputs results 2>/dev/null; find data -mindepth 1 -maxdepth 1 ! -name README.md 2>/dev/null; } ); \
	if [ -z "$$paths" ]; then echo "no runs, prepared data or results to delete"; exit 0; fi; \
	echo "the runs, prepared data and results (gptmini runs --prune removes only the checkpoints no longer needed):"; \
	du -sh -- $$paths; \
	if [ "$(YES)" != 1 ]; then \
		read -r -p "delete them? [y/N] " answer || answer=; \
		case "$$answer" in y|Y|yes) ;; *) echo "nothing deleted"; exit 0;; esac; \
	fi; \
	rm -rf -- $$paths && echo "deleted"
