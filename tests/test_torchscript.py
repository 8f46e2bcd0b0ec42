"""TorchScript: modules that call torch.ops.posenc.* script, save, and load in a fresh process.

TorchScript cannot call the Python wrappers (posenc_native.apply_rope, ...), so scripted code calls
the raw ops with every schema argument spelled out. A saved module needs the op library loaded
before torch.jit.load: `import posenc_native` in Python, or only torch.ops.load_library(path) (the
ops need no Python), or linking the library in C++ (examples/cpp).
"""
from __future__ import annotations

import math
import subprocess
import sys
import textwrap
from typing import Dict

import pytest
import torch
from torch import nn

import posenc_native
from posenc_native import reference

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning",
                                        "ignore:`torch.jit.save` is deprecated:FutureWarning",
                                        "ignore:`torch.jit.load` is deprecated:FutureWarning")

D_MODEL, HEADS, KV_HEADS, HEAD_DIM, SEQ = 32, 4, 2, 8, 9


def default_inv_freq(dim: int, base: float = 10000.0) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))


def rope_reference(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, attention_factor: float = 1.0,
                   interleaved: bool = False) -> torch.Tensor:
    """float64 RoPE of x [B,S,H,D] (rotary dim = 2 * len(inv_freq))."""
    x = x.double()
    angle = positions.double()[:, None] * inv_freq.double()[None, :]  # [S, R/2]
    cos = (angle.cos() * attention_factor)[None, :, None, :]
    sin = (angle.sin() * attention_factor)[None, :, None, :]
    r = 2 * inv_freq.shape[0]
    if interleaved:
        a, b = x[..., 0:r:2], x[..., 1:r:2]
        rot = torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)
    else:
        a, b = x[..., : r // 2], x[..., r // 2: r]
        rot = torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)
    return torch.cat([rot, x[..., r:]], dim=-1)


class ScriptedPosenc(nn.Module):
    """Calls every op of the library through torch.ops.posenc (what TorchScript can call)."""

    def __init__(self) -> None:
        super().__init__()
        self.d_model = D_MODEL
        self.x_scale = math.sqrt(D_MODEL)
        self.register_buffer("inv_freq", default_inv_freq(HEAD_DIM))

    def forward(self, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor,
                cos: torch.Tensor, sin: torch.Tensor) -> Dict[str, torch.Tensor]:
        out: Dict[str, torch.Tensor] = {}
        out["table"] = torch.ops.posenc.sinusoidal_table(positions, self.d_model, 10000.0, True, 0.0, 1.0, False,
                                                         torch.float32)
        out["embedded"] = torch.ops.posenc.add_sinusoidal(x, positions, self.x_scale, 10000.0, True, 0.0, 1.0, False)
        rq, rk = torch.ops.posenc.rope(q, k, positions, None, self.inv_freq, 1.0, False, "bshd", 0, False)
        out["rope_q"] = rq
        out["rope_k"] = rk
        q2, k2 = q.clone(), k.clone()
        torch.ops.posenc.rope_(q2, k2, None, None, self.inv_freq, 1.25, True, "bshd", 5, False)  # offset 5
        out["rope_inplace_q"] = q2
        out["rope_inplace_k"] = k2
        cq, ck = torch.ops.posenc.rope_cos_sin(q.transpose(1, 2), k.transpose(1, 2), cos, sin, None, "bhsd", False)
        out["cos_sin_q"] = cq.transpose(1, 2)
        out["cos_sin_k"] = ck.transpose(1, 2)
        return out


def make_inputs(seed: int) -> Dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    positions = torch.randperm(5000, generator=g)[:SEQ].sort().values
    angles = positions.double()[:, None] * default_inv_freq(HEAD_DIM)[None, :]
    emb = torch.cat([angles, angles], dim=-1)
    return {
        "x": torch.randn(2, SEQ, D_MODEL, generator=g),
        "q": torch.randn(2, SEQ, HEADS, HEAD_DIM, generator=g),
        "k": torch.randn(2, SEQ, KV_HEADS, HEAD_DIM, generator=g),
        "positions": positions,
        "cos": emb.cos().float(),
        "sin": emb.sin().float(),
    }


def _args(inputs):
    return inputs["x"], inputs["q"], inputs["k"], inputs["positions"], inputs["cos"], inputs["sin"]


