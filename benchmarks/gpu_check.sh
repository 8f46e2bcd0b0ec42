#!/usr/bin/env bash
# The GPU check: run on the H200 machine through the device tool, from the repository root.
#   install the prebuilt wheel carried in dist/ (`make build` here; on LibTorch's stable ABI it loads
#   into the machine's own torch), or, when none fits (none carried, several, or it does not load
#   or has no kernels for this GPU), build from source (no network: --no-build-isolation against the
#   machine's torch; POSENC_GPU_FROM_SOURCE=1 forces this); run the CUDA tests, benchmark against the
#   PyTorch reference, torch.compile, Liger-Kernel (when carried) and a device copy, and profile where
#   each op call's time goes (benchmarks/gpu_profile.py: kernels, copies, host syncs). Everything lands
#   under $OUT (summary.txt first).
# Optional wheels (liger-kernel, expecttest) travel in .whl/ (see benchmarks/README.md).
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
summary="$OUT/summary.txt"
say() { echo "$*" | tee -a "$summary"; }
step() {  # step NAME CMD...: run, log to $OUT/NAME.log, record status and time
  local name=$1; shift
  local t0=$(date +%s)
  "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  say "$(printf '%-10s rc=%-3s %4ss' "$name" "$rc" "$(( $(date +%s) - t0 ))")"
  tail -n 25 "$OUT/$name.log"
  return $rc
}

say "== posenc gpu_check $(date -u +%FT%TZ) on $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null)"
say "python $(python3 -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)')"

if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi

# Does the installed package fit this machine: it imports, its CUDA kernel library is loaded and has
# code for this GPU (one op runs on it).
FITS='
import torch, posenc_native as pn
info = pn.build_info()
print(info)
assert torch.cuda.is_available(), "torch sees no GPU"
assert info["cuda_library"], "the CUDA kernel library was not loaded"
cap, archs = "%d%d" % torch.cuda.get_device_capability(), info["cuda_archs"]
assert any(a.split("-")[0] == cap for a in archs), f"no sm_{cap} code in {archs}"
t = torch.ops.posenc.sinusoidal_table(torch.arange(8, device="cuda"), 16, 1e4, True, 0.0, 1.0, False, torch.float32)
torch.cuda.synchronize()
assert t.is_cuda and t.abs().max().item() > 0.5
'
shopt -s nullglob
wheels=(dist/posenc_native-*.whl)
shopt -u nullglob
how=""
if [[ "${POSENC_GPU_FROM_SOURCE:-0}" == 1 ]]; then
  say "POSENC_GPU_FROM_SOURCE=1: building from source"
elif [[ ${#wheels[@]} -ne 1 ]]; then
  say "${#wheels[@]} wheels in dist/ (carry exactly one: carry [\"dist\"] after make build): building from source"
elif step install python3 -m pip install --no-index --no-deps --force-reinstall "${wheels[0]}" \
     && (cd /tmp && step fits python3 -c "$FITS"); then
  how="prebuilt wheel ${wheels[0]##*/}"
else
  say "the wheel ${wheels[0]##*/} does not fit this machine (see install.log, fits.log): building from source"
fi
if [[ -z "$how" ]]; then
  # One arch is enough here and halves the build.
  export POSENC_CUDA=ON POSENC_CUDA_ARCHS=${POSENC_CUDA_ARCHS:-90}
  step build python3 -m pip install -v --no-build-isolation --no-deps --force-reinstall . || { say "build failed"; exit 1; }
  how="built from source"
fi
say "op library: $how"
step selfcheck python3 -m posenc_native
step tests python3 -m pytest -q -p no:cacheprovider tests/test_rope.py tests/test_sinusoidal.py \
  tests/test_compile_export.py tests/test_adversarial.py tests/test_relative_bias.py tests/test_mrope.py \
  -k "cuda or precision or opcheck or reduce_overhead" --hypothesis-seed=0
step bench python3 benchmarks/bench_gpu.py --out "$OUT/bench.md"
step profile python3 benchmarks/gpu_profile.py --out "$OUT/profile.md"
# Out-of-bounds and misaligned device accesses in every kernel the selfcheck reaches (RoPE, MRoPE,
# sinusoidal, T5/ALiBi bias, forward and backward). Without the caching allocator each tensor is its
# own allocation, so a read past a tensor's end is caught, not hidden inside a pooled block.
SANITIZER=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -n 1)
if [[ -n "$SANITIZER" ]]; then
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 step memcheck timeout 150 "$SANITIZER" --tool memcheck \
    --error-exitcode 3 python3 -m posenc_native
else
  say "memcheck   skipped: no compute-sanitizer"
fi
# (a CPU dry run of the benchmark code: python3 benchmarks/bench_gpu.py --device cpu --tokens 256 --table-len 256 --x-seq 256)
# The device tool brings back at most 8 files: the logs travel as one archive.
(cd "$OUT" && tar -czf logs.tar.gz ./*.log && rm -f ./*.log)
say "done"
