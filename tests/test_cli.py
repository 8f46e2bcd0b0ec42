"""The `posenc` command (python -m posenc_native): the main job's self-check table and `plot sinusoidal`."""
from __future__ import annotations

import os
import struct
import subprocess
import sys
import textwrap

import pytest

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run_posenc(*args: str, code: str | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run `python -m posenc_native ARGS` (or `python -c CODE`) with this process's environment, so a
    source-tree run (PYTHONPATH / POSENC_LIBRARY) and an installed run both test what pytest tests."""
    cmd = [sys.executable, "-c", code] if code is not None else [sys.executable, "-m", "posenc_native", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=dict(os.environ))


def test_main_job_prints_table_and_passes():
    proc = run_posenc()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "posenc-native build:" in out
    for key in ("version", "torch", "cuda", "cuda_archs", "library"):
        assert f"  {key} " in out
    header = next(line for line in out.splitlines() if line.startswith("op "))
    for column in ("device", "dtype", "rel error", "tolerance", "result"):
        assert column in header
    rows = [line.split() for line in out.splitlines() if line.split()[:1] in (["sinusoidal_table"], ["add_sinusoidal"])]
    for op in ("sinusoidal_table", "add_sinusoidal"):
        for dtype in ("float32", "float16", "bfloat16"):
            assert any(r[0] == op and r[1] == "cpu" and r[2] == dtype and r[-1] == "pass" for r in rows), \
                f"no passing cpu/{dtype} row for {op}:\n{out}"
    for op in ("rope (mrope, qwen2-vl)", "rope_ in place (qwen3-vl)"):  # MRoPE: [3, B, S] positions
        for dtype in ("float32", "float16", "bfloat16"):
            assert any(line.startswith(op) and line[26:].split()[:2] == ["cpu", dtype] and line.endswith("pass")
                       for line in out.splitlines()), f"no passing cpu/{dtype} row for {op}:\n{out}"
    assert "FAIL" not in out
    assert " 0 failed" in out.splitlines()[-1]


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == PNG_MAGIC, data[:8]
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_plot_sinusoidal(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "sinusoidal.png"
    proc = run_posenc("plot", "sinusoidal", "--out", str(out), "--length", "64", "--dim", "48")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert str(out) in proc.stdout
    data = out.read_bytes()
    width, height = _png_size(data)
    assert width >= 200 and height >= 200
    assert len(data) > 10_000, f"suspiciously small PNG ({len(data)} bytes)"
    # Not a blank canvas: the heat map has many distinct colours.
    import matplotlib.image

    img = matplotlib.image.imread(str(out))
    assert img.std() > 0.05
    assert len({tuple(px) for px in img.reshape(-1, img.shape[-1])[::37].tolist()}) > 50


BLOCK_MATPLOTLIB = """
import sys

class _NoMatplotlib:
    def find_spec(self, name, path=None, target=None):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError(f"No module named {name!r} (hidden by the test)")
        return None

sys.meta_path.insert(0, _NoMatplotlib())
"""


def test_plot_without_matplotlib_subprocess(tmp_path):
    out = tmp_path / "never.png"
    code = BLOCK_MATPLOTLIB + textwrap.dedent(f"""
        from posenc_native.cli import main
        raise SystemExit(main(["plot", "sinusoidal", "--out", {str(out)!r}]))
    """)
    proc = run_posenc(code=code)
    assert proc.returncode != 0
    assert "matplotlib" in proc.stderr and "pip install" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not out.exists()


def test_plot_without_matplotlib_in_process(tmp_path, monkeypatch, capsys):
    from posenc_native import cli

    for name in list(sys.modules):
        if name == "matplotlib" or name.startswith("matplotlib."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    out = tmp_path / "never.png"
    rc = cli.main(["plot", "sinusoidal", "--out", str(out)])
    assert rc != 0
    err = capsys.readouterr().err
    assert "matplotlib" in err and "pip install" in err
    assert not out.exists()


# --------------------------------------------------------------------------------------------
# MRoPE configs: `posenc config` and `posenc plot rope` show the position axis of every pair


def _pair_axis_row(out: str) -> str:
    line = next(line for line in out.splitlines() if line.strip().startswith("pair -> axis"))
    return line.split("pair -> axis", 1)[1].split("(")[0].replace(" ", "")


def test_config_mrope_interleaved_axes_match_transformers(capsys):
    from posenc_native import cli
    from posenc_native.config import PRESETS

    assert cli.main(["config", "qwen3-vl-8b-like"]) == 0
    out = capsys.readouterr().out
    assert "3 position axes T, H, W (time, height, width): sections [24, 20, 20], round-robin" in out
    row = _pair_axis_row(out)
    assert len(row) == 64 and row.startswith("THWTHW") and row.endswith("WTTTT")
    transformers = pytest.importorskip("transformers")
    from test_mrope_hf import their_axes
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextRotaryEmbedding

    text = transformers.Qwen3VLConfig(text_config=PRESETS["qwen3-vl-8b-like"]["text_config"]).get_text_config()
    assert row == "".join("THW"[a] for a in their_axes(Qwen3VLTextRotaryEmbedding, text))


def test_config_mrope_contiguous_table_has_an_axis_column(capsys):
    from posenc_native import cli

    assert cli.main(["config", "qwen2.5-vl-7b-like"]) == 0
    out = capsys.readouterr().out
    assert _pair_axis_row(out) == "T" * 16 + "H" * 24 + "W" * 24
    header = next(line for line in out.splitlines() if line.split()[:2] == ["pair", "default"])
    assert header.split()[-1] == "axis"
    rows = {int(r[0]): r for r in (line.split() for line in out.splitlines()) if r and r[0].isdigit()}
    # the pairs either side of each section boundary are listed, with their axis
    assert [rows[i][-1] for i in (15, 16, 39, 40)] == ["T", "H", "H", "W"]
    assert rows[0][-1] == "T" and rows[63][-1] == "W"


def test_plot_rope_mrope(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "mrope.png"
    proc = run_posenc("plot", "rope", "--config", "qwen3-vl-8b-like", "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    width, height = _png_size(out.read_bytes())
    assert width >= 600 and height >= 200
    import matplotlib.image

    img = matplotlib.image.imread(str(out))
    assert len({tuple(px) for px in img.reshape(-1, img.shape[-1])[::37].tolist()}) > 20
