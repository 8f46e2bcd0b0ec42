"""Random cases checked element by element against the float64 reference.

The other suites bound the norm-wise relative error (the numerics contract, docs/architecture.md);
one wrong element among many can hide under a norm. Here every element must lie within half an ulp
of its dtype (the one rounding on store) plus the float32 math's own error, on random layouts,
strides, dtypes, widths, positions and offsets drawn per case. Bits must also agree between one
and two threads, and between the in-place and out-of-place ops.
"""
from __future__ import annotations

import math
import random

import pytest
import torch

import posenc_native as pn
from posenc_native import reference

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
EPS = {torch.float32: 2.0 ** -24, torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8, torch.float64: 2.0 ** -53}
# cos/sin of the float32 math within ~3.5e-7 of the truth (architecture.md), with margin
TRIG_F32 = 4e-7


def half_ulp(dtype: torch.dtype, v: torch.Tensor) -> torch.Tensor:
    """Half an ulp of ``dtype`` at |v| (float64), down to the smallest normal."""
    a = v.abs().clamp_min(torch.finfo(dtype).tiny)
    return torch.pow(2.0, torch.floor(torch.log2(a))) * EPS[dtype]


def assert_elementwise(out: torch.Tensor, truth: torch.Tensor, math_err: torch.Tensor | float, what: str) -> None:
    """|out - truth| <= half an ulp of out's dtype + math_err, for every element."""
    got = out.detach().double()
    err = (got - truth).abs()
    bound = half_ulp(out.dtype, torch.maximum(truth.abs(), got.abs())) * 1.0001 + math_err
    bad = ~(err <= bound)
    if bad.any():
        i = tuple(bad.nonzero()[0].tolist())
        raise AssertionError(f"{what}: {int(bad.sum())} elements off; at {i}: {got[i].item()!r} vs truth "
                             f"{truth[i].item()!r} (error {err[i].item():.3g}, bound {bound[i].item():.3g})")


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({8: torch.int64, 4: torch.int32, 2: torch.int16}[t.element_size()])


def strided(r: random.Random, shape: tuple[int, ...], dtype: torch.dtype) -> tuple[torch.Tensor, str]:
    """A random tensor of ``shape``: contiguous, a view of a wider buffer (fused qkv), with its last two
    dims' order swapped in memory, or at a storage offset."""
    kind = r.choice(["contiguous", "fused", "swapped", "offset"])
    scale = r.choice([1.0, 0.05, 20.0])
    if kind == "fused":
        extra = r.randint(1, 3)
        start = r.randint(0, extra)
        big = (torch.randn(*shape[:-2], shape[-2] + extra, shape[-1], dtype=torch.float64) * scale).to(dtype)
        return big[..., start:start + shape[-2], :], kind
    if kind == "swapped" and len(shape) >= 3:
        t = torch.randn(*shape[:-3], shape[-2], shape[-3], shape[-1], dtype=torch.float64) * scale
        return t.to(dtype).transpose(-3, -2), kind
    if kind == "offset":
        n = math.prod(shape)
        return (torch.randn(n + 5, dtype=torch.float64) * scale).to(dtype)[5:].view(shape), kind
    return (torch.randn(shape, dtype=torch.float64) * scale).to(dtype), "contiguous"


def private_copy(t: torch.Tensor) -> torch.Tensor:
    """t's values with t's strides and storage offset, in storage of its own."""
    base = t if t._base is None else t._base
    return base.clone().as_strided(t.shape, t.stride(), t.storage_offset())


