#!/usr/bin/env bash
# Smoke test of a built wheel, as a user installs it: a fresh virtual environment, torch from the
# package index (this machine: local disk, capped by /etc/xdg/pip), the wheel with --no-deps, then
# `posenc` (build info + every op against the float64 reference) from a folder outside the source
# tree, so nothing can come from python/ or build/. Exits non-zero on any failure.
#
#   ci/wheel_smoke.sh [WHEEL]         default: the one wheel in dist/
#
# Environment: PYTHON (default python3), TORCH_SPEC (default torch==2.14.1), KEEP_VENV=1 keeps the
# temporary folder (its path is printed). Installing torch copies about 5 GB: run it once per wheel.
# WITH_TESTS=1 also installs the test dependencies (requirements-dev.txt's pins, torch left out) and
# runs the test suite (tests/, PYTEST_ARGS) against the installed wheel: `make test-second-torch`
# does this with the CPU-only torch 2.13.0, to show that the one wheel serves other torch versions,
# and (TRANSFORMERS_SPEC, in place of requirements-dev.txt's pin) an older transformers.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-python3}"
torch_spec="${TORCH_SPEC:-torch==2.14.1}"

if [[ $# -gt 1 ]]; then
  echo "usage: $0 [WHEEL]" >&2
  exit 2
fi
if [[ $# -eq 1 ]]; then
  wheel="$1"
else
  shopt -s nullglob
  wheels=("$here"/dist/posenc_native-*.whl)
  shopt -u nullglob
  if [[ ${#wheels[@]} -ne 1 ]]; then
    echo "wheel_smoke: expected exactly one dist/posenc_native-*.whl, found ${#wheels[@]}; pass the wheel path" >&2
    exit 2
  fi
  wheel="${wheels[0]}"
fi
if [[ ! -f "$wheel" ]]; then
  echo "wheel_smoke: no such wheel: $wheel" >&2
  exit 2
fi
wheel="$(cd "$(dirname "$wheel")" && pwd)/$(basename "$wheel")"

work="$(mktemp -d "${TMPDIR:-/tmp}/posenc-wheel-smoke.XXXXXX")"
if [[ "${KEEP_VENV:-0}" == "1" ]]; then
  echo "wheel_smoke: keeping $work"
else
  trap 'rm -rf "$work"' EXIT
fi
venv="$work/venv"

echo "== wheel: $wheel"
echo "== fresh virtual environment in $venv ($("$python" --version 2>&1))"
"$python" -m venv "$venv"
vpy="$venv/bin/python"
if [[ "${WITH_TESTS:-0}" == "1" ]]; then
  # The test dependencies, pinned as for the main run, in the same resolve as torch so that none
  # of them can move torch.
  grep -v -E '^[[:space:]]*torch([=<>!~ ;]|$)' "$here/requirements-dev.txt" > "$work/requirements-tests.txt"
  if [[ -n "${TRANSFORMERS_SPEC:-}" ]]; then  # another transformers than the pinned one
    sed -i -E "s/^[[:space:]]*transformers([=<>!~ ;].*)?$/$TRANSFORMERS_SPEC/" "$work/requirements-tests.txt"
  fi
  echo "== pip install $torch_spec + the test dependencies of requirements-dev.txt"
  "$vpy" -m pip install -q "$torch_spec" -r "$work/requirements-tests.txt"
else
  echo "== pip install $torch_spec"
  "$vpy" -m pip install -q "$torch_spec"
fi
torch_before="$("$vpy" -c 'import torch; print(torch.__version__)')"
# With its dependencies: the wheel's metadata must accept this torch as it is (pip then installs nothing more).
echo "== pip install $(basename "$wheel") (torch $torch_before)"
"$vpy" -m pip install -q "$wheel"
torch_after="$("$vpy" -c 'import torch; print(torch.__version__)')"
if [[ "$torch_after" != "$torch_before" ]]; then
  echo "wheel_smoke: installing the wheel replaced torch $torch_before with $torch_after: its torch requirement excludes $torch_before" >&2
  exit 1
fi

# Run from a folder outside the source tree, with nothing pointing back into it.
cd "$work"
unset POSENC_LIBRARY PYTHONPATH PYTHONHOME
export PYTHONNOUSERSITE=1

echo "== what the wheel installed"
"$vpy" - "$venv" <<'EOF'
import os, sys
import torch
import posenc_native
venv = os.path.realpath(sys.argv[1])
pkg = os.path.dirname(os.path.realpath(posenc_native.__file__))
lib = os.path.realpath(posenc_native.library_path())
assert pkg.startswith(venv), f"posenc_native imported from {pkg}, not from the fresh environment {venv}"
assert lib.startswith(pkg), f"op library {lib} is not the one in the installed package {pkg}"
for rel in ("include/posenc/posenc.h", "share/cmake/PosencNative/PosencNativeConfig.cmake",
            "share/cmake/PosencNative/PosencNativeTargets.cmake"):
    assert os.path.exists(os.path.join(pkg, rel)), f"the wheel lacks posenc_native/{rel}"
assert os.path.exists(os.path.join(os.path.dirname(lib), "_direct.abi3.so")), "the wheel lacks the fast path's extension"
print(f"torch {torch.__version__}, posenc_native from {pkg}")
print(f"op library {lib}, decode fast path: {posenc_native.build_info()['fast_path']}")
EOF

echo "== posenc"
"$venv/bin/posenc"
if [[ "${WITH_TESTS:-0}" == "1" ]]; then
  # The suite from the source tree, run from here: tests/ (not the repository root) lands on
  # sys.path, so posenc_native comes from the environment, as checked above.
  echo "== pytest tests/ against the installed wheel, torch $torch_after"
  # shellcheck disable=SC2086
  "$vpy" -m pytest -q -p no:cacheprovider --rootdir "$here" "$here/tests" ${PYTEST_ARGS:-}
fi
echo "== wheel smoke test passed"
