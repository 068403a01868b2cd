# Quick start: `make demo` (install + run the bundled demo), `make test` (install + all checks).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip

.PHONY: demo test lint install install-test bench

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

install: $(BIN)/python
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e .

install-test: $(BIN)/python
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[test,torchtitan,trainer,report,testing,bench,parquet,multimodal,s3,http]'

demo: install
	$(BIN)/zephon demo

lint: install-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

test: lint
	HYPOTHESIS_PROFILE=ci $(BIN)/python -m pytest

# Benchmarks side by side with Grain / TorchTitan / torchdata.nodes (see docs/performance.md).
# The Python docs (English text for the corpus) are optional: without them only stdlib code.
bench: install-test
	-DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3.11-doc
	$(BIN)/python -m benchmarks.run --json bench-results.json
