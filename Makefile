# Set-up and checks. `make demo` and `make test` work on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_VERSION := 2.13.0
LIGHTNING_VERSION := 2.6.6

.PHONY: demo test test-slow lint typecheck unit docs venv clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	# torch (and lightning) first, pinned: the tested versions, and no multi-GB CUDA download
	# where a CPU build is at hand
	$(PY) -m pip install -q torch==$(TORCH_VERSION) lightning==$(LIGHTNING_VERSION)

venv: $(PY)

$(VENV)/.demo-installed: $(PY) pyproject.toml
	$(PY) -m pip install -q -e ".[demo]"
	touch $@

$(VENV)/.dev-installed: $(PY) pyproject.toml
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

# the reports go to runs/demo/<scenario>/ (the README's samples name these paths); the demo
# ends by printing what to type next, through $(VENV) (which `make` does not activate)
demo: $(VENV)/.demo-installed
	$(PY) -m lightning_triage demo --report-root runs/demo

lint: $(VENV)/.dev-installed
	$(PY) -m ruff check src tests docs benchmarks examples
	$(PY) -m mypy

# the whole suite, slow tests included, on one worker per (logical) core, at most 4 (each holds
# torch and its fits), a test file per worker, naming the 30 slowest tests. The quick loop while
# developing, seed 0 only: .venv/bin/python -m pytest -m "not slow" -n logical
unit: $(VENV)/.dev-installed
	$(PY) -m pytest -q -n logical --maxprocesses=4 --dist loadfile --durations=30

# the documentation site, strictly (any warning fails): output in site/
docs: $(VENV)/.dev-installed
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --quiet

# the docs site is built (strictly) once, by the suite's tests/test_docs.py
test: lint unit

# the real-trajectory tests on more seeds alone (`make test` runs them too)
test-slow: $(VENV)/.dev-installed
	$(PY) -m pytest -q -n logical --maxprocesses=4 --dist loadfile -m slow

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build dist site
