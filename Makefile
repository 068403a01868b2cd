# Quick start: `make demo` (install + run the bundled demo), `make test` (install + all checks).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip

.PHONY: demo test lint install install-test

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

install: $(BIN)/python
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e .

install-test: $(BIN)/python
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[test,torchtitan,trainer,report,testing,parquet]'

demo: install
	$(BIN)/zephon demo

lint: install-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

test: lint
	HYPOTHESIS_PROFILE=ci $(BIN)/python -m pytest