def check_against_float64(out: Dict[str, torch.Tensor], inputs: Dict[str, torch.Tensor]) -> None:
    """The scripted module computes the right thing (not only the same thing twice)."""
    inv = default_inv_freq(HEAD_DIM)
    pos, q, k = inputs["positions"], inputs["q"], inputs["k"]
    truth = {
        "table": reference.sinusoidal_table(pos, D_MODEL),
        "embedded": reference.add_sinusoidal(inputs["x"].double(), pos, x_scale=math.sqrt(D_MODEL)),
        "rope_q": rope_reference(q, pos, inv),
        "rope_k": rope_reference(k, pos, inv),
        "rope_inplace_q": rope_reference(q, torch.arange(SEQ) + 5, inv, 1.25, interleaved=True),
        "rope_inplace_k": rope_reference(k, torch.arange(SEQ) + 5, inv, 1.25, interleaved=True),
        "cos_sin_q": rope_reference(q, pos, inv),
        "cos_sin_k": rope_reference(k, pos, inv),
    }
    assert set(out) == set(truth)
    for name, expected in truth.items():
        got = out[name].double()
        rel = ((got - expected).norm() / expected.norm()).item()
        assert rel <= 1e-5, f"{name}: relative error {rel:.2e} against the float64 reference"


def run_python(code: str) -> subprocess.CompletedProcess:
    """A fresh interpreter: nothing of this process (loaded libraries, registered ops) carries over."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300)
    return proc


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """The scripted module saved to a file, its inputs, and the eager results."""
    root = tmp_path_factory.mktemp("torchscript")
    module = ScriptedPosenc().eval()
    scripted = torch.jit.script(module)
    scripted.save(str(root / "posenc_module.pt"))
    inputs = make_inputs(seed=11)
    torch.save(inputs, root / "inputs.pt")
    with torch.no_grad():
        eager = module(*_args(inputs))
    return root, inputs, eager


def test_scripted_matches_eager_and_float64(saved):
    root, inputs, eager = saved
    check_against_float64(eager, inputs)
    scripted = torch.jit.load(str(root / "posenc_module.pt"))
    graph = str(scripted.forward.graph)
    for op in ("posenc::rope(", "posenc::rope_(", "posenc::rope_cos_sin(", "posenc::add_sinusoidal(",
               "posenc::sinusoidal_table("):
        assert op in graph
    with torch.no_grad():
        out = scripted(*_args(inputs))
    for name in eager:
        torch.testing.assert_close(out[name], eager[name], rtol=0, atol=1e-6)


@pytest.mark.parametrize("loader", ["import posenc_native", "torch.ops.load_library(LIB)"])
def test_load_in_fresh_process(saved, loader):
    """The saved module runs in a new interpreter, either after `import posenc_native` or with the op
    library alone (no posenc Python code at all: what a Python-free deployment has)."""
    root, inputs, eager = saved
    proc = run_python(f"""
        import torch
        LIB = {posenc_native.library_path()!r}
        {loader}
        module = torch.jit.load({str(root / "posenc_module.pt")!r})
        inputs = torch.load({str(root / "inputs.pt")!r})
        with torch.no_grad():
            out = module(inputs["x"], inputs["q"], inputs["k"], inputs["positions"], inputs["cos"], inputs["sin"])
        torch.save(dict(out), {str(root / "out.pt")!r})
        # with the library alone, no posenc Python code was imported along the way
        assert {loader.startswith("import")!r} or not any(m.startswith("posenc") for m in __import__("sys").modules)
    """)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = torch.load(root / "out.pt")
    assert set(out) == set(eager)
    for name in eager:
        assert eager[name].abs().max() > 0.1
        torch.testing.assert_close(out[name], eager[name], rtol=0, atol=1e-6)


def test_load_without_library_names_the_missing_op(saved):
    """Without the op library, torch.jit.load fails and says which op is missing (the usual mistake)."""
    root, _, _ = saved
    proc = run_python(f"""
        import torch
        torch.jit.load({str(root / "posenc_module.pt")!r})
    """)
    assert proc.returncode != 0
    assert "posenc::" in proc.stderr, proc.stderr[-3000:]


def test_scripted_backward_matches_eager():
    """Gradients through the scripted ops (autograd registered by posenc_native in this process)."""

    class Rotate(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(HEAD_DIM, HEAD_DIM)
            self.register_buffer("inv_freq", default_inv_freq(HEAD_DIM))

        def forward(self, q: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
            q = self.proj(q)
            k = torch.ops.posenc.add_sinusoidal(q.flatten(2), positions, 2.0, 10000.0, True, 0.0, 1.0, False)
            rq, rk = torch.ops.posenc.rope(q, k.view(q.shape), positions, None, self.inv_freq, 1.1, False, "bshd",
                                           0, False)
            return (rq * rk).sum()

    torch.manual_seed(3)
    eager = Rotate()
    scripted = torch.jit.script(Rotate())
    scripted.load_state_dict(eager.state_dict())
    q = torch.randn(2, SEQ, HEADS, HEAD_DIM)
    positions = torch.randint(0, 3000, (SEQ,))
    eager(q, positions).backward()
    scripted(q, positions).backward()
    grads_e = [p.grad for p in eager.parameters()]
    grads_s = [p.grad for p in scripted.parameters()]
    assert all(g.abs().max() > 1e-3 for g in grads_e)
    for ge, gs in zip(grads_e, grads_s):
        torch.testing.assert_close(gs, ge, rtol=1e-5, atol=1e-6)
