"""benchmarks/bench_cpu.py --quick runs and prints its table (speed is not asserted here)."""
from __future__ import annotations

import os
import platform
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_cpu.py"


def run_bench(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    return subprocess.run([sys.executable, str(BENCH), "--quick", *args], capture_output=True, text=True,
                          timeout=600, env=env, cwd=BENCH.parent.parent)  # the command line it prints is relative to cwd


def table_rows(stdout: str) -> list[str]:
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("benchmark") and "ratio" in line)
    assert set(lines[start + 1].replace(" ", "")) == {"-"}
    rows = []
    for line in lines[start + 2:]:
        if not line.strip():
            break
        rows.append(line)
    return rows


@pytest.mark.skipif(not BENCH.exists(), reason="benchmarks/ not in this tree")
def test_bench_quick_sinusoidal():
    proc = run_bench("--only", "sinusoidal")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "command:  python benchmarks/bench_cpu.py --quick --only sinusoidal" in out
    assert "machine:" in out and "cores" in out and "torch threads" in out
    import posenc_native as pn
    assert f"library:  {pn.build_info()['library']}" in out  # the build measured (and whether it is stale)
    rows = table_rows(out)
    names = " ".join(rows)
    for what in ("sinusoidal_table", "seed pure-PyTorch table", "torch.empty + fill_", "add_sinusoidal",
                 "eager x + pe[:, :S]", "x.clone()"):
        assert what in names, f"{what!r} missing from the table:\n{out}"
    assert not any(r.startswith("rope") for r in rows)
    assert sum(r.rstrip().endswith(("PASS", "MISS")) for r in rows) == 3
    assert "goals met" in out


@pytest.mark.skipif(not BENCH.exists(), reason="benchmarks/ not in this tree")
def test_bench_quick_rope():
    pytest.importorskip("transformers")
    # The compiled baseline is skipped here: inductor's C++ compile would dominate a smoke test.
    proc = run_bench("--only", "rope", "--no-compile")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = table_rows(proc.stdout)
    names = " ".join(rows)
    for what in ("rope default", "rope yarn", "half-split", "interleaved", "in-place", "out-of-place",
                 "q.mul_(c); k.mul_(c)", "q * c, k * c", "transformers eager", "float32", "bfloat16", "float16"):
        assert what in names, f"{what!r} missing from the table:\n{proc.stdout}"
    assert not any(r.startswith("sinusoidal") for r in rows)
    assert "CPU path:" in proc.stdout


@pytest.mark.skipif(not BENCH.exists(), reason="benchmarks/ not in this tree")
def test_bench_warns_when_the_library_is_older_than_the_sources(tmp_path):
    """An op library older than a build input of the checkout (an installed wheel not rebuilt since the
    kernels changed) is named in the header as such; as new, or without a checkout, nothing is said."""
    sys.path.insert(0, str(BENCH.parent))
    try:
        from bench_cpu import stale_build_warning
    finally:
        sys.path.remove(str(BENCH.parent))
    checkout = tmp_path / "checkout"
    (checkout / "csrc" / "cpu").mkdir(parents=True)
    kernel, cmake = checkout / "csrc" / "cpu" / "rows.h", checkout / "CMakeLists.txt"
    kernel.write_text("// kernel")
    cmake.write_text("project(x)")
    library = tmp_path / "libposenc_ops.so"
    library.write_bytes(b"\x7fELF")
    os.utime(cmake, (1_000_000, 1_000_000))
    os.utime(library, (2_000_000, 2_000_000))
    os.utime(kernel, (2_000_000 + 600, 2_000_000 + 600))  # edited 10 minutes after the build
    warning = stale_build_warning(str(library), checkout)
    assert warning is not None and "10 min older than csrc/cpu/rows.h" in warning and "make build" in warning
    os.utime(kernel, (1_500_000, 1_500_000))
    assert stale_build_warning(str(library), checkout) is None
    os.utime(cmake, (3_000_000, 3_000_000))
    assert "CMakeLists.txt" in stale_build_warning(str(library), checkout)
    assert stale_build_warning(str(library), tmp_path / "no checkout here") is None


