"""Python side of the LibTorch example: script a module that calls the posenc ops, save it, its
inputs and the results Python gets, for examples/cpp/posenc_example.cpp to reproduce.

    python examples/cpp/make_inputs.py OUT_DIR [--aoti]

Writes into OUT_DIR:
    model.pt      TorchScript module (torch.jit.script) calling torch.ops.posenc.* directly
    inputs.pt     torch.save of a dict of tensors (the C++ program reads it with torch::pickle_load)
    expected.pt   torch.save of a dict: what the C++ program must write to outputs.pt
    model.pt2     with --aoti: an AOTInductor package (CPU) of an attention block using RoPE

The C++ program writes outputs.pt with torch::pickle_save; read it with torch.load.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Dict

import torch
import torch.nn.functional as F
from torch import nn

import posenc_native  # noqa: F401  (loads the op library: registers torch.ops.posenc.*)

D_MODEL = 32
HEADS = 4
HEAD_DIM = D_MODEL // HEADS
SEQ = 11


def default_inv_freq(dim: int, base: float = 10000.0) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))


class PosencDemo(nn.Module):
    """Every posenc op through torch.ops (TorchScript cannot call the Python functions), and the
    library's modules, which script as they are."""

    def __init__(self, d_model: int, head_dim: int) -> None:
        super().__init__()
        self.d_model = d_model
        self.x_scale = math.sqrt(d_model)
        self.register_buffer("inv_freq", default_inv_freq(head_dim))
        self.register_buffer("t5_weight", torch.randn(32, HEADS, generator=torch.Generator().manual_seed(3)))
        self.register_buffer("slopes", posenc_native.alibi_slopes(HEADS))
        yarn = posenc_native.RopeConfig(head_dim=head_dim, scaling={"rope_type": "yarn", "factor": 4.0,
                                                                    "original_max_position_embeddings": 1024})
        self.rotary = posenc_native.RotaryEmbedding(yarn)
        self.encoding = posenc_native.SinusoidalPositionalEncoding(d_model, max_len=64)

    def forward(self, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor,
                cos: torch.Tensor, sin: torch.Tensor) -> Dict[str, torch.Tensor]:
        out: Dict[str, torch.Tensor] = {}
        out["embedded"] = torch.ops.posenc.add_sinusoidal(x, positions, self.x_scale, 10000.0, True, 0.0, 1.0, False)
        out["table"] = torch.ops.posenc.sinusoidal_table(positions, self.d_model, 10000.0, True, 0.0, 1.0, False,
                                                         torch.float32)
        rq, rk = torch.ops.posenc.rope(q, k, positions, None, self.inv_freq, 1.0, False, "bshd", 0, False)
        out["rope_q"] = rq
        out["rope_k"] = rk
        # In place, interleaved pairs, YaRN-style attention factor, offset positions.
        q2 = q.clone()
        k2 = k.clone()
        torch.ops.posenc.rope_(q2, k2, positions, None, self.inv_freq, 1.25, True, "bshd", 7, False)
        out["rope_inplace_q"] = q2
        out["rope_inplace_k"] = k2
        cq, ck = torch.ops.posenc.rope_cos_sin(q.transpose(1, 2), k.transpose(1, 2), cos, sin, None, "bhsd", False)
        out["cos_sin_q"] = cq
        out["cos_sin_k"] = ck
        # Relative position biases: T5 (encoder-style, bidirectional) and ALiBi, [1, heads, S, S].
        s = x.shape[1]
        out["t5_bias"] = torch.ops.posenc.relative_position_bias(self.t5_weight, s, s, True, 32, 128, 0)
        out["alibi_bias"] = torch.ops.posenc.alibi_bias(self.slopes, s, s, 0, None)
        # The library's modules: YaRN RoPE, and the sinusoidal encoding at offset 5.
        mq, mk = self.rotary(q, k, positions)
        assert mk is not None
        out["module_rope_q"] = mq
        out["module_rope_k"] = mk
        out["module_encoded"] = self.encoding(x, 5)
        return out


