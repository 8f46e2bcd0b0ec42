"""The main job's self-check: run every op on a small embedded problem on every available device and
compare with the float64 reference. Each op family adds its cases to CASES."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from . import bias, ops, reference

# Tolerances of the numerics contract (docs/architecture.md, "Numerics"): relative, norm-wise.
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2, torch.float64: 1e-12}


@dataclass
class Result:
    op: str
    device: str
    dtype: str
    error: float
    tolerance: float

    @property
    def passed(self) -> bool:
        return self.error <= self.tolerance


def rel_error(out: torch.Tensor, truth: torch.Tensor) -> float:
    """Norm-wise relative error ||out - truth|| / ||truth|| in float64."""
    out, truth = out.double().cpu(), truth.double().cpu()
    return float((out - truth).norm() / truth.norm().clamp_min(1e-300))


def _sinusoidal_table(device: str, dtype: torch.dtype) -> float:
    g = torch.Generator().manual_seed(0)
    positions = torch.randint(0, 1 << 20, (257,), generator=g)
    kw = dict(base=10000.0, interleaved=True)
    out = ops.sinusoidal_table(positions.to(device), 96, dtype=dtype, **kw)
    return rel_error(out, reference.sinusoidal_table(positions, 96, **kw))


def _add_sinusoidal(device: str, dtype: torch.dtype) -> float:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 33, 64, generator=g, dtype=torch.float64)
    out = ops.add_sinusoidal(x.to(device, dtype), offset=5, x_scale=8.0)
    return rel_error(out, reference.add_sinusoidal(x.to(dtype).double(), offset=5, x_scale=8.0))


def _yarn_config():
    from .config import RopeConfig

    return RopeConfig.from_hf({"hidden_size": 512, "num_attention_heads": 8, "rope_theta": 10000.0,
                               "max_position_embeddings": 16384,
                               "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                                "original_max_position_embeddings": 4096}})


def _rope_inputs(device: str, dtype: torch.dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 37, 8, 64, generator=g, dtype=torch.float64).to(dtype)
    k = torch.randn(2, 37, 2, 64, generator=g, dtype=torch.float64).to(dtype)
    positions = torch.randint(0, 1 << 16, (2, 37), generator=g)
    return q, k, positions


def _rope_error(q, k, q_out, k_out, positions, cfg) -> float:
    rq, rk = reference.apply_rope(q.double(), k.double(), positions, cfg)
    return max(rel_error(q_out, rq), rel_error(k_out, rk))


def _rope(device: str, dtype: torch.dtype) -> float:
    cfg = _yarn_config()
    q, k, positions = _rope_inputs(device, dtype, 2)
    q_out, k_out = ops.apply_rope(q.to(device), k.to(device), positions.to(device), config=cfg)
    return _rope_error(q, k, q_out, k_out, positions, cfg)


def _rope_inplace(device: str, dtype: torch.dtype) -> float:
    cfg = _yarn_config()
    q, k, positions = _rope_inputs(device, dtype, 3)
    qd = q.to(device).transpose(1, 2).contiguous().transpose(1, 2)  # a strided view
    kd = k.to(device, copy=True)
    ops.apply_rope_(qd, kd, positions.to(device), config=cfg)
    return _rope_error(q, k, qd, kd, positions, cfg)


def _mrope_config(interleaved: bool):
    """MRoPE of a Qwen2-VL (contiguous T | H | W sections) or Qwen3-VL (round-robin) text model."""
    from .config import RopeConfig

    return RopeConfig(head_dim=128, base=1000000.0, mrope_section=(24, 20, 20) if interleaved else (16, 24, 24),
                      mrope_interleaved=interleaved)


def _mrope_inputs(device: str, dtype: torch.dtype, seed: int):
    q, k, _ = _rope_inputs(device, dtype, seed)
    q, k = torch.cat([q, q.flip(-1)], -1), torch.cat([k, k.flip(-1)], -1)  # head_dim 128
    g = torch.Generator().manual_seed(seed)
    return q, k, torch.randint(0, 1 << 16, (3, 2, 37), generator=g)  # time, height, width rows differ


def _mrope(device: str, dtype: torch.dtype) -> float:
    cfg = _mrope_config(False)
    q, k, positions = _mrope_inputs(device, dtype, 8)
    q_out, k_out = ops.apply_rope(q.to(device), k.to(device), positions.to(device), config=cfg)
    return _rope_error(q, k, q_out, k_out, positions, cfg)


def _mrope_inplace(device: str, dtype: torch.dtype) -> float:
    cfg = _mrope_config(True)
    q, k, positions = _mrope_inputs(device, dtype, 9)
    qd, kd = q.to(device, copy=True), k.to(device, copy=True)
    ops.apply_rope_(qd, kd, positions.to(device), config=cfg)
    return _rope_error(q, k, qd, kd, positions, cfg)


def _apply_rotary_pos_emb(device: str, dtype: torch.dtype) -> float:
    cfg = _yarn_config()
    q, k, positions = _rope_inputs(device, dtype, 4)
    cos, sin = reference.rope_tables(positions, cfg, dtype=dtype)
    q_out, k_out = ops.apply_rotary_pos_emb(q.to(device), k.to(device), cos.to(device), sin.to(device),
                                            unsqueeze_dim=2)
    c64, s64 = cos.double()[:, :, None], sin.double()[:, :, None]
    rq = q.double() * c64 + reference.rotate_half(q.double()) * s64
    rk = k.double() * c64 + reference.rotate_half(k.double()) * s64
    return max(rel_error(q_out, rq), rel_error(k_out, rk))


def _t5_bias_inputs(seed: int):
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(32, 8, generator=g, dtype=torch.float64)
    grad = torch.randn(1, 8, 77, 300, generator=g, dtype=torch.float64)
    return weight, grad


_BIAS_SHAPE = dict(query_length=77, key_length=300, query_offset=223)  # a decoding-like window


def _relative_position_bias(device: str, dtype: torch.dtype) -> float:
    weight, _ = _t5_bias_inputs(5)
    lq, lk, off = _BIAS_SHAPE.values()
    out = bias.relative_position_bias(weight.to(device, dtype), lq, lk, bidirectional=False, query_offset=off)
    return rel_error(out, reference.relative_position_bias(weight, lq, lk, bidirectional=False, query_offset=off))


def _relative_position_bias_grad(device: str, dtype: torch.dtype) -> float:
    weight, grad = _t5_bias_inputs(6)
    lq, lk, off = _BIAS_SHAPE.values()
    w = weight.requires_grad_()
    truth = torch.autograd.grad(reference.relative_position_bias(w, lq, lk, query_offset=off), w, grad)[0]
    out = torch.ops.posenc.relative_position_bias_backward(grad.to(device, dtype), True, 32, 128, off)
    return rel_error(out, truth)


def _alibi_bias(device: str, dtype: torch.dtype) -> float:
    slopes = bias.alibi_slopes(12)
    lq, lk, off = _BIAS_SHAPE.values()
    out = bias.alibi_bias(slopes.to(device), lq, lk, query_offset=off, dtype=dtype)
    return rel_error(out, reference.alibi_bias(slopes, lq, lk, query_offset=off))


def _alibi_bias_grad(device: str, dtype: torch.dtype) -> float:
    _, grad = _t5_bias_inputs(7)
    grad = grad / 16  # sum(grad * (j - i)) stays inside float16's range
    lq, lk, off = _BIAS_SHAPE.values()
    s = bias.alibi_slopes(8).double().requires_grad_()
    truth = torch.autograd.grad(reference.alibi_bias(s, lq, lk, query_offset=off), s, grad)[0]
    return rel_error(torch.ops.posenc.alibi_bias_backward(grad.to(device, dtype), off), truth)


# (op name, function(device, dtype) -> relative error)
CASES: list[tuple[str, Callable[[str, torch.dtype], float]]] = [
    ("sinusoidal_table", _sinusoidal_table),
    ("add_sinusoidal", _add_sinusoidal),
    ("rope (yarn)", _rope),
    ("rope_ in place (yarn)", _rope_inplace),
    ("rope (mrope, qwen2-vl)", _mrope),
    ("rope_ in place (qwen3-vl)", _mrope_inplace),
    ("apply_rotary_pos_emb", _apply_rotary_pos_emb),
    ("relative_position_bias", _relative_position_bias),
    ("relative_position_bias bwd", _relative_position_bias_grad),
    ("alibi_bias", _alibi_bias),
    ("alibi_bias bwd", _alibi_bias_grad),
]


def devices() -> list[str]:
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def run_all() -> list[Result]:
    results = []
    for device in devices():
        for name, fn in CASES:
            for dtype in (torch.float32, torch.float16, torch.bfloat16):
                err = fn(device, dtype)
                results.append(Result(name, device, str(dtype).replace("torch.", ""), err, TOLERANCE[dtype]))
    return results
