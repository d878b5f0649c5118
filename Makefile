# Entry points for humans and CI. `make demo` and `make test` are the README's quick start.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup system-deps controlplane go-tools windows-agent lock test lint demo bench reliability reliability-long config-reference chart-files clean

# The dev and test tooling (licensectl_dev/) is not part of the licensectl package: this venv, and
# only this one, sees it through a .pth file naming the checkout.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,lint]'
	$(BIN)/python -c 'import pathlib, sysconfig; pathlib.Path(sysconfig.get_path("purelib"), "licensectl-dev.pth").write_text(str(pathlib.Path.cwd()) + "\n")'
	touch $@

system-deps:
	scripts/install-system-deps

# Builds kube-apiserver, kube-controller-manager, kube-scheduler, kubectl and etcd from Go modules once (cached).
controlplane: $(VENV)/.installed
	$(BIN)/python -m licensectl_dev.devcluster build

# Builds helm, the helm-unittest plugin and vmalert-tool from pinned Go modules, and the Windows guest
# agent from guest/windows, once (cached).
go-tools: $(VENV)/.installed
	$(BIN)/python -m licensectl_dev.devcluster build-tools

# The Windows guest agent alone (docs/guest.md, "Windows guests"): prints where licensectl-agent.exe is.
windows-agent: $(VENV)/.installed
	$(BIN)/python -m licensectl_dev.devcluster build-tools licensectl-agent

setup: $(VENV)/.installed system-deps controlplane go-tools

# Two pytest-xdist workers, each with its own control plane: the suite mostly waits on apiservers,
# controllers and timers (one process keeps ~0.85 of 2 cores busy), so two finish in ~2/3 of the time.
TEST_WORKERS ?= 2
test: setup
	$(BIN)/pytest -n $(TEST_WORKERS) --dist worksteal

lint: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/mypy --strict licensectl licensectl_dev

demo: setup
	$(BIN)/python -m licensectl_dev.demo --duration 120 --prometheus

bench: setup
	$(BIN)/python -m benchmarks

reliability: setup
	$(BIN)/python -m tests.faults --mode short

reliability-long: setup
	$(BIN)/python -m tests.faults --mode long

config-reference: $(VENV)/.installed
	$(BIN)/licensectl config-reference

# charts/licensectl/files/ are copies (not links) of the RBAC, alert rules, dashboard, policy and
# CRDs: run after editing any of them; tests/chart fails while a copy differs from its source.
chart-files:
	$(PYTHON) scripts/sync-chart-files

# Hash-pinned locks the Dockerfile installs from: runtime dependencies (requirements.lock) and the
# build backend (requirements-build.lock). Run after changing pyproject.toml's dependencies; existing
# pins are kept while they still satisfy it (`make lock LOCK_UPGRADE=--upgrade` moves to the newest).
PIP_TOOLS_VERSION := 7.6.2
LOCK_FLAGS := --generate-hashes --strip-extras --allow-unsafe --no-emit-index-url --no-emit-find-links \
	--no-emit-trusted-host --quiet $(LOCK_UPGRADE)
lock: $(VENV)/.installed
	$(BIN)/pip install -q 'pip-tools==$(PIP_TOOLS_VERSION)'
	$(BIN)/pip-compile $(LOCK_FLAGS) --output-file=requirements.lock pyproject.toml
	$(BIN)/pip-compile $(LOCK_FLAGS) --only-build-deps --build-deps-for=wheel \
		--output-file=requirements-build.lock pyproject.toml

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