def rope_case(r: random.Random):
    dtype = r.choice(DTYPES)
    layout = r.choice(["bshd", "bhsd", "thd"])
    half = r.choice([1, 2, 3, 4, 8, 16, 32, 64, r.randint(1, 80)])
    head_dim = 2 * half + r.choice([0, 0, 0, r.randint(1, 40)])
    heads, kv_heads = r.randint(1, 6), r.choice([0, 1, r.randint(1, 6)])  # 0: q alone
    batch, seq = r.randint(1, 3), r.choice([1, r.randint(1, 12), r.randint(1, 150)])
    kw = dict(inv_freq=10000.0 ** (-torch.arange(half, dtype=torch.float64) / half) * r.choice([1.0, r.uniform(0.01, 1)]),
              attention_factor=r.choice([1.0, r.uniform(0.5, 1.5)]), interleaved=r.random() < 0.4, layout=layout)
    if r.random() < 0.3:
        kw["inv_freq"] = kw["inv_freq"].float()
    axes = 0
    if r.random() < 0.3 and half >= 2:  # an axis layout (MRoPE / axial)
        axes = r.choice([2, 3])
        cuts = sorted(r.randint(0, half) for _ in range(axes - 1))
        kw.update(mrope_section=[b - a for a, b in zip([0] + cuts, cuts + [half])], mrope_interleaved=r.random() < 0.4)
    limit = r.choice([2 ** 10, 2 ** 16, 2 ** 22])
    kw["offset"] = r.choice([0, r.randint(-50, 50), r.randint(0, limit)])
    pdtype = r.choice([torch.int32, torch.int64])
    if layout == "thd":
        tokens = batch * seq
        q_shape, k_shape = (tokens, heads, head_dim), (tokens, kv_heads, head_dim)
        if r.random() < 0.5 and not axes:
            cuts = sorted(r.randint(0, tokens) for _ in range(r.randint(0, 3)))
            kw["cu_seqlens"] = torch.tensor([0] + cuts + [tokens], dtype=r.choice([torch.int32, torch.int64]))
            positions = None
            kw["offset"] = abs(kw["offset"])
        else:
            lead = (axes,) if axes and r.random() < 0.7 else ()
            positions = torch.randint(-limit, limit, (*lead, tokens), dtype=pdtype)
    else:
        q_shape = (batch, seq, heads, head_dim) if layout == "bshd" else (batch, heads, seq, head_dim)
        k_shape = (batch, seq, kv_heads, head_dim) if layout == "bshd" else (batch, kv_heads, seq, head_dim)
        form = r.choice(["none", "S", "BS"] + (["ABS", "A1S"] if axes else []))
        shapes = {"S": (seq,), "BS": (batch, seq), "ABS": (axes, batch, seq), "A1S": (axes, 1, seq)}
        positions = None if form == "none" else torch.randint(-limit, limit, shapes[form], dtype=pdtype)
        if positions is None:
            kw["offset"] = abs(kw["offset"])
    q, q_kind = strided(r, q_shape, dtype)
    k, k_kind = strided(r, k_shape, dtype) if kv_heads else (None, "none")
    what = (f"{dtype} {layout} q {q_shape} ({q_kind}) k {k_shape if kv_heads else None} ({k_kind}) "
            f"positions {None if positions is None else tuple(positions.shape)} "
            + ", ".join(f"{n}={v}" for n, v in kw.items() if n != "inv_freq") + f" pairs {half}")
    return q, k, positions, kw, limit, what


