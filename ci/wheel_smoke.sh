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
echo "== pip install $torch_spec"
"$vpy" -m pip install -q "$torch_spec"
echo "== pip install --no-deps $(basename "$wheel")"
"$vpy" -m pip install -q --no-deps "$wheel"

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
print(f"torch {torch.__version__}, posenc_native from {pkg}")
print(f"op library {lib}")
EOF

echo "== posenc"
"$venv/bin/posenc"
echo "== wheel smoke test passed"
