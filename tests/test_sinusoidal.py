"""Sinusoidal ops (sinusoidal_table, add_sinusoidal) and their modules against the float64 reference.

Every numeric check compares the kernels with ``posenc_native.reference`` (float64 math) on fresh
random inputs; tolerances are the numerics contract of docs/architecture.md (norm-wise relative).
"""
from __future__ import annotations

import itertools
import math
import zlib

import pytest
import torch

import posenc_native as pn
from posenc_native import reference

HAS_CUDA = torch.cuda.is_available()
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device"))]
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
# docs/architecture.md, "Numerics" (float64 is exact up to the last bits of libm's sin/cos).
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float64: 1e-12}


def tol(dtype: torch.dtype, max_angle: float = 0.0) -> float:
    """The contract's tolerance; for float64 also the rounding of the float64 angle itself (kernel and
    reference may multiply position, frequency and scale in another order: ~1 ulp of the angle)."""
    return TOL[dtype] + (8 * max_angle * 2.0 ** -53 if dtype == torch.float64 else 0.0)


def rel_err(out: torch.Tensor, truth: torch.Tensor) -> float:
    out, truth = out.detach().double().cpu(), truth.detach().double().cpu()
    assert out.shape == truth.shape, (out.shape, truth.shape)
    assert torch.isfinite(out).all()
    return float((out - truth).norm() / truth.norm().clamp_min(1e-300))


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def random_positions(g: torch.Generator, n: int, kind: str, high: int = 1 << 16) -> torch.Tensor:
    """n positions of the given kind: int32/int64 (random integers), float32/float64 (fractional)."""
    if kind in ("int32", "int64"):
        return torch.randint(0, high, (n,), generator=g, dtype=getattr(torch, kind))
    # Diffusion timesteps: fractional values (float32 positions are used as the float32 values they hold).
    return (torch.rand(n, generator=g, dtype=torch.float64) * high).to(getattr(torch, kind))


# --------------------------------------------------------------------------------------------
# The seed's worked example (docs/architecture.md, "Scaling schemes").


def test_seed_worked_example():
    expected = torch.tensor([[0.0, 1.0, 0.0, 1.0],
                             [0.841, 0.540, 0.010, 1.000],
                             [0.909, -0.416, 0.020, 1.000]], dtype=torch.float64)
    out = pn.sinusoidal_table(3, 4)
    assert out.dtype == torch.float32 and out.shape == (3, 4)
    assert torch.equal(torch.round(out.double() * 1000) / 1000, expected)
    # The reference agrees with the worked example as well.
    assert torch.equal(torch.round(reference.sinusoidal_table(3, 4) * 1000) / 1000, expected)


# --------------------------------------------------------------------------------------------
# sinusoidal_table


