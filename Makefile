# Entry points for humans and CI. `make demo` and `make test` are the README's quick start.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup system-deps controlplane test lint demo bench reliability reliability-long config-reference clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,lint]'
	touch $@

system-deps:
	scripts/install-system-deps

# Builds kube-apiserver, kube-controller-manager, kubectl and etcd from Go modules once (cached).
controlplane: $(VENV)/.installed
	$(BIN)/python -m licensectl.devcluster build

setup: $(VENV)/.installed system-deps controlplane

test: setup
	$(BIN)/pytest

lint: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/mypy --strict licensectl

demo: setup
	$(BIN)/licensectl demo --duration 120 --prometheus

bench: setup
	$(BIN)/python -m benchmarks

reliability: setup
	$(BIN)/python -m tests.faults --mode short

reliability-long: setup
	$(BIN)/python -m tests.faults --mode long

config-reference: $(VENV)/.installed
	$(BIN)/licensectl config-reference

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