@pytest.mark.skipif(not BENCH.exists(), reason="benchmarks/ not in this tree")
def test_bench_quick_decode():
    proc = run_bench("--only", "decode", "--threads", "1", "--clock", "cpu")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = table_rows(proc.stdout)
    names = " ".join(rows)
    for what in ("decode B=1 ", "decode B=64 ", "apply_rope_(inv_freq=)", "apply_rope_(config=llama3)",
                 "RotaryEmbedding(cfg)", "q.mul_(c); k.mul_(c)"):
        assert what in names, f"{what!r} missing from the table:\n{proc.stdout}"


@pytest.mark.skipif(not BENCH.exists(), reason="benchmarks/ not in this tree")
def test_bench_quick_vmap():
    proc = run_bench("--only", "vmap", "--threads", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    names = " ".join(table_rows(proc.stdout))
    for what in ("vmap V=8 ", "vmap V=64 ", "8 calls in a loop", "one call on [V*B, ...]"):
        assert what in names, f"{what!r} missing from the table:\n{proc.stdout}"


MROPE_BENCH = BENCH.parent / "bench_mrope.py"


@pytest.mark.skipif(not MROPE_BENCH.exists(), reason="benchmarks/ not in this tree")
def test_bench_mrope_quick():
    proc = subprocess.run([sys.executable, str(MROPE_BENCH), "--quick", "--no-compile"], capture_output=True,
                          text=True, timeout=600, env=dict(os.environ))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    names = " ".join(table_rows(proc.stdout))
    for what in ("mrope_ in place", "transformers Qwen2-VL eager", "our plain RoPE in place", "mrope out of place"):
        assert what in names, f"{what!r} missing from the table:\n{proc.stdout}"
    assert "ratio range over rounds" in proc.stdout and "goals met" in proc.stdout


MICRO = BENCH.parent / "micro"


@pytest.mark.skipif(not MICRO.exists(), reason="benchmarks/ not in this tree")
@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64") or shutil.which("g++") is None,
                    reason="the row microbenchmarks are x86-64 (AVX2) programs built with g++")
@pytest.mark.parametrize("name", ["rope_rows.cpp", "rows_from_dram.cpp"])
def test_micro_benchmark_builds_with_its_documented_command(name, tmp_path):
    """Each C++ microbenchmark builds with the g++ command in its header, from the repository root
    (rows_from_dram.cpp includes the library's own csrc/cpu/simd_rows.h, so this catches a kernel
    change that would leave it stale)."""
    source = MICRO / name
    commands = [line.strip("/ ").strip() for line in source.read_text().splitlines()
                if line.startswith("//") and line.strip("/ ").startswith("g++ ")]
    assert len(commands) == 1, f"{name}: expected one g++ command in its header, found {commands}"
    argv = shlex.split(commands[0])
    out = argv.index("-o")
    argv[out + 1] = str(tmp_path / "micro")
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=BENCH.parent.parent)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "micro").stat().st_size > 0


@pytest.mark.skipif(not MICRO.exists(), reason="benchmarks/ not in this tree")
@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64") or shutil.which("g++") is None,
                    reason="the row microbenchmarks are x86-64 (AVX2) programs built with g++")
def test_folded_reads_builds_with_its_documented_commands(tmp_path):
    """folded_reads.cpp builds with the shell lines in its header (copies of csrc with the folded
    reads forced on and off, four kernel objects and the program), and its sed lines do force them."""
    source = MICRO / "folded_reads.cpp"
    lines = [line[len("//   "):] for line in source.read_text().splitlines()
             if line.startswith("//   ") and not line.startswith("//    ")]
    script = "\n".join(line for line in lines if not line.startswith("taskset"))
    assert "D=/tmp/folded_reads;" in script, script
    script = script.replace("D=/tmp/folded_reads;", f"D={tmp_path};")
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True,
                          timeout=600, cwd=BENCH.parent.parent)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "folded_reads").stat().st_size > 0
    for copy, value in (("on", "true"), ("off", "false")):
        header = (tmp_path / copy / "cpu" / "simd_rows.h").read_text()
        assert header.count(f"constexpr bool kFoldFloatReads = {value};") == 2, copy  # both branches of its #if