OPTION_GRID = list(itertools.product([True, False], [False, True], [0.0, 1.0], [False, True]))  # interleaved, cos_first, freq_shift, odd


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("interleaved,cos_first,freq_shift,odd", OPTION_GRID)
def test_table_matches_reference(device, dtype, interleaved, cos_first, freq_shift, odd):
    seed = zlib.crc32(repr((dtype, interleaved, cos_first, freq_shift, odd)).encode())
    g = gen(seed)
    for kind in ("int32", "int64", "float32", "float64"):
        n = int(torch.randint(1, 200, (1,), generator=g))
        dim = 2 * int(torch.randint(2, 100, (1,), generator=g)) + (1 if odd else 0)
        angle_scale = [1.0, 0.37, 1000.0][int(torch.randint(0, 3, (1,), generator=g))]
        base = [10000.0, 500.0, 1e5][int(torch.randint(0, 3, (1,), generator=g))]
        pos = random_positions(g, n, kind)
        kw = dict(base=base, interleaved=interleaved, freq_shift=freq_shift, angle_scale=angle_scale,
                  cos_first=cos_first)
        out = pn.sinusoidal_table(pos.to(device), dim, dtype=dtype, **kw)
        assert out.dtype == dtype and out.shape == (n, dim) and out.device.type == device
        truth = reference.sinusoidal_table(pos, dim, **kw)
        err = rel_err(out, truth)
        assert err <= tol(dtype, float(pos.double().abs().max()) * angle_scale), f"{kind} positions, dim {dim}, {kw}: rel error {err:.3e}"
        if odd:
            assert torch.all(out[:, -1] == 0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_16_bit_tables_are_the_float32_table_rounded_once(dtype):
    """On the CPU a 16-bit table is formed from the same float32 values as the float32 table, then
    rounded once to nearest even (bf16 rows without the NaN test, csrc/core/common.h,
    from_math_finite): bit for bit what torch's rounding makes of the float32 table. The tolerance
    tests above would not see a rounding off by one ulp. Tiny angle scales give subnormal values."""
    g = gen(41)
    for interleaved, cos_first in itertools.product([True, False], [False, True]):
        for kind in ("int64", "float64"):
            n = int(torch.randint(1, 300, (1,), generator=g))
            dim = int(torch.randint(2, 300, (1,), generator=g))
            pos = random_positions(g, n, kind, high=1 << 24)
            for angle_scale in (1.0, 0.37, 1e-30, 1e-39):
                kw = dict(interleaved=interleaved, cos_first=cos_first, angle_scale=angle_scale)
                table = pn.sinusoidal_table(pos, dim, dtype=dtype, **kw)
                rounded = pn.sinusoidal_table(pos, dim, **kw).to(dtype)
                assert torch.equal(table.view(torch.int16), rounded.view(torch.int16)), (kind, dim, kw)


@pytest.mark.parametrize("device", DEVICES)
def test_table_int_length_and_device_argument(device):
    out = pn.sinusoidal_table(77, 30, device=device)
    assert out.device.type == device and out.shape == (77, 30)
    assert rel_err(out, reference.sinusoidal_table(torch.arange(77), 30)) <= TOL[torch.float32]
    # Positions tensor on the CPU with device= moves the work there.
    pos = torch.randint(0, 5000, (40,), generator=gen(3))
    out = pn.sinusoidal_table(pos, 18, device=device, dtype=torch.float64)
    assert out.device.type == device
    assert rel_err(out, reference.sinusoidal_table(pos, 18)) <= TOL[torch.float64]


def test_table_other_position_dtypes():
    g = gen(11)
    for dt in (torch.int16, torch.uint8, torch.float16, torch.bfloat16):
        pos = (torch.rand(50, generator=g) * 200).to(dt)
        out = pn.sinusoidal_table(pos, 24)
        assert rel_err(out, reference.sinusoidal_table(pos, 24)) <= TOL[torch.float32], dt


def test_table_empty():
    assert pn.sinusoidal_table(0, 8).shape == (0, 8)
    assert pn.sinusoidal_table(torch.empty(0, dtype=torch.long), 9, dtype=torch.float16).shape == (0, 9)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dim", [64, 128, 333, 512, 1024])
def test_table_float32_precision_up_to_2_pow_24(device, dim):
    """cos/sin error <= 2e-6 absolute at every position below 2^24 (float32 output)."""
    g = gen(dim)
    pos = torch.randint(0, 1 << 24, (1500,), generator=g, dtype=torch.int64)
    pos[:4] = torch.tensor([(1 << 24) - 1, (1 << 24) - 2, (1 << 20) + 1, (1 << 23) + 12345])
    for interleaved, freq_shift in ((True, 0.0), (False, 1.0)):
        kw = dict(interleaved=interleaved, freq_shift=freq_shift)
        out = pn.sinusoidal_table(pos.to(device), dim, **kw)
        err = (out.double().cpu() - reference.sinusoidal_table(pos, dim, **kw)).abs().max().item()
        assert err <= 2e-6, f"dim {dim}, {kw}: max abs error {err:.3e}"
    # Fractional (float64) positions across the same range.
    fpos = torch.rand(1000, generator=g, dtype=torch.float64) * (1 << 24)
    out = pn.sinusoidal_table(fpos.to(device), dim)
    err = (out.double().cpu() - reference.sinusoidal_table(fpos, dim)).abs().max().item()
    assert err <= 2e-6, f"float64 positions, dim {dim}: max abs error {err:.3e}"


# --------------------------------------------------------------------------------------------
# add_sinusoidal


# x kinds: (shape of the underlying buffer, view of it with logical shape [batch, seq, dim] or [seq, dim])
X_KINDS = {
    "3d": (lambda b, s, d: (b, s, d), lambda t, b, s, d: t),
    "2d": (lambda b, s, d: (s, d), lambda t, b, s, d: t),
    # a view into a wider buffer (e.g. part of a fused projection)
    "3d_sliced_last": (lambda b, s, d: (b, s, d + 7), lambda t, b, s, d: t[..., 3:3 + d]),
    "3d_step_seq": (lambda b, s, d: (b, 2 * s, d), lambda t, b, s, d: t[:, ::2]),
    # [S, B, D] storage seen as [B, S, D]
    "3d_batch_transposed": (lambda b, s, d: (s, b, d), lambda t, b, s, d: t.transpose(0, 1)),
    "2d_sliced": (lambda b, s, d: (s + 3, d + 5), lambda t, b, s, d: t[2:2 + s, 1:1 + d]),
    # [B, D, S] storage seen as [B, S, D]: the last dim is not contiguous
    "3d_last_dim_strided": (lambda b, s, d: (b, d, s), lambda t, b, s, d: t.transpose(1, 2)),
    "2d_transposed": (lambda b, s, d: (d, s), lambda t, b, s, d: t.t()),
}


def _make_x(g: torch.Generator, kind: str, batch: int, seq: int, dim: int, dtype=torch.float64, device="cpu"):
    """Random x of the given kind; the buffer is rounded to dtype before the view is taken."""
    shape_fn, view_fn = X_KINDS[kind]
    buf = torch.randn(*shape_fn(batch, seq, dim), generator=g, dtype=torch.float64).to(device=device, dtype=dtype)
    return view_fn(buf, batch, seq, dim)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("x_kind", list(X_KINDS))
def test_add_sinusoidal_matches_reference(device, dtype, x_kind):
    g = gen(zlib.crc32(repr((dtype, x_kind)).encode()))
    for case in range(6):
        batch = int(torch.randint(1, 4, (1,), generator=g))
        seq = int(torch.randint(1, 40, (1,), generator=g))
        dim = int(torch.randint(2, 130, (1,), generator=g))  # odd and even
        x_dev = _make_x(g, x_kind, batch, seq, dim, dtype, device)
        # The float64 reference sees the same rounded inputs.
        x_lp = x_dev.detach().cpu().double()
        kw = dict(interleaved=bool(case % 2), cos_first=case in (2, 5), freq_shift=float(case % 3 == 1) if dim >= 4 else 0.0,
                  angle_scale=[1.0, 0.5, 30.0][case % 3], x_scale=[1.0, math.sqrt(dim), 0.25][case % 3])
        pos_mode = case % 4
        args = {}
        if pos_mode == 0:
            args["offset"] = int(torch.randint(0, 5000, (1,), generator=g))
            pos_ref = None
        elif pos_mode == 1:
            pos_ref = torch.randint(0, 100000, (seq,), generator=g, dtype=torch.int32)
        elif pos_mode == 2 and x_lp.dim() == 3:
            pos_ref = torch.randint(0, 100000, (batch, seq), generator=g, dtype=torch.int64)
        elif pos_mode == 2:
            pos_ref = torch.rand(seq, generator=g, dtype=torch.float64) * 1000  # fractional timesteps
        else:
            pos_ref = (torch.rand(1, seq, generator=g) * 1000) if x_lp.dim() == 3 else torch.arange(seq)
            args["offset"] = 17
        if pos_ref is not None:
            args["positions"] = pos_ref.to(device)
        out = pn.add_sinusoidal(x_dev, **args, **kw)
        assert out.dtype == dtype and out.shape == x_dev.shape and out.device.type == device
        ref_pos = None if pos_ref is None else (pos_ref + args.get("offset", 0))
        # the reference adds offset to given positions too, as the op does (issue 8)
        truth = reference.add_sinusoidal(x_lp, pos_ref, offset=args.get("offset", 0), **kw)
        err = rel_err(out, truth)
        max_pos = float(ref_pos.double().abs().max()) if ref_pos is not None else args["offset"] + seq
        assert err <= tol(dtype, max_pos * kw["angle_scale"]), f"case {case} {x_kind} {tuple(x_lp.shape)} {args.keys()} {kw}: rel error {err:.3e}"


@pytest.mark.parametrize("device", DEVICES)
def test_add_sinusoidal_offset_equals_shifted_positions(device):
    g = gen(5)
    x = torch.randn(2, 9, 32, generator=g).to(device)
    a = pn.add_sinusoidal(x, offset=123)
    b = pn.add_sinusoidal(x, torch.arange(123, 132, device=device))
    c = pn.add_sinusoidal(x, torch.arange(9, device=device), offset=123)
    assert torch.equal(a, b) and torch.equal(a, c)
    assert rel_err(a, reference.add_sinusoidal(x.double().cpu(), offset=123)) <= TOL[torch.float32]
    # the raw op bounds the offset as the Python entry does: positions past 2^53 that an offset brought back
    # into the domain rounded (in float64) before it was added, every row at one position
    big = torch.tensor([2 ** 60 + 1, 2 ** 60 + 2, 2 ** 60 + 3] * 3, device=device)[:9]
    with pytest.raises(RuntimeError, match=r"offset must lie in \[-2\^48, 2\^48\].*got -1152921504606846976"):
        torch.ops.posenc.add_sinusoidal(x, big, 1.0, 10000.0, True, 0.0, 1.0, False, -2 ** 60)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_decode_calls_alternating_parameters_each_get_their_frequencies(dtype):
    """One-token calls on one thread, each changing one parameter of the frequencies from the call
    before (the CPU kernel keeps the thread's last frequencies), then back: each equals the reference."""
    g = gen(11)
    options = [dict(base=10000.0), dict(base=500.0), dict(base=500.0, freq_shift=1.0),
               dict(base=500.0, freq_shift=1.0, angle_scale=0.5), dict(base=10000.0, angle_scale=0.5),
               dict(base=10000.0)]
    for dim in (64, 66, 64):
        for opts in options:
            x = torch.randn(2, 1, dim, generator=g, dtype=dtype)
            offset = int(torch.randint(1000, 5000, (), generator=g))
            out = pn.add_sinusoidal(x, offset=offset, **opts)
            truth = reference.add_sinusoidal(x.double(), offset=offset, **opts)
            assert rel_err(out, truth) <= tol(dtype, 5000.0), (dim, opts)
            table = pn.sinusoidal_table(torch.tensor([offset]), dim, dtype=dtype, **opts)
            assert rel_err(table, reference.sinusoidal_table(torch.tensor([offset]), dim, **opts)) <= tol(dtype, 5000.0)


@pytest.mark.parametrize("device", DEVICES)
def test_add_sinusoidal_leaves_inputs_untouched(device):
    g = gen(6)
    x = torch.randn(3, 20, 48, generator=g).to(device)
    pos = torch.randint(0, 1000, (3, 20), generator=g).to(device)
    x0, pos0 = x.clone(), pos.clone()
    out = pn.add_sinusoidal(x, pos, x_scale=2.0)
    assert torch.equal(x, x0) and torch.equal(pos, pos0)
    assert out.data_ptr() != x.data_ptr()
    # Errors leave the inputs unchanged too.
    with pytest.raises(RuntimeError):
        pn.add_sinusoidal(x, pos[:, :5])
    assert torch.equal(x, x0)


def test_add_sinusoidal_empty():
    x = torch.randn(2, 0, 8)
    assert pn.add_sinusoidal(x).shape == (2, 0, 8)
    x = torch.randn(0, 4, 8)
    assert pn.add_sinusoidal(x).shape == (0, 4, 8)


# --------------------------------------------------------------------------------------------
# opcheck, autograd


def _table_samples():
    g = gen(21)
    return [
        (torch.arange(10), 16, 10000.0, True, 0.0, 1.0, False, torch.float32),
        (torch.rand(13, generator=g, dtype=torch.float64) * 999, 9, 10000.0, False, 1.0, 2.0, True, torch.float16),
        (torch.randint(0, 1 << 20, (7,), generator=g, dtype=torch.int32), 32, 500.0, True, 1.0, 1.0, True,
         torch.bfloat16),
        (torch.rand(5, generator=g) * 10, 6, 10000.0, False, 0.0, 1000.0, False, torch.float64),
    ]


def _add_samples():
    g = gen(22)
    return [
        (torch.randn(2, 7, 16, generator=g).requires_grad_(), torch.arange(7), 1.0, 10000.0, True, 0.0, 1.0, False),
        (torch.randn(5, 11, generator=g, dtype=torch.float64).requires_grad_(),
         torch.rand(5, generator=g, dtype=torch.float64) * 50, 2.5, 10000.0, False, 1.0, 3.0, True),
        (torch.randn(3, 4, 10, generator=g).to(torch.bfloat16), torch.randint(0, 999, (3, 4), generator=g), 0.5,
         100.0, True, 0.0, 1.0, True),
        (torch.randn(4, 3, 12, generator=g).transpose(0, 1).requires_grad_(),
         torch.randint(0, 999, (1, 4), generator=g, dtype=torch.int32), 1.0, 10000.0, False, 0.0, 1.0, False),
        (torch.randn(2, 6, 21, generator=g)[..., 2:19].to(torch.float16), torch.arange(6) * 3, 4.0, 10000.0, True, 0.0,
         0.1, False),
        # offset (trailing, defaulted), with default positions, int32 positions and float positions
        (torch.randn(2, 5, 16, generator=g).requires_grad_(), None, 1.5, 10000.0, True, 0.0, 1.0, False, 37),
        (torch.randn(5, 12, generator=g), torch.randint(-9, 9, (5,), generator=g, dtype=torch.int32), 1.0, 500.0,
         False, 0.0, 1.0, True, -(2 ** 40)),
        (torch.randn(3, 4, 8, generator=g, dtype=torch.float64).requires_grad_(),
         torch.rand(3, 4, generator=g, dtype=torch.float64) * 9, 1.0, 10000.0, True, 0.0, 1.0, False, 1000),
    ]


@pytest.mark.parametrize("idx", range(len(_table_samples())))
def test_opcheck_sinusoidal_table(idx):
    torch.library.opcheck(torch.ops.posenc.sinusoidal_table.default, _table_samples()[idx])


@pytest.mark.parametrize("idx", range(len(_add_samples())))
def test_opcheck_add_sinusoidal(idx):
    torch.library.opcheck(torch.ops.posenc.add_sinusoidal.default, _add_samples()[idx])


def test_gradcheck_add_sinusoidal():
    g = gen(31)
    x = torch.randn(2, 5, 9, generator=g, dtype=torch.float64, requires_grad=True)
    pos = torch.randint(0, 500, (2, 5), generator=g)
    assert torch.autograd.gradcheck(lambda t: pn.add_sinusoidal(t, pos, x_scale=1.7, interleaved=False), (x,))
    assert torch.autograd.gradgradcheck(lambda t: pn.add_sinusoidal(t, pos, x_scale=1.7), (x,))
    x2 = torch.randn(6, 13, generator=g, dtype=torch.float64)[1:5, 2:10].requires_grad_()
    assert torch.autograd.gradcheck(lambda t: pn.add_sinusoidal(t, offset=40, x_scale=-0.3, cos_first=True), (x2,))


def test_float_positions_that_want_a_gradient_are_refused():
    """Gradients flow to x only: float positions (diffusion timesteps, say) that require grad get an
    error, under autograd and torch.func alike, not a gradient silently zero or missing."""
    g = gen(32)
    p = (torch.rand(3, generator=g, dtype=torch.float64) * 100).requires_grad_()
    x = torch.randn(3, 8, generator=g, dtype=torch.float64, requires_grad=True)
    for call in (lambda: pn.sinusoidal_table(p, 8, dtype=torch.float64),
                 lambda: pn.add_sinusoidal(x, p),
                 lambda: torch.func.grad(lambda t: pn.sinusoidal_table(t, 8, dtype=torch.float64).sum())(p.detach()),
                 lambda: torch.func.grad(lambda t: pn.add_sinusoidal(x.detach(), t).sum())(p.detach())):
        with pytest.raises(RuntimeError, match="positions requires grad"):
            call()
    with torch.no_grad():  # no gradient wanted: computed as before
        table = pn.sinusoidal_table(p, 8, dtype=torch.float64)
    torch.testing.assert_close(table, reference.sinusoidal_table(p.detach(), 8), atol=1e-12, rtol=0)
    torch.testing.assert_close(pn.add_sinusoidal(x, p.detach()), reference.add_sinusoidal(x.detach(), p.detach()),
                               atol=1e-12, rtol=0)


def test_torch_compile_fullgraph():
    """No graph breaks: both ops trace as single custom-op nodes (aot_eager keeps the test cheap)."""
    g = gen(33)
    x = torch.randn(2, 12, 40, generator=g, requires_grad=True)
    pos = torch.randint(0, 3000, (2, 12), generator=g)

    def f(x, pos):
        table = torch.ops.posenc.sinusoidal_table(pos[0], 40, 10000.0, True, 0.0, 1.0, False, torch.float32)
        return pn.add_sinusoidal(x, pos, x_scale=2.0) + table

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    out = compiled(x, pos)
    truth = reference.add_sinusoidal(x.detach().double(), pos, x_scale=2.0) + reference.sinusoidal_table(pos[0], 40)
    assert rel_err(out, truth) <= TOL[torch.float32]
    out.sum().backward()
    assert torch.allclose(x.grad, torch.full_like(x, 2.0))


def test_add_sinusoidal_backward_matches_reference():
    g = gen(32)
    x = torch.randn(3, 8, 20, generator=g, requires_grad=True)
    w = torch.randn(3, 8, 20, generator=g)
    (pn.add_sinusoidal(x, x_scale=3.0) * w).sum().backward()
    assert torch.allclose(x.grad, 3.0 * w)


# --------------------------------------------------------------------------------------------
# Bad input: every message names the argument and what was expected.


def test_bad_dim():
    for dim in (1, 0, -3):
        with pytest.raises(RuntimeError, match=r"posenc\.sinusoidal_table: dim must be >= 2, got " + str(dim)):
            pn.sinusoidal_table(5, dim)
    with pytest.raises(RuntimeError, match=r"posenc\.add_sinusoidal: dim must be >= 2, got 1"):
        pn.add_sinusoidal(torch.randn(2, 5, 1))
    with pytest.raises(RuntimeError, match=r"posenc\.sinusoidal_table: the output \[positions, dim\] = "
                       r"\[16, 2305843009213693952\] of Half has more than 2\^63 bytes"):
        pn.sinusoidal_table(16, 2**61, dtype=torch.float16)


def test_bad_positions_rank():
    with pytest.raises(RuntimeError, match=r"sinusoidal_table: positions must be 1-D \[N\], got shape \[2, 3\]"):
        pn.sinusoidal_table(torch.arange(6).view(2, 3), 8)
    with pytest.raises(RuntimeError, match=r"sinusoidal_table: positions must be 1-D \[N\], got shape \[\]"):
        pn.sinusoidal_table(torch.tensor(3), 8)
    with pytest.raises(RuntimeError, match=r"add_sinusoidal: positions must be \[seq\] or \[batch, seq\], got shape \[1, 2, 5\]"):
        pn.add_sinusoidal(torch.randn(2, 5, 8), torch.arange(10).view(1, 2, 5))
    with pytest.raises(RuntimeError, match=r"add_sinusoidal: positions must be \[seq\], got shape \[2, 5\]"):
        pn.add_sinusoidal(torch.randn(5, 8), torch.arange(10).view(2, 5))


def test_bad_x_rank():
    for shape in ((8,), (2, 3, 4, 8)):
        with pytest.raises(RuntimeError, match=r"add_sinusoidal: x must be \[batch, seq, dim\] or \[seq, dim\], got shape"):
            pn.add_sinusoidal(torch.randn(*shape), torch.arange(shape[-2] if len(shape) > 1 else 1))


def test_bad_positions_length():
    x = torch.randn(2, 5, 8)
    with pytest.raises(RuntimeError, match=r"add_sinusoidal: positions must have seq = 5 entries in its last dim, got shape \[4\]"):
        pn.add_sinusoidal(x, torch.arange(4))
    with pytest.raises(RuntimeError, match=r"add_sinusoidal: positions must have seq = 5 entries in its last dim, got shape \[2, 6\]"):
        pn.add_sinusoidal(x, torch.arange(12).view(2, 6))
    with pytest.raises(RuntimeError, match=r"add_sinusoidal: positions \[batch, seq\] must have batch 2 or 1, got shape \[3, 5\]"):
        pn.add_sinusoidal(x, torch.arange(15).view(3, 5))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool, torch.complex64, torch.uint8])
