# disagg: every target sets up what it needs itself.
#   make demo   - the main job on a local default
#   make test   - lint + unit + cluster + engine tests
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
CACHE ?= $(HOME)/.cache/disagg
export DISAGG_CACHE := $(CACHE)

.PHONY: venv test test-unit lint crds demo

## ---- Python environment -------------------------------------------------
$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

venv: $(BIN)/.installed

## ---- Quality -------------------------------------------------------------
lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

crds: venv
	$(BIN)/python -m disagg_operator.crd_gen --write
	$(BIN)/python -m disagg_operator.reference --write

## ---- Tests -----------------------------------------------------------------
test-unit: venv
	$(BIN)/pytest tests/unit

test: lint test-unit

## ---- Demo ------------------------------------------------------------------
demo: venv
	$(BIN)/disagg render -f examples/qwen3-32b-p5en.yaml --summary