E2E = BENCH.parent / "bench_e2e.py"


@pytest.mark.skipif(not E2E.exists(), reason="benchmarks/ not in this tree")
def test_bench_e2e_quick_vision_tower():
    """bench_e2e.py's vision tower case runs (16x16 patches) and its patched outputs agree with the
    unpatched ones it reports."""
    pytest.importorskip("transformers")
    proc = subprocess.run([sys.executable, str(E2E), "--quick", "--only", "qwen3-vl-tower"], capture_output=True,
                          text=True, timeout=600, env=dict(os.environ), cwd=E2E.parent.parent)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = next(line for line in proc.stdout.splitlines() if line.startswith("forward ms"))
    diff = float(line.split("differ by at most ")[1].split(" ")[0])
    scale = float(line.split("largest output ")[1].rstrip(")"))
    assert diff <= 1e-4 * max(1.0, scale), line


COMPILED_INPLACE = BENCH.parent / "bench_compiled_inplace.py"


@pytest.mark.skipif(not COMPILED_INPLACE.exists(), reason="benchmarks/ not in this tree")
def test_bench_compiled_inplace_quick():
    """bench_compiled_inplace.py --quick prints its four rows, and the compiled in-place rotations it
    timed (static and dynamic shapes) agree with eager's."""
    proc = subprocess.run([sys.executable, str(COMPILED_INPLACE), "--quick"], capture_output=True, text=True,
                          timeout=600, env=dict(os.environ), cwd=COMPILED_INPLACE.parent.parent)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for row in ("in-place floor (two mul_)", "eager apply_rope_", "compiled apply_rope_", "compiled dynamic apply_rope_"):
        assert any(line.startswith(row) and "x floor" in line for line in proc.stdout.splitlines()), proc.stdout
    line = next(line for line in proc.stdout.splitlines() if line.startswith("compiled results vs eager"))
    assert float(line.rsplit(" ", 1)[1]) <= 1e-5, line


STREAM_ACCURACY = BENCH.parent / "stream_accuracy.py"


@pytest.mark.skipif(not STREAM_ACCURACY.exists(), reason="benchmarks/ not in this tree")
def test_stream_accuracy_reports_errors_within_the_contract():
    """stream_accuracy.py runs and the errors it prints (which docs/architecture.md cites) are within
    the cos/sin contract (~3.5e-7 for the rotated rows)."""
    proc = subprocess.run([sys.executable, str(STREAM_ACCURACY)], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ), cwd=STREAM_ACCURACY.parent.parent)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    errors = [float(line.rsplit(" ", 1)[1]) for line in proc.stdout.splitlines() if "max abs error" in line]
    assert len(errors) == 2 and all(0 < e <= 3.5e-7 for e in errors), proc.stdout


PAIRING_RATIO = MICRO / "pairing_ratio.py"


@pytest.mark.skipif(not PAIRING_RATIO.exists(), reason="benchmarks/ not in this tree")
def test_pairing_ratio_runs_and_reports_both_pairings():
    """pairing_ratio.py (which benchmarks/RESULTS.md cites) times the floor and both pairings and
    prints each ratio, for the median and the minimum."""
    proc = subprocess.run([sys.executable, str(PAIRING_RATIO), "--seq", "16", "--rounds", "5"], capture_output=True,
                          text=True, timeout=600, env=dict(os.environ))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [line for line in proc.stdout.splitlines() if "interleaved / half-split" in line]
    assert [line.split()[0] for line in lines] == ["median", "min"], proc.stdout
    for line in lines:
        ratio = float(line.rsplit(" ", 1)[1])
        assert 0 < ratio < 100, line