def test_bad_x_dtype(dtype):
    x = torch.randn(2, 5, 8).to(dtype)
    name = {torch.int32: "Int", torch.int64: "Long", torch.bool: "Bool", torch.complex64: "ComplexFloat",
            torch.uint8: "Byte"}[dtype]
    with pytest.raises(RuntimeError, match=rf"add_sinusoidal: x must be float32, float16, bfloat16 or float64, got {name}"):
        pn.add_sinusoidal(x)


@pytest.mark.parametrize("dtype,name", [(torch.int32, "Int"), (torch.int64, "Long"), (torch.bool, "Bool"),
                                        (torch.complex64, "ComplexFloat")])
def test_bad_table_dtype(dtype, name):
    with pytest.raises(RuntimeError, match=rf"sinusoidal_table: dtype must be float32, float16, bfloat16 or float64, got {name}"):
        pn.sinusoidal_table(4, 8, dtype=dtype)


@pytest.mark.parametrize("dtype,name", [(torch.bool, "Bool"), (torch.complex64, "ComplexFloat"),
                                        (torch.complex128, "ComplexDouble")])
def test_bad_positions_dtype(dtype, name):
    pos = torch.ones(5, dtype=dtype)
    with pytest.raises(RuntimeError, match=rf"sinusoidal_table: positions must be an integer or floating point tensor, got {name}"):
        pn.sinusoidal_table(pos, 8)
    with pytest.raises(RuntimeError, match=rf"add_sinusoidal: positions must be an integer or floating point tensor, got {name}"):
        pn.add_sinusoidal(torch.randn(2, 5, 8), pos)


