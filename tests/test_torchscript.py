"""TorchScript: modules that call torch.ops.posenc.* script, save, and load in a fresh process.

TorchScript cannot call the Python wrappers (posenc_native.apply_rope, ...), so scripted code of a
user's own calls the raw ops with every schema argument spelled out; the library's modules script as
they are (their forward's TorchScript branch calls the ops). A saved module needs the op library loaded
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


YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256}


class ModulesModel(nn.Module):
    """A model built from the library's modules (not raw ops), as a user writes it: TorchScript
    compiles their forward (RotaryEmbedding and SinusoidalPositionalEncoding call the ops there)."""

    def __init__(self) -> None:
        super().__init__()
        self.pe = posenc_native.SinusoidalPositionalEncoding(D_MODEL, max_len=64)
        self.rotary = posenc_native.RotaryEmbedding(posenc_native.RopeConfig(head_dim=HEAD_DIM, scaling=YARN,
                                                                             interleaved=True))
        self.rotary_bhsd = posenc_native.RotaryEmbedding(posenc_native.RopeConfig(head_dim=HEAD_DIM, base=500.0),
                                                         layout="bhsd")

    def forward(self, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor,
                offset: int) -> Dict[str, torch.Tensor]:
        out: Dict[str, torch.Tensor] = {"embedded": self.pe(x, offset)}
        rq, rk = self.rotary(q, k, positions)
        assert rk is not None
        out["rope_q"], out["rope_k"] = rq, rk
        q_only, none = self.rotary_bhsd(q.transpose(1, 2), None, None, offset)
        assert none is None
        out["bhsd_q_alone"] = q_only.transpose(1, 2)
        return out


def test_library_modules_script_and_load_with_the_op_library_alone(tmp_path):
    """RotaryEmbedding (yarn, interleaved; q alone in bhsd) and SinusoidalPositionalEncoding inside a
    scripted model: saved, loaded in a fresh interpreter with only torch.ops.load_library, and the
    outputs there equal the float64 reference. .double() before scripting leaves the frequencies
    exact (kept as int64 bits)."""
    model = ModulesModel().double().float()  # a dtype round trip would round float64 frequencies
    scripted = torch.jit.script(model)
    scripted.save(str(tmp_path / "modules.pt"))
    inputs = make_inputs(seed=27)
    torch.save(inputs, tmp_path / "inputs.pt")
    proc = run_python(f"""
        import torch
        torch.ops.load_library({posenc_native.library_path()!r})
        module = torch.jit.load({str(tmp_path / "modules.pt")!r})
        i = torch.load({str(tmp_path / "inputs.pt")!r})
        with torch.no_grad():
            out = module(i["x"], i["q"], i["k"], i["positions"], 11)
        torch.save(dict(out), {str(tmp_path / "out.pt")!r})
        assert not any(m.startswith("posenc") for m in __import__("sys").modules)
    """)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = torch.load(tmp_path / "out.pt")
    pos, q, k = inputs["positions"], inputs["q"], inputs["k"]
    yarn = posenc_native.RopeConfig(head_dim=HEAD_DIM, scaling=YARN, interleaved=True)
    truth = {
        "embedded": reference.add_sinusoidal(inputs["x"].double(), offset=11),
        "rope_q": reference.apply_rope(q.double(), None, pos, yarn)[0],
        "rope_k": reference.apply_rope(k.double(), None, pos, yarn)[0],
        "bhsd_q_alone": rope_reference(q, torch.arange(SEQ) + 11, default_inv_freq(HEAD_DIM, 500.0)),
    }
    assert set(out) == set(truth)
    for name, expected in truth.items():
        torch.testing.assert_close(out[name].double(), expected, rtol=0, atol=5e-6, msg=name)
    with torch.no_grad():  # and the scripted module in this process is the eager one
        eager = model(*_args(inputs)[:4], 11)
        here = scripted(*_args(inputs)[:4], 11)
    for name in eager:
        torch.testing.assert_close(here[name], eager[name], rtol=0, atol=0)


def test_scripted_module_checks_its_arguments():
    scripted = torch.jit.script(posenc_native.RotaryEmbedding(posenc_native.RopeConfig(head_dim=HEAD_DIM)))
    with pytest.raises(Exception, match=f"head_dim must be config.head_dim={HEAD_DIM}"):
        scripted(torch.randn(1, 3, 2, HEAD_DIM + 2))
    dynamic = posenc_native.RopeConfig(head_dim=HEAD_DIM, max_position_embeddings=16,
                                       scaling={"rope_type": "dynamic", "factor": 2.0})
    scripted = torch.jit.script(posenc_native.RotaryEmbedding(dynamic))
    with pytest.raises(Exception, match="dynamic frequencies depend on the sequence length"):
        scripted(torch.randn(1, 3, 2, HEAD_DIM))
    pe = torch.jit.script(posenc_native.SinusoidalPositionalEncoding(D_MODEL))
    with pytest.raises(Exception, match=f"d_model={D_MODEL}"):
        pe(torch.randn(1, 3, D_MODEL + 1))


@pytest.mark.parametrize("case", ["mrope-interleaved", "thd-partial-llama3"])
def test_scripted_rotary_embedding_matches_reference(case):
    """The scripted forward's other arguments: an axis layout (positions [A, B, S]), and packed
    tokens with cu_seqlens, an offset and partial rotary, q alone too."""
    g = torch.Generator().manual_seed(28)
    if case == "mrope-interleaved":
        cfg = posenc_native.RopeConfig(head_dim=64, mrope_section=(8, 12, 12), mrope_interleaved=True)
        layout, q, k = "bshd", torch.randn(2, 8, 4, 64, generator=g), torch.randn(2, 8, 2, 64, generator=g)
        args, kwargs = (torch.randint(0, 4000, (3, 2, 8), generator=g), 0, None), {}
    else:
        cfg = posenc_native.RopeConfig(head_dim=64, rotary_dim=32, base=500000.0, scaling={
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64})
        layout, q, k = "thd", torch.randn(10, 4, 64, generator=g), torch.randn(10, 2, 64, generator=g)
        cu = torch.tensor([0, 3, 10])
        args, kwargs = (None, 5, cu), {"offset": 5, "cu_seqlens": cu}
    scripted = torch.jit.script(posenc_native.RotaryEmbedding(cfg, layout=layout))
    got_q, got_k = scripted(q, k, *args)
    want_q, want_k = reference.apply_rope(q.double(), k.double(), args[0], cfg, layout=layout, **kwargs)
    torch.testing.assert_close(got_q.double(), want_q, rtol=0, atol=5e-6)
    torch.testing.assert_close(got_k.double(), want_k, rtol=0, atol=5e-6)
    alone, none = scripted(q, None, *args)
    assert none is None and torch.equal(alone, got_q)


class SeedRoPEAttention(nn.Module):
    """The seed articles' pattern: angle tables of q's length, then apply_rotary_emb."""

    def __init__(self) -> None:
        super().__init__()
        self.rope = posenc_native.RoPEPositionalEncoding(64, base=500.0)

    def forward(self, q: torch.Tensor) -> torch.Tensor:
        freqs = self.rope(q.shape[2])
        return self.rope.apply_rotary_emb(q, freqs.cos(), freqs.sin())


class SeedYaRNAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rope = posenc_native.YaRNPositionalEncoding(64, original_max_position_embeddings=64, scaling_factor=4.0)

    def forward(self, q: torch.Tensor) -> torch.Tensor:
        cos, sin = self.rope(q.shape[2])
        return self.rope.apply_rotary_emb(q, cos, sin)


@pytest.mark.parametrize("model_cls", [SeedRoPEAttention, SeedYaRNAttention])
def test_seed_article_modules_script(model_cls):
    """RoPEPositionalEncoding and YaRNPositionalEncoding inside a scripted model: their tables equal
    the eager ones bit for bit (float64 frequencies kept through a dtype round trip), and the
    rotation matches the float64 reference."""
    model = model_cls().half().float()
    scripted = torch.jit.script(model)
    q = torch.randn(2, 4, 37, 64, generator=torch.Generator().manual_seed(29))
    for got, want in zip(torch.jit.script(model.rope)(37), model.rope(37)):
        assert torch.equal(got, want)
    want, _ = reference.apply_rope(q.double(), None, None, model.rope.config, layout="bhsd")
    torch.testing.assert_close(scripted(q).double(), want, rtol=0, atol=5e-6)


def test_scripted_frequencies_survive_meta_init_and_dtype_casts():
    """The float64 frequencies a scripted module reads are rebuilt from the config whenever the module
    moves: built under a meta device and materialized with to_empty (as large models are), or cast
    with .half(), the scripted module still computes what the eager one does."""
    cfg = posenc_native.RopeConfig(head_dim=HEAD_DIM, scaling=YARN)
    with torch.device("meta"):
        meta_built = posenc_native.RotaryEmbedding(cfg)
    modules = {"to_empty": meta_built.to_empty(device="cpu"),
               "half": posenc_native.RotaryEmbedding(cfg).half(),
               "seed yarn, half": posenc_native.YaRNPositionalEncoding(HEAD_DIM, original_max_position_embeddings=16,
                                                                       scaling_factor=4.0).half()}
    g = torch.Generator().manual_seed(30)
    q, k = torch.randn(2, SEQ, HEADS, HEAD_DIM, generator=g), torch.randn(2, SEQ, KV_HEADS, HEAD_DIM, generator=g)
    pos = torch.randint(0, 5000, (SEQ,), generator=g)
    for name, module in modules.items():
        assert module._script_inv_freq.dtype == torch.float64, name
        scripted = torch.jit.script(module)
        if isinstance(module, posenc_native.RotaryEmbedding):
            for got, want in zip(scripted(q, k, pos), module(q, k, pos)):
                assert torch.equal(got, want), name
        else:
            for got, want in zip(scripted(SEQ), module(SEQ)):
                assert torch.equal(got, want), name
        # cast after scripting: no Python runs to rebuild the buffer, so the scripted code refuses
        # float32 frequencies (it rotated with them silently: 0.06 rad off at position 1e6)
        for cast in ("float", "half"):
            with pytest.raises((RuntimeError, torch.jit.Error), match="frequency buffer was cast"):
                args = (q, k, pos) if isinstance(module, posenc_native.RotaryEmbedding) else (SEQ,)
                getattr(torch.jit.script(module), cast)()(*args)


def test_a_config_swapped_on_a_built_module_is_what_the_scripted_module_uses():
    """RotaryEmbedding.config set again (a model switched to a context-extended config): the
    scripted module reads the new config's frequencies, attention factor and pairing, as eager does
    (it kept the old attention factor and pairing, and after a move mixed them with new frequencies)."""
    old = posenc_native.RopeConfig(head_dim=HEAD_DIM)
    new = posenc_native.RopeConfig(head_dim=HEAD_DIM, interleaved=True, scaling=YARN)
    g = torch.Generator().manual_seed(31)
    q, k = torch.randn(2, SEQ, HEADS, HEAD_DIM, generator=g), torch.randn(2, SEQ, KV_HEADS, HEAD_DIM, generator=g)
    want_q, want_k = reference.apply_rope(q.double(), k.double(), None, new)
    for moved in (False, True):
        rope = posenc_native.RotaryEmbedding(old)
        rope.config = new
        if moved:
            rope.to(torch.float32)
        got_q, got_k = torch.jit.script(rope)(q, k, None, 0, None)
        torch.testing.assert_close(got_q.double(), want_q, atol=5e-6, rtol=0)
        torch.testing.assert_close(got_k.double(), want_k, atol=5e-6, rtol=0)