@pytest.mark.parametrize("seed", range(6))
def test_apply_rope_elementwise(seed):
    r = random.Random(seed)
    torch.manual_seed(seed)
    threads = torch.get_num_threads()
    try:
        for _ in range(40):
            q, k, positions, kw, limit, what = rope_case(r)
            q_before, k_before = q.clone(), None if k is None else k.clone()
            torch.set_num_threads(1)
            q_out, k_out = pn.apply_rope(q, k, positions, **kw)
            assert torch.equal(q, q_before) and (k is None or torch.equal(k, k_before)), "inputs written: " + what
            q_ref, k_ref = reference.apply_rope(q.double(), None if k is None else k.double(), positions, **kw)
            factor = kw["attention_factor"]
            for x, out, truth in ((q, q_out, q_ref), (k, k_out, k_ref)):
                if x is None:
                    assert out is None, what
                    continue
                assert out.shape == x.shape and out.dtype == x.dtype, what
                # |a| + |b| of a pair bounds what the cos/sin error scales; the row's largest |x| twice over
                mag = x.double().abs().amax(-1, keepdim=True) * 2 * factor
                if x.dtype == torch.float64:  # the float64 angle itself rounds (position * inv_freq)
                    math_err = mag * (8 * (limit + abs(kw["offset"])) * 2.0 ** -53 + 1e-15)
                else:
                    math_err = mag * (TRIG_F32 + 3 * 2.0 ** -24)
                assert_elementwise(out, truth, math_err, what)
            torch.set_num_threads(2)
            q_two, k_two = pn.apply_rope(q, k, positions, **kw)
            assert torch.equal(bits(q_two), bits(q_out)) and (k is None or torch.equal(bits(k_two), bits(k_out))), \
                "1 vs 2 threads: " + what
            q_in, k_in = private_copy(q), None if k is None else private_copy(k)
            pn.apply_rope_(q_in, k_in, positions, **kw)
            assert torch.equal(bits(q_in), bits(q_out)) and (k is None or torch.equal(bits(k_in), bits(k_out))), \
                "in place vs out of place: " + what
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("seed", range(4))
def test_add_sinusoidal_and_table_elementwise(seed):
    r = random.Random(100 + seed)
    torch.manual_seed(100 + seed)
    threads = torch.get_num_threads()
    try:
        for _ in range(40):
            dtype = r.choice(DTYPES)
            dim = r.choice([r.randint(2, 20), r.randint(2, 300), 2 * r.randint(1, 160)])
            seq, batch = r.choice([1, r.randint(1, 10), r.randint(1, 200)]), r.choice([None, 1, r.randint(1, 4)])
            shape = (seq, dim) if batch is None else (batch, seq, dim)
            opts = dict(base=r.choice([10000.0, 10.0, 1e6, r.uniform(2, 1e5)]), interleaved=r.random() < 0.5,
                        freq_shift=r.choice([0.0, 1.0, r.uniform(-2, 0.9)]) if dim >= 4 else 0.0,
                        angle_scale=r.choice([1.0, r.uniform(0.01, 50)]), cos_first=r.random() < 0.5)
            half_range = int(2 ** 22 / max(opts["angle_scale"], 1.0))
            kind = r.choice(["none", "int32", "int64", "float32", "float64"])
            pshape = (seq,) if batch is None or r.random() < 0.5 else (batch, seq)
            if kind == "none":
                positions = None
            elif kind.startswith("int"):
                positions = torch.randint(-half_range, half_range, pshape, dtype=getattr(torch, kind))
            else:
                positions = ((torch.rand(pshape, dtype=torch.float64) * 2 - 1) * half_range).to(getattr(torch, kind))
            offset = r.choice([0, r.randint(0, 1000), r.randint(0, half_range)])
            x, x_kind = strided(r, shape, dtype)
            x_scale = r.choice([1.0, math.sqrt(dim), r.uniform(-3, 3)])
            what = f"{dtype} x {shape} ({x_kind}) positions {kind} {pshape} offset {offset} x_scale {x_scale} {opts}"
            torch.set_num_threads(1)
            out = pn.add_sinusoidal(x, positions, offset=offset, x_scale=x_scale, **opts)
            truth = reference.add_sinusoidal(x.double(), positions, offset=offset, x_scale=x_scale, **opts)
            scaled = (x.double() * x_scale).abs()
            if dtype == torch.float64:
                math_err = 4e-16 * (1 + scaled) + 8 * 2 ** 23 * 2.0 ** -53  # the float64 angle's rounding
            else:
                math_err = TRIG_F32 + 2 * 2.0 ** -24 * (scaled + 1.0)  # x * x_scale and the add, in float32
            assert out.shape == x.shape and out.dtype == dtype, what
            assert_elementwise(out, truth, math_err, "add_sinusoidal " + what)
            torch.set_num_threads(2)
            assert torch.equal(bits(pn.add_sinusoidal(x, positions, offset=offset, x_scale=x_scale, **opts)), bits(out)), \
                "1 vs 2 threads: " + what
            if positions is not None and positions.dim() == 1:
                table = pn.sinusoidal_table(positions, dim, dtype=dtype, **opts)
                table_truth = reference.sinusoidal_table(positions, dim, dtype=torch.float64, **opts)
                assert_elementwise(table, table_truth, TRIG_F32 if dtype != torch.float64 else 8 * 2 ** 23 * 2.0 ** -53,
                                   "sinusoidal_table " + what)
    finally:
        torch.set_num_threads(threads)