def test_bad_options():
    with pytest.raises(RuntimeError, match=r"sinusoidal_table: freq_shift must be smaller than dim // 2 = 4, got 4"):
        pn.sinusoidal_table(3, 8, freq_shift=4.0)
    with pytest.raises(RuntimeError, match=r"add_sinusoidal: freq_shift must be smaller than dim // 2 = 1, got 1"):
        pn.add_sinusoidal(torch.randn(3, 3), freq_shift=1.0)
    for base in (0.0, -2.0, 1.0, math.inf, math.nan):
        with pytest.raises(RuntimeError, match=r"sinusoidal_table: base must be a finite number > 0 and != 1"):
            pn.sinusoidal_table(3, 8, base=base)
    with pytest.raises(RuntimeError, match=r"sinusoidal_table: angle_scale must be finite"):
        pn.sinusoidal_table(3, 8, angle_scale=math.nan)
    with pytest.raises(RuntimeError, match=r"add_sinusoidal: x_scale must be finite"):
        pn.add_sinusoidal(torch.randn(3, 8), x_scale=math.inf)


def test_bad_python_positions():
    with pytest.raises(ValueError, match=r"positions must be a length >= 0, got -1"):
        pn.sinusoidal_table(-1, 8)
    with pytest.raises(TypeError, match=r"positions must be an int length or a 1-D tensor"):
        pn.sinusoidal_table(True, 8)


