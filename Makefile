# NInfer — two commands do all set-up:
#   make serve   venv + install + model fetch (once, with a progress bar) + serve on 127.0.0.1:50051
#   make test    venv + install + model fetch + the import contracts (lint-imports) + the test suite
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU wheel of torch 2.13.0 is what this project is developed and tested with; installing it
# before xgrammar keeps pip from pulling a multi-GB CUDA build. Override on GPU machines.
TORCH_SPEC ?= torch==2.13.0
SERVE_ARGS ?=
PYTEST_ARGS ?=
# Test files run on this many worker processes (pytest-xdist, a file's tests stay on one worker so its
# module fixtures, e.g. a started stack, are shared); 0 runs them in this process.
PYTEST_WORKERS ?= 2

.PHONY: setup serve test bench-cpu protos clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -e ".[test]"
	touch $@

$(VENV)/.model: $(VENV)/.installed
	$(BIN)/python -m gpu_engine.hub.fetch
	touch $@

setup: $(VENV)/.model

serve: setup
	$(BIN)/ninfer serve $(SERVE_ARGS)

test: setup
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

bench-cpu: setup
	$(BIN)/python bench/cpu_bench.py

protos: $(VENV)/.installed
	$(BIN)/python tools/gen_protos.py

clean:
	rm -rf $(VENV) .pytest_cache