class RopeBlock(nn.Module):
    """Attention block with RoPE on q/k (exported and compiled with AOTInductor for --aoti)."""

    def __init__(self, d_model: int = D_MODEL, heads: int = HEADS) -> None:
        super().__init__()
        self.heads = heads
        self.head_dim = d_model // heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.register_buffer("inv_freq", default_inv_freq(self.head_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, self.head_dim).unbind(2)
        q, k = posenc_native.apply_rope(q, k, inv_freq=self.inv_freq)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.out(a.transpose(1, 2).reshape(b, s, -1))


def make_inputs(seed: int = 0) -> Dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    positions = torch.randperm(4096, generator=g)[:SEQ].sort().values  # non-contiguous global positions
    # transformers-style cos/sin [S, R] for rope_cos_sin: angles from the float64 inv_freq.
    angles = positions.double()[:, None] * default_inv_freq(HEAD_DIM)[None, :]
    emb = torch.cat([angles, angles], dim=-1)
    return {
        "x": torch.randn(2, SEQ, D_MODEL, generator=g),
        "q": torch.randn(2, SEQ, HEADS, HEAD_DIM, generator=g),
        "k": torch.randn(2, SEQ, 2, HEAD_DIM, generator=g),  # GQA: fewer k heads
        "positions": positions,
        "cos": emb.cos().float(),
        "sin": emb.sin().float(),
        "block_x": torch.randn(2, SEQ, D_MODEL, generator=g),
        "t5_weight": torch.randn(32, HEADS, generator=g),  # [num_buckets, heads]
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--aoti", action="store_true", help="also write an AOTInductor package model.pt2")
    args = parser.parse_args(argv)
    out_dir: Path = args.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)

    inputs = make_inputs()
    demo = PosencDemo(D_MODEL, HEAD_DIM).eval()
    scripted = torch.jit.script(demo)
    scripted.save(str(out_dir / "model.pt"))

    args_ = (inputs["x"], inputs["q"], inputs["k"], inputs["positions"], inputs["cos"], inputs["sin"])
    with torch.no_grad():
        expected = {f"script.{name}": t for name, t in demo(*args_).items()}
        # What the C++ program computes through posenc.h (posenc::apply_rope, posenc::sinusoidal_table, ...).
        api_q, api_k = posenc_native.apply_rope(inputs["q"], inputs["k"], inputs["positions"],
                                                inv_freq=demo.inv_freq)
        expected["api.rope_q"] = api_q
        expected["api.rope_k"] = api_k
        expected["api.rope_q_default_positions"] = posenc_native.apply_rope(inputs["q"], inputs["k"],
                                                                            inv_freq=demo.inv_freq)[0]
        expected["api.table"] = posenc_native.sinusoidal_table(inputs["positions"], D_MODEL)
        expected["api.embedded_offset"] = posenc_native.add_sinusoidal(inputs["x"], offset=11, x_scale=2.0)
        expected["api.t5_bias"] = posenc_native.relative_position_bias(inputs["t5_weight"], 3, 24, bidirectional=False,
                                                                       query_offset=21)
        expected["api.t5_bias_default_buckets"] = posenc_native.relative_position_bias(
            inputs["t5_weight"], 3, 24, bidirectional=False, max_distance=64, query_offset=21)
        expected["api.alibi_slopes"] = posenc_native.alibi_slopes(HEADS)
        expected["api.alibi_bias"] = posenc_native.alibi_bias(expected["api.alibi_slopes"], 3, 24, query_offset=21)

    if args.aoti:
        block = RopeBlock().eval()
        with torch.no_grad():
            expected["aoti.out"] = block(inputs["block_x"])
            seq = torch.export.Dim("seq", min=2, max=256)
            ep = torch.export.export(block, (inputs["block_x"],), dynamic_shapes={"x": {1: seq}})
            torch._inductor.aoti_compile_and_package(ep, package_path=str(out_dir / "model.pt2"))

    torch.save(inputs, out_dir / "inputs.pt")
    torch.save(expected, out_dir / "expected.pt")
    print(f"wrote {', '.join(sorted(p.name for p in out_dir.iterdir()))} to {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