@pytest.mark.parametrize("x_device,pos_device", [("cpu", "meta"), ("meta", "cpu")])
def test_device_mismatch_without_gpu(x_device, pos_device):
    """Positions on another device than x must be rejected, as torch's own ops do; the meta device
    lets this run on a machine without a GPU. (A silent success would hand back an uninitialized
    tensor.)"""
    x = torch.randn(2, 5, 8, device=x_device)
    pos = torch.arange(5, device=pos_device)
    with pytest.raises(RuntimeError, match=r"positions must be on the same device as x"):
        pn.add_sinusoidal(x, pos)


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")
def test_device_mismatch_cuda():
    x = torch.randn(2, 5, 8, device="cuda")
    with pytest.raises(RuntimeError, match=r"add_sinusoidal: positions must be on the same device as x \(cuda:0\), got cpu"):
        torch.ops.posenc.add_sinusoidal(x, torch.arange(5), 1.0, 10000.0, True, 0.0, 1.0, False)
    with pytest.raises(RuntimeError, match=r"add_sinusoidal: positions must be on the same device as x \(cpu\), got cuda"):
        torch.ops.posenc.add_sinusoidal(x.cpu(), torch.arange(5, device="cuda"), 1.0, 10000.0, True, 0.0, 1.0, False)


def test_meta_shapes():
    """Fake kernels give the right shapes and dtypes without running anything."""
    out = pn.sinusoidal_table(torch.arange(7, device="meta"), 10, dtype=torch.bfloat16)
    assert out.device.type == "meta" and out.shape == (7, 10) and out.dtype == torch.bfloat16
    out = pn.add_sinusoidal(torch.empty(2, 7, 10, device="meta", dtype=torch.float16))
    assert out.device.type == "meta" and out.shape == (2, 7, 10) and out.dtype == torch.float16
    with pytest.raises(RuntimeError, match=r"dim must be >= 2"):
        pn.sinusoidal_table(torch.arange(7, device="meta"), 1)


