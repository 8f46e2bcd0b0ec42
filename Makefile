# The two README commands: `make run` (the main job) and `make test` (the test suite).
# Each sets up everything itself, idempotently: a virtual environment, pinned packages, the build.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
DEPS_STAMP := $(VENV)/.posenc-deps

.PHONY: run test build bench coverage clean
.DEFAULT_GOAL := test

$(DEPS_STAMP): requirements-dev.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements-dev.txt
	touch $@

# Builds the wheel (incrementally: scikit-build-core keeps build/<tag>) and installs it, so tests
# and `posenc` run against the installed package, as users get it.
build: $(DEPS_STAMP)
	rm -rf dist
	$(BIN)/python -m pip wheel -q --no-build-isolation --no-deps -w dist .
	$(BIN)/python -m pip install -q --no-deps --force-reinstall dist/posenc_native-*.whl

run: build
	$(BIN)/posenc

# Then the wheel as a user gets it: a fresh venv, torch, the wheel, `posenc` (skip: POSENC_SKIP_WHEEL_SMOKE=1).
test: build
	$(BIN)/python -m pytest -q tests
	@if [ "$${POSENC_SKIP_WHEEL_SMOKE:-0}" != 1 ]; then PYTHON=$(PYTHON) bash ci/wheel_smoke.sh; fi

bench: build
	$(BIN)/python benchmarks/bench_cpu.py

# Every transformers model family with a rotary class, patched vs unpatched (tiny random models);
# writes docs/transformers_coverage.md. POSENC_UPDATE_COVERAGE=1 also rewrites the verified list.
coverage: build
	POSENC_COVERAGE=1 $(BIN)/python -m pytest -q tests/test_transformers_coverage.py

clean:
	rm -rf build dist
