# The two README commands: `make run` (the main job) and `make test` (the test suite).
# Each sets up everything itself, idempotently: a virtual environment, pinned packages, the build.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
DEPS_STAMP := $(VENV)/.posenc-deps

.PHONY: run test build bench coverage clean sanitize test-second-torch test-oldest-torch test-newest-torch
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

# The wheel file `make test` built (dist/, not rebuilt) in a fresh virtual environment with another
# torch, the CPU-only 2.13.0 by default, and the test suite there: one wheel serves every torch in
# the range of pyproject.toml, CUDA build or not (ci/wheel_smoke.sh, WITH_TESTS=1). With it an
# older transformers, 5.23: the last whose GPT-J and CodeGen rotate inside their attention, and one
# that does not require `kernels` (plain rotation functions), so those paths stay tested too.
SECOND_TORCH ?= torch==2.13.0
SECOND_TRANSFORMERS ?= transformers==5.23.0
test-second-torch:
	WITH_TESTS=1 TORCH_SPEC=$(SECOND_TORCH) TRANSFORMERS_SPEC=$(SECOND_TRANSFORMERS) PYTHON=$(PYTHON) bash ci/wheel_smoke.sh

# The same wheel file and suite with the oldest torch the wheel accepts (pyproject.toml's torch>=2.11,
# the stable ABI's target; a CUDA build, the only 2.11 on the package index): the floor of the range,
# which users of older clusters have.
OLDEST_TORCH ?= torch==2.11.0
test-oldest-torch:
	WITH_TESTS=1 TORCH_SPEC=$(OLDEST_TORCH) PYTHON=$(PYTHON) bash ci/wheel_smoke.sh

# The same wheel file and suite with the newest torch release (a CUDA build from the package index),
# as a user who installs torch today gets it: the newest end of the range. PIP_CONSTRAINT=/dev/null
# in place of this machine kind's pip constraints, which cap torch at 2.14.1 (the files on its disk).
NEWEST_TORCH ?= torch==2.15.0
test-newest-torch:
	PIP_CONSTRAINT=/dev/null WITH_TESTS=1 TORCH_SPEC=$(NEWEST_TORCH) PYTHON=$(PYTHON) bash ci/wheel_smoke.sh

# The CPU op library built with AddressSanitizer and UndefinedBehaviorSanitizer (build/sanitize, its
# own build dir), and the RoPE, sinusoidal, adversarial, element-by-element, decode fast path (direct entry),
# determinism (the angle stream's anchors, steps and per-thread tables), MRoPE and CPU-path tests run
# against it. Python and torch are not instrumented, so libasan is preloaded; leak checks are off
# (CPython and torch keep allocations until exit). Any ASan report aborts, and UBSan does too (-fno-sanitize-recover): the run fails.
SAN_DIR := build/sanitize
SAN_CXX ?= c++
SAN_FLAGS := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
SAN_TESTS ?= tests/test_rope.py tests/test_sinusoidal.py tests/test_adversarial.py tests/test_decode_fast_path.py \
	tests/test_elementwise.py tests/test_determinism.py tests/test_mrope.py tests/test_cpu_paths.py
SAN_ENV = LD_PRELOAD="$$($(SAN_CXX) -print-file-name=libasan.so) $$($(SAN_CXX) -print-file-name=libubsan.so)" \
	ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:halt_on_error=1:detect_odr_violation=0:alloc_dealloc_mismatch=0 \
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	POSENC_LIBRARY=$(CURDIR)/$(SAN_DIR)/libposenc_ops.so PYTHONPATH=$(CURDIR)/python
sanitize: $(DEPS_STAMP)
	$(BIN)/cmake -S . -B $(SAN_DIR) -G Ninja -DCMAKE_MAKE_PROGRAM=$(abspath $(BIN))/ninja \
		-DPython_EXECUTABLE=$(abspath $(BIN))/python -DPOSENC_CUDA=OFF -DCMAKE_BUILD_TYPE=Release \
		-DCMAKE_CXX_COMPILER=$(SAN_CXX) "-DCMAKE_CXX_FLAGS=$(SAN_FLAGS)" >/dev/null
	$(BIN)/cmake --build $(SAN_DIR) -j2
	@# --capture=sys: a sanitizer report (written to fd 2, then abort) must reach the log
	$(SAN_ENV) $(BIN)/python -m pytest -q -p no:cacheprovider --capture=sys $(SAN_TESTS)

bench: build
	$(BIN)/python benchmarks/bench_cpu.py

# Every transformers model family with a rotary class, patched vs unpatched (tiny random models);
# writes docs/transformers_coverage.md. POSENC_UPDATE_COVERAGE=1 also rewrites the verified list.
coverage: build
	POSENC_COVERAGE=1 $(BIN)/python -m pytest -q tests/test_transformers_coverage.py

clean:
	rm -rf build dist