# --------------------------------------------------------------------------------------------
# Modules


@pytest.mark.parametrize("device", DEVICES)
def test_sinusoidal_module(device):
    g = gen(41)
    m = pn.SinusoidalPositionalEncoding(d_model=96, max_len=120).to(device)
    assert m.pe.shape == (1, 120, 96) and m.pe.dtype == torch.float32 and m.pe.device.type == device
    assert rel_err(m.pe[0], reference.sinusoidal_table(120, 96)) <= TOL[torch.float32]
    x = torch.randn(3, 50, 96, generator=g).to(device)
    assert rel_err(m(x), reference.add_sinusoidal(x.double().cpu())) <= TOL[torch.float32]
    # The seed articles' forward, x + pe[:, :S], agrees.
    assert torch.allclose(m(x), x + m.pe[:, :50], atol=1e-6)
    assert rel_err(m(x, offset=30), reference.add_sinusoidal(x.double().cpu(), offset=30)) <= TOL[torch.float32]
    # Longer than max_len: computed on the fly.
    x_long = torch.randn(2, 300, 96, generator=g).to(device)
    assert rel_err(m(x_long), reference.add_sinusoidal(x_long.double().cpu())) <= TOL[torch.float32]
    with pytest.raises(ValueError, match=r"d_model=96"):
        m(torch.randn(2, 5, 64, device=device))


