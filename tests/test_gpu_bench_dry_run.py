"""The GPU benchmark's code paths, dry-run on the CPU with tiny sizes, so a GPU session does not
spend its minutes on a Python error. Speed is not checked here."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_bench_gpu_dry_run_on_cpu(tmp_path):
    out = tmp_path / "bench.md"
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_gpu.py"), "--device", "cpu", "--tokens", "64",
                          "--table-len", "64", "--x-seq", "64", "--out", str(out)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    table = out.read_text()
    for row in ("ours out-of-place (yarn)", "ours in-place (default)", "transformers torch.compile (default)",
                "ours sinusoidal_table", "ours add_sinusoidal"):
        assert row in table