@pytest.mark.parametrize("device", DEVICES)
def test_learnable_module(device):
    g = gen(42)
    m = pn.LearnablePositionalEncoding(d_model=40, max_len=64).to(device)
    w = m.position_embeddings.weight
    assert w.shape == (64, 40)
    x = torch.randn(2, 30, 40, generator=g).to(device)
    assert torch.equal(m(x), x + w[:30])
    assert torch.equal(m(x, offset=34), x + w[34:64])
    m(x).sum().backward()
    assert torch.equal(w.grad[:30], torch.full((30, 40), 2.0, device=device))
    assert torch.all(w.grad[30:] == 0)
    with pytest.raises(ValueError, match=r"sequence of length 65 at offset 0 exceeds max_len=64"):
        m(torch.randn(1, 65, 40, device=device))
    with pytest.raises(ValueError, match=r"sequence of length 30 at offset 35 exceeds max_len=64"):
        m(x, offset=35)
    with pytest.raises(ValueError, match=r"offset must be >= 0 \(a learned table has no rows before position 0\), got -3"):
        m(x, offset=-3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_add_sinusoidal_x_scale_beyond_float32_is_a_clear_error(dtype):
    """Rows of 32- and 16-bit x are computed in float32, where an x_scale past its range is infinite
    (x * x_scale: NaN at x = 0, where the exact result is the encoding): refused before any write.
    A float64 x computes in float64 and takes it."""
    x = torch.randn(1, 4, 8, dtype=torch.float64) * 1e-40
    for scale in (1e39, -3.5e38):
        with pytest.raises(RuntimeError, match="x_scale must be within float32's range"):
            pn.add_sinusoidal(x.to(dtype), x_scale=scale)
    got = pn.add_sinusoidal(x, x_scale=1e39)
    want = x * 1e39 + reference.sinusoidal_table(torch.arange(4), 8)
    torch.testing.assert_close(got, want, rtol=1e-15, atol=1e-15)
    edge = float(torch.finfo(torch.float32).max)  # the largest float32 is taken
    assert torch.isfinite(pn.add_sinusoidal(torch.zeros(1, 4, 8, dtype=dtype), x_scale=edge)).all()
