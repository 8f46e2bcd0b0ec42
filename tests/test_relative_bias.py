"""Relative position biases: T5 buckets and bias, ALiBi (posenc_native.bias, csrc/core/relative_bias.h).

Checked against transformers (T5Attention._relative_position_bucket / compute_bias, BLOOM's and MPT's
ALiBi slopes), the exact integer reference (posenc_native.reference) and float64 autograd; then the
score mods under flex_attention, the modules, opcheck, torch.compile / export / TorchScript, bad input,
and the CUDA kernels' work items run on the host.
"""
from __future__ import annotations

import math
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import posenc_native as pn
from posenc_native import reference

transformers = pytest.importorskip("transformers")
from transformers import T5Config  # noqa: E402
from transformers.models.bloom.modeling_bloom import build_alibi_tensor as build_bloom_alibi_tensor  # noqa: E402
from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor  # noqa: E402
from transformers.models.t5.modeling_t5 import T5Attention  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def bloom_slopes(heads: int) -> torch.Tensor:
    """BLOOM's slopes through its public `build_alibi_tensor` (older transformers have no `_get_alibi_slopes`):
    its value at the second token (position 1) is the slope itself, slope * 1.0 with no rounding."""
    mask = torch.ones(1, 2, dtype=torch.long)
    return build_bloom_alibi_tensor(mask, heads, torch.float32)[:, 0, 1]
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() and pn.build_info()["cuda"] else [])
hf_bucket = T5Attention._relative_position_bucket


def t5_attention(heads: int = 4, num_buckets: int = 32, max_distance: int = 128, decoder: bool = False,
                 dtype: torch.dtype = torch.float32, device: str = "cpu", seed: int = 0) -> T5Attention:
    torch.manual_seed(seed)
    cfg = T5Config(d_model=8 * heads, d_kv=8, num_heads=heads, relative_attention_num_buckets=num_buckets,
                   relative_attention_max_distance=max_distance, is_decoder=decoder)
    attn = T5Attention(cfg, has_relative_attention_bias=True, layer_idx=0)
    nn.init.normal_(attn.relative_attention_bias.weight, std=1.0)
    return attn.to(device=device, dtype=dtype)


def is_at_an_edge(n: int, num_buckets: int, max_distance: int, bidirectional: bool) -> bool:
    """Whether distance n sits on a log-bucket edge, exactly ((n / me)^span = (md / me)^k for an
    integer k) or closer to one than float32 resolves: transformers' float32 log may round either way
    there (csrc/core/relative_bias.h), e.g. 186 of 59 one-way buckets up to 296 is 52.9999993, and
    transformers gives bucket 53."""
    per = num_buckets // 2 if bidirectional else num_buckets
    me, span = per // 2, per - per // 2
    if n < me or n >= max_distance:
        return False
    if any(n ** span * me ** k == max_distance ** k * me ** span for k in range(1, span + 1)):
        return True
    value = me + math.log(n / me) / math.log(max_distance / me) * span  # float64: 1e-13 off at most
    return abs(value - round(value)) <= 2.0 ** -20 * value  # a few float32 roundings away


def valid_configs():
    """(bidirectional, num_buckets, max_distance) drawn over the valid range."""
    def build(bidirectional, half, extra):
        num_buckets = 2 * half if bidirectional else half
        per = num_buckets // 2 if bidirectional else num_buckets
        return bidirectional, num_buckets, per // 2 + extra
    return st.builds(build, st.booleans(), st.integers(2, 80), st.integers(1, 3000))


# ------------------------------------------------------------------------------------------------
# Buckets


@pytest.mark.parametrize("bidirectional,num_buckets,max_distance",
                         [(True, 32, 128), (False, 32, 128), (True, 64, 256), (False, 16, 64), (True, 48, 100),
                          (False, 10, 33), (True, 128, 4096), (False, 7, 1000)])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_bucket_equals_transformers_on_random_positions(bidirectional, num_buckets, max_distance, dtype):
    g = torch.Generator().manual_seed(num_buckets * 1000 + max_distance)
    rp = torch.randint(-10 ** 6, 10 ** 6 + 1, (200_000,), generator=g, dtype=torch.int64).to(dtype)
    want = hf_bucket(rp, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance)
    got = pn.t5_relative_position_bucket(rp, bidirectional=bidirectional, num_buckets=num_buckets,
                                         max_distance=max_distance)
    assert got.dtype == torch.int64 and got.shape == rp.shape
    assert torch.equal(got, want)
    assert len(torch.unique(got)) > 2  # both directions / several buckets reached


@settings(max_examples=60, deadline=None)
@given(config=valid_configs())
def test_bucket_every_distance_matches_transformers_and_the_exact_reference(config):
    """Every relative position in [-3 md, 3 md]: the exact integer reference everywhere, transformers
    everywhere except at bucket edges (its float32 log decides those; the kernel gives the exact value)."""
    bidirectional, num_buckets, max_distance = config
    kw = dict(bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance)
    rp = torch.arange(-3 * max_distance - 5, 3 * max_distance + 6).flip(0)[torch.randperm(6 * max_distance + 11)]
    got = pn.t5_relative_position_bucket(rp, **kw)
    assert torch.equal(got, reference.t5_relative_position_bucket(rp, **kw))
    want = hf_bucket(rp, **kw)
    differ = (got != want).nonzero().flatten().tolist()
    for i in differ:
        r = int(rp[i])
        n = abs(r) if bidirectional else max(-r, 0)
        assert is_at_an_edge(n, num_buckets, max_distance, bidirectional), (r, int(got[i]), int(want[i]))


def test_bucket_at_an_exact_edge_is_the_exact_value():
    # (18 / 8)^9 = (27 / 8)^6: the real bucket value is 8 + 6 exactly; float32 math may land below.
    rp = torch.tensor([-18, 18, -17, 17, -19, 19])
    got = pn.t5_relative_position_bucket(rp, bidirectional=True, num_buckets=34, max_distance=27)
    assert got.tolist() == [14, 31, 13, 30, 14, 31]


def test_bucket_extreme_positions():
    big = torch.tensor([-2 ** 63, 2 ** 63 - 1, -2 ** 40, 2 ** 40, 0, 1, -1], dtype=torch.int64)
    got = pn.t5_relative_position_bucket(big)
    assert got.tolist() == [15, 31, 15, 31, 0, 17, 1]
    got = pn.t5_relative_position_bucket(big, bidirectional=False)
    assert got.tolist() == [31, 0, 31, 0, 0, 0, 1]
    empty = pn.t5_relative_position_bucket(torch.empty(0, 3, dtype=torch.int32))
    assert empty.shape == (0, 3) and empty.dtype == torch.int64


# ------------------------------------------------------------------------------------------------
# T5 bias


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("decoder", [False, True])
def test_bias_equals_compute_bias(device, dtype, decoder):
    attn = t5_attention(heads=6, decoder=decoder, dtype=dtype, device=device, seed=1)
    w = attn.relative_attention_bias.weight
    for lq, lk, past in [(37, 37, 0), (1, 300, 299), (5, 260, 255), (64, 3, 0), (3, 500, 0), (0, 4, 0), (4, 0, 0),
                         (9, 21, 12)]:
        want = attn.compute_bias(lq, lk, device=device, past_seen_tokens=past)
        got = pn.relative_position_bias(w, lq, lk, bidirectional=not decoder, max_distance=128, query_offset=past)
        assert got.shape == want.shape == (1, 6, lq, lk) and got.dtype == dtype and got.is_contiguous()
        assert torch.equal(got, want), (lq, lk, past)
    # query_offset as a tensor (transformers' past_seen_tokens with a static cache)
    got = pn.relative_position_bias(w, 2, 50, bidirectional=not decoder, query_offset=torch.tensor(48))
    assert torch.equal(got, attn.compute_bias(2, 50, past_seen_tokens=48))


@settings(max_examples=30, deadline=None)
@given(config=valid_configs(), lq=st.integers(1, 40), lk=st.integers(1, 300), offset=st.integers(-50, 5000),
       heads=st.integers(1, 9))
def test_bias_equals_the_exact_reference(config, lq, lk, offset, heads):
    bidirectional, num_buckets, max_distance = config
    w = torch.randn(num_buckets, heads, dtype=torch.float64)
    got = pn.relative_position_bias(w, lq, lk, bidirectional=bidirectional, max_distance=max_distance,
                                    query_offset=offset)
    want = reference.relative_position_bias(w, lq, lk, bidirectional=bidirectional, max_distance=max_distance,
                                            query_offset=offset)
    assert torch.equal(got, want)


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (8, 9), (16, 20), (64, 1000)])
def test_long_bias_rows_equal_the_exact_reference(bidirectional, num_buckets, max_distance):
    """Rows longer than the CPU table's chunks (256 diagonals), where most diagonals past
    max_distance share one bucket (the kernel fills runs of one bucket), on both sides of r = 0,
    and ALiBi rows, per dtype, rounded once from the float64 product."""
    g = torch.Generator().manual_seed(num_buckets + max_distance)
    w = torch.randn(num_buckets, 5, generator=g, dtype=torch.float64)
    slopes = torch.rand(5, generator=g) * 2 - 1
    for lq, lk, offset in [(1, 255, 254), (1, 257, 256), (1, 3000, 2999), (3, 1000, 0), (2, 700, -350),
                           (1, 600, 10 ** 6), (1, 513, -600), (4, 256, 100)]:
        want = reference.relative_position_bias(w, lq, lk, bidirectional=bidirectional, max_distance=max_distance,
                                                query_offset=offset)
        for dtype in (torch.float64, torch.float32, torch.bfloat16, torch.float16):
            got = pn.relative_position_bias(w.to(dtype), lq, lk, bidirectional=bidirectional,
                                            max_distance=max_distance, query_offset=offset)
            assert torch.equal(got, want.to(dtype)), (dtype, lq, lk, offset)
        if bidirectional and num_buckets == 32:
            exact = reference.alibi_bias(slopes, lq, lk, query_offset=offset)
            for dtype in (torch.float64, torch.float32, torch.bfloat16, torch.float16):
                got = pn.alibi_bias(slopes, lq, lk, query_offset=offset, dtype=dtype)
                assert torch.equal(got, exact.to(dtype) if dtype == torch.float64 else exact.float().to(dtype)), (
                    dtype, lq, lk, offset)


def test_bias_reads_a_strided_weight():
    w = torch.randn(8, 32, dtype=torch.float32).t()  # [32, 8] with strides (1, 32)
    got = pn.relative_position_bias(w, 20, 30, query_offset=4)
    assert torch.equal(got, pn.relative_position_bias(w.contiguous(), 20, 30, query_offset=4))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("decoder", [False, True])
def test_bias_gradient_equals_autograd_through_transformers(device, decoder):
    attn = t5_attention(heads=5, decoder=decoder, device=device, seed=2)
    attn64 = t5_attention(heads=5, decoder=decoder, device=device, seed=2).double()
    w, w64 = attn.relative_attention_bias.weight, attn64.relative_attention_bias.weight
    for lq, lk, past in [(200, 260, 0), (1, 400, 399), (33, 40, 7)]:
        g = torch.randn(1, 5, lq, lk, device=device).double()  # float32 values: the same gradient for both
        want64 = torch.autograd.grad(attn64.compute_bias(lq, lk, past_seen_tokens=past), w64, g)[0]
        want32 = torch.autograd.grad(attn.compute_bias(lq, lk, past_seen_tokens=past), w, g.float())[0]
        bias = pn.relative_position_bias(w, lq, lk, bidirectional=not decoder, query_offset=past)
        got = torch.autograd.grad(bias, w, g.float())[0]
        assert got.dtype == torch.float32 and got.shape == w.shape
        # float64 sums, one rounding: as close to the float64 truth as float32 allows
        torch.testing.assert_close(got.double(), want64, rtol=2e-7, atol=1e-6)
        torch.testing.assert_close(got, want32, rtol=1e-4, atol=1e-4)  # transformers sums in float32
        got64 = torch.autograd.grad(pn.relative_position_bias(w64, lq, lk, bidirectional=not decoder,
                                                              query_offset=past), w64, g)[0]
        torch.testing.assert_close(got64, want64, rtol=1e-12, atol=1e-10)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,half_ulp", [(torch.bfloat16, 2.0 ** -8), (torch.float16, 2.0 ** -11)])
def test_16_bit_bias_gradients_are_the_float64_sums_rounded_once(device, dtype, half_ulp):
    """A 16-bit gradient's values are summed in float64 (CPU: widened to float32 a chunk of 256 at a
    time, by the SIMD kernel where there is one) and rounded once: T5's weight gradient to its dtype,
    within half an ulp of the float64 truth; ALiBi's to its float32 slopes' dtype (alibi_bias_backward
    returns the float64 sums), within float32's, however far past the 16-bit range (lk=600: fp16
    sums past 65504, which were infinities when they were rounded to the gradient's dtype first)."""
    g = torch.Generator().manual_seed(int(torch.randint(0, 2 ** 31, ())))
    largest = 0.0
    for lq, lk in [(40, 300), (7, 600), (3, 5)]:
        w = torch.randn(32, 4, generator=g).to(dtype).to(device).requires_grad_()
        slopes = (torch.rand(4, generator=g) + 0.1).to(device).requires_grad_()
        grad = (torch.randn(1, 4, lq, lk, generator=g) + 1).to(dtype).to(device)  # mean 1: ALiBi's sums grow
        w64, slopes64 = w.detach().double().requires_grad_(), slopes.detach().double().requires_grad_()
        want = torch.autograd.grad(reference.relative_position_bias(w64, lq, lk, query_offset=1), w64, grad.double())[0]
        got = torch.autograd.grad(pn.relative_position_bias(w, lq, lk, query_offset=1), w, grad)[0]
        assert got.dtype == dtype and want.abs().sum() > 0
        torch.testing.assert_close(got.double(), want, rtol=half_ulp, atol=2.0 ** -24)
        want = torch.autograd.grad(reference.alibi_bias(slopes64, lq, lk), slopes64, grad.double())[0]
        got = torch.autograd.grad(pn.alibi_bias(slopes, lq, lk, dtype=dtype), slopes, grad)[0]
        assert got.dtype == torch.float32
        torch.testing.assert_close(got.double(), want, rtol=2.0 ** -24, atol=0)
        largest = max(largest, want.abs().max().item())
    assert largest > 65504  # a slopes gradient past fp16's range


def test_bias_backward_is_deterministic_across_thread_counts():
    g = torch.randn(1, 8, 700, 900)
    runs = []
    threads = torch.get_num_threads()
    try:
        for n in (1, 2, 1, 2):
            torch.set_num_threads(n)
            runs.append(torch.ops.posenc.relative_position_bias_backward(g, True, 32, 128, 3))
            runs.append(torch.ops.posenc.alibi_bias_backward(g, 3))
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(runs[0::2], runs[2::2]):
        assert torch.equal(a, b)
    for a, b in zip(runs[1::2], runs[3::2]):
        assert torch.equal(a, b)


def test_bias_backward_of_a_strided_gradient():
    w = torch.randn(32, 4, dtype=torch.float64, requires_grad=True)
    g = torch.randn(1, 30, 4, 20, dtype=torch.float64).transpose(1, 2)  # [1, 4, 30, 20], non-contiguous
    got = torch.autograd.grad(pn.relative_position_bias(w, 30, 20, query_offset=2), w, g)[0]
    want = torch.autograd.grad(reference.relative_position_bias(w, 30, 20, query_offset=2), w, g)[0]
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    # .sum().backward() hands over an expanded gradient: every stride 0
    pn.relative_position_bias(w, 30, 20, query_offset=2).sum().backward()
    got, w.grad = w.grad, None
    reference.relative_position_bias(w, 30, 20, query_offset=2).sum().backward()
    torch.testing.assert_close(got, w.grad, rtol=1e-12, atol=1e-12)
    assert got.abs().sum() > 0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bidirectional", [True, False])
def test_bias_backward_sums_each_buckets_diagonals(device, bidirectional):
    """The backward finds each bucket's diagonals by bisection (csrc/core/relative_bias.h,
    BucketDiagonals): checked against a scatter-sum over the buckets t5_relative_position_bucket gives
    every (query, key) pair, for bucket counts down to the smallest, max_distance just past the exact
    distances, and offsets that put r = 0 before, inside and after the diagonals."""
    g = torch.Generator().manual_seed(int(torch.randint(0, 2 ** 31, ())))
    counts = (4, 6, 10, 32) if bidirectional else (2, 3, 5, 32)
    for num_buckets in counts:
        exact = num_buckets // 2 // 2 if bidirectional else num_buckets // 2
        for max_distance in (exact + 1, 20, 128):
            for lq, lk, offset in [(9, 13, 0), (1, 300, 299), (40, 7, -60), (17, 25, 2 ** 40), (5, 40, -2 ** 40),
                                   (30, 200, 100)]:
                w = torch.randn(num_buckets, 3, dtype=torch.float64, generator=g).to(device).requires_grad_()
                grad = torch.randn(1, 3, lq, lk, dtype=torch.float64, generator=g).to(device)
                bias = pn.relative_position_bias(w, lq, lk, bidirectional=bidirectional, query_offset=offset,
                                                 max_distance=max_distance)
                got = torch.autograd.grad(bias, w, grad)[0]
                r = torch.arange(lk)[None, :] - torch.arange(lq)[:, None] - offset
                bucket = pn.t5_relative_position_bucket(r, bidirectional=bidirectional, num_buckets=num_buckets,
                                                        max_distance=max_distance).to(device)
                want = torch.zeros(num_buckets, 3, dtype=torch.float64, device=device)
                want.index_add_(0, bucket.flatten(), grad[0].flatten(1).t())
                torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12,
                                           msg=lambda m: f"{num_buckets} {max_distance} {lq} {lk} {offset}: {m}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bidirectional", [True, False])
def test_bias_backward_at_the_largest_max_distance(device, bidirectional):
    """max_distance 2^40, the largest the ops take (the bisection needs bucket() monotone, which
    holds as computed up to there: csrc/host/bias_plan.cpp): around every bucket's first distance,
    where adjacent distances' logs are closest, the gradient equals the scatter-sum over the buckets
    t5_relative_position_bucket gives, and those buckets equal the exact integer reference's."""
    g = torch.Generator().manual_seed(int(torch.randint(0, 2 ** 31, ())))
    num_buckets, max_distance, heads = 32, 2 ** 40, 2
    per = num_buckets // 2 if bidirectional else num_buckets
    exact, span = per // 2, per - per // 2
    for k in range(1, span):  # bucket exact + k starts near exact * (max_distance / exact) ** (k / span)
        first = round(exact * (max_distance / exact) ** (k / span))
        lq, lk = 3, 64
        offset = 28 - first if bidirectional and k % 2 else first + 33  # distances first - 30 .. first + 35
        w = torch.randn(num_buckets, heads, dtype=torch.float64, generator=g).to(device).requires_grad_()
        grad = torch.randn(1, heads, lq, lk, dtype=torch.float64, generator=g).to(device)
        bias = pn.relative_position_bias(w, lq, lk, bidirectional=bidirectional, query_offset=offset,
                                         max_distance=max_distance)
        got = torch.autograd.grad(bias, w, grad)[0]
        r = torch.arange(lk)[None, :] - torch.arange(lq)[:, None] - offset
        bucket = pn.t5_relative_position_bucket(r, bidirectional=bidirectional, num_buckets=num_buckets,
                                                max_distance=max_distance)
        assert torch.equal(bucket, reference.t5_relative_position_bucket(
            r, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance)), k
        assert len(bucket.unique()) == 2, k  # the window holds the boundary
        want = torch.zeros(num_buckets, heads, dtype=torch.float64, device=device)
        want.index_add_(0, bucket.to(device).flatten(), grad[0].flatten(1).t())
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12, msg=lambda m: f"bucket {exact + k}: {m}")


def test_gradcheck_and_gradgradcheck():
    w = torch.randn(16, 3, dtype=torch.float64, requires_grad=True)
    s = torch.rand(3, dtype=torch.float64, requires_grad=True)

    def f_t5(w):
        return pn.relative_position_bias(w, 7, 40, bidirectional=False, max_distance=20, query_offset=5)

    def f_alibi(s):
        return pn.alibi_bias(s, 6, 9, query_offset=3)

    assert torch.autograd.gradcheck(f_t5, (w,))
    assert torch.autograd.gradgradcheck(f_t5, (w,))
    assert torch.autograd.gradcheck(f_alibi, (s,))
    assert torch.autograd.gradgradcheck(f_alibi, (s,))


# ------------------------------------------------------------------------------------------------
# ALiBi


@pytest.mark.parametrize("heads", range(1, 65))
def test_slopes_equal_bloom_mpt_and_the_paper(heads):
    ours = pn.alibi_slopes(heads)
    assert ours.dtype == torch.float32 and ours.shape == (heads,)
    bloom = bloom_slopes(heads)
    mpt = -build_mpt_alibi_tensor(heads, 2)[:, 0, 0]  # [H, 1, L]: slope * (j - (L - 1)); j = 0, L = 2
    paper = reference.alibi_slopes(heads)  # the paper's own recursive code, float64
    assert torch.equal(ours, paper.float())  # one rounding of the exact value
    assert torch.equal(ours, mpt)  # MPT: 1 / 2^(k * 8 / c) in float32, exact for every head count here
    # BLOOM raises a float32-rounded base to the k-th power (k <= 64): its relative error is up to
    # k times the base's rounding (2^-24), so it differs from the exact slopes by that much.
    torch.testing.assert_close(ours, bloom, rtol=64 * 2.0 ** -24, atol=0)
    assert len(set(ours.tolist())) == heads and bool((ours > 0).all() and (ours < 1).all())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-7), (torch.bfloat16, 4e-3), (torch.float16, 5e-4),
                                       (torch.float64, 0.0)])
def test_alibi_bias_equals_float64_reference(device, dtype, tol):
    slopes = pn.alibi_slopes(12).to(device)
    for lq, lk, off in [(50, 70, 0), (1, 300, 299), (20, 20, -3), (0, 5, 0)]:
        got = pn.alibi_bias(slopes, lq, lk, query_offset=off, dtype=dtype)
        assert got.shape == (1, 12, lq, lk) and got.dtype == dtype
        want = reference.alibi_bias(slopes, lq, lk, query_offset=off)
        err = (got.double() - want).abs()
        assert bool((err <= tol * want.abs() + 1e-300).all()), err.max()
    assert pn.alibi_bias(slopes.double(), 3, 4).dtype == torch.float64


@pytest.mark.parametrize("device", DEVICES)
def test_alibi_rounds_the_float64_product_once(device):
    """Far into a sequence (distances past 2^24, where float32 no longer holds every integer) and with
    float64 slopes, the bias is the float64 product rounded once to the output (then to a half type
    through float32), not a product of a rounded distance or a rounded slope."""
    g = torch.Generator().manual_seed(11)
    tiny = torch.tensor([1e-39, -3e-41, 1.2e-38, -1e-45, 2.0 ** -126, 0.0])  # subnormal, the least normal, zero
    for slopes in (torch.rand(6, generator=g) * 2 - 1, torch.rand(6, generator=g, dtype=torch.float64) * 2 - 1, tiny):
        slopes = slopes.to(device)
        # (the CPU forms rows of distances below 2^24 in float32: rows on both sides of 2^24, and across it,
        # over several of its 256-distance chunks)
        for lq, lk, off in ((7, 11, 2**24 + 3), (7, 11, 2**29 - 7), (7, 11, 12345), (2, 600, -(2**24) + 300),
                            (2, 600, 2**24 - 700), (1, 600, -(2**24) - 300)):
            want = reference.alibi_bias(slopes, lq, lk, query_offset=off)
            assert torch.equal(pn.alibi_bias(slopes, lq, lk, query_offset=off, dtype=torch.float32), want.float())
            for half in (torch.bfloat16, torch.float16):
                assert torch.equal(pn.alibi_bias(slopes, lq, lk, query_offset=off, dtype=half), want.float().to(half))
            assert torch.equal(pn.alibi_bias(slopes, lq, lk, query_offset=off, dtype=torch.float64), want)


def test_alibi_under_causal_softmax_equals_bloom_and_mpt():
    heads, L = 6, 40
    slopes = pn.alibi_slopes(heads)
    scores = torch.randn(1, heads, L, L, dtype=torch.float64)
    causal = torch.full((L, L), float("-inf"), dtype=torch.float64).triu(1)
    ours = torch.softmax(scores + pn.alibi_bias(slopes, L, L).double() + causal, -1)
    bloom = transformers.models.bloom.modeling_bloom.build_alibi_tensor(torch.ones(1, L, dtype=torch.long), heads,
                                                                         torch.float32)  # [H, 1, L]: slope * j
    mpt = build_mpt_alibi_tensor(heads, L)  # [H, 1, L]: slope * (j - L + 1)
    for theirs in (bloom, mpt):
        want = torch.softmax(scores + theirs.double().unsqueeze(0) + causal, -1)
        torch.testing.assert_close(ours, want, rtol=1e-6, atol=1e-7)


def test_alibi_gradient_equals_float64_autograd():
    s = pn.alibi_slopes(8).double().requires_grad_()
    s32 = s.detach().float().requires_grad_()
    g = torch.randn(1, 8, 100, 130).double()
    want = torch.autograd.grad(reference.alibi_bias(s, 100, 130, query_offset=30), s, g)[0]
    got = torch.autograd.grad(pn.alibi_bias(s32, 100, 130, query_offset=30), s32, g.float())[0]
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-3)
    # a float32 output from float64 slopes: the gradient comes back as float64
    got = torch.autograd.grad(pn.alibi_bias(s, 100, 130, query_offset=30, dtype=torch.float32), s, g.float())[0]
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-3)


# ------------------------------------------------------------------------------------------------
# Modules


def test_t5_module_loads_t5_weight_as_is():
    attn = t5_attention(heads=4, decoder=True, seed=3)
    module = pn.T5RelativePositionBias(4, bidirectional=False)
    module.load_state_dict({"relative_attention_bias.weight": attn.relative_attention_bias.weight.detach()})
    assert torch.equal(module(10, 30, 20), attn.compute_bias(10, 30, past_seen_tokens=20))
    shared = pn.T5RelativePositionBias.from_t5(attn)
    assert shared.relative_attention_bias.weight is attn.relative_attention_bias.weight
    assert torch.equal(shared(7, 7), attn.compute_bias(7, 7))
    assert "bidirectional=False" in repr(shared)


def test_alibi_module():
    m = pn.ALiBi(12)
    assert torch.equal(m.slopes, pn.alibi_slopes(12)) and "slopes" not in m.state_dict()
    assert torch.equal(m(5, 9, 4), pn.alibi_bias(pn.alibi_slopes(12), 5, 9, query_offset=4))
    assert m(5, 9, dtype=torch.bfloat16).dtype == torch.bfloat16


@pytest.mark.parametrize("move", ["meta, to_empty", "half", "bfloat16", "double"])
def test_alibi_module_slopes_stay_exact_through_every_move(move):
    """The slopes are a function of num_heads: built on the meta device and materialized with
    to_empty (nothing refills a non-persistent buffer), or cast, the module holds the exact float32
    slopes; a cast sets the default output dtype, each bias the exact product rounded to float32,
    then to that dtype (not the product of slopes rounded to 16 bits: up to 0.23 off at distance 3000)."""
    heads, lq, lk, offset = 12, 3, 3000, 17
    if move == "meta, to_empty":
        with torch.device("meta"):
            m = pn.ALiBi(heads)
        assert m.slopes.is_meta
        m, dtype = m.to_empty(device="cpu"), torch.float32
    else:
        dtype = {"half": torch.float16, "bfloat16": torch.bfloat16, "double": torch.float64}[move]
        m = pn.ALiBi(heads).to(dtype)
    truth = reference.alibi_bias(reference.alibi_slopes(heads), lq, lk, query_offset=offset)
    assert m.slopes.dtype == torch.float32
    assert torch.equal(m.slopes.double(), reference.alibi_slopes(heads).float().double())
    out = m(lq, lk, offset)
    assert out.dtype == dtype and m.output_dtype == dtype
    # the exact product of the float32 slopes (float64 holds it), rounded once to float32, then to the half type
    exact = reference.alibi_bias(reference.alibi_slopes(heads).float().double(), lq, lk, query_offset=offset)
    assert torch.equal(out, exact if dtype == torch.float64 else exact.float().to(dtype))
    torch.testing.assert_close(m(lq, lk, offset, dtype=torch.float32).double(), truth, rtol=1e-7, atol=1e-6)
    assert torch.equal(torch.jit.script(m)(lq, lk, offset), out)


@pytest.mark.parametrize("moves,dtype", [
    (("half", "cpu"), torch.float16), (("bfloat16", "to cpu"), torch.bfloat16), (("double", "share_memory"), torch.float64),
    (("half", "float"), torch.float32), (("half", "to float32"), torch.float32), (("bfloat16", "to_empty"), torch.bfloat16),
    (("cpu",), torch.float32), (("half", "half", "cpu", "cpu"), torch.float16)])
def test_alibi_module_output_dtype_is_the_last_cast_through_later_moves(moves, dtype):
    """A device move (or share_memory, to_empty) after a cast keeps the dtype the cast asked for, as
    the rest of a cast model keeps it; a later cast to float32 (the slopes' own dtype) is still a cast."""
    apply = {"half": lambda m: m.half(), "bfloat16": lambda m: m.bfloat16(), "double": lambda m: m.double(),
             "float": lambda m: m.float(), "to float32": lambda m: m.to(torch.float32), "cpu": lambda m: m.cpu(),
             "to cpu": lambda m: m.to("cpu"), "share_memory": lambda m: m.share_memory(),
             "to_empty": lambda m: m.to_empty(device="cpu")}
    model = torch.nn.Sequential(pn.ALiBi(6), torch.nn.Linear(2, 2))
    for move in moves:
        model = apply[move](model)
    m = model[0]
    assert m.output_dtype == dtype and model[1].weight.dtype == dtype
    assert m.slopes.dtype == torch.float32 and list(dict(m.named_buffers())) == ["slopes"]
    out = m(3, 40, 5)
    exact = reference.alibi_bias(reference.alibi_slopes(6).float().double(), 3, 40, query_offset=5)
    assert out.dtype == dtype
    assert torch.equal(out, exact if dtype == torch.float64 else exact.float().to(dtype))


# ------------------------------------------------------------------------------------------------
# FlexAttention score mods


def _qkv(heads, lq, lk, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(2, heads, lq, 16, generator=g), torch.randn(2, heads, lk, 16, generator=g),
            torch.randn(2, heads, lk, 16, generator=g))


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("decoder", [False, True])
def test_t5_score_mod_equals_sdpa_with_the_bias(decoder):
    from torch.nn.attention.flex_attention import flex_attention

    heads, lq, lk, off = 4, 19, 150, 131
    q, k, v = _qkv(heads, lq, lk, 5)
    w = torch.randn(32, heads, requires_grad=True)
    mod = pn.flex.t5_score_mod(w, lq, lk, bidirectional=not decoder, query_offset=off)
    out = flex_attention(q, k, v, score_mod=mod)
    bias = pn.relative_position_bias(w, lq, lk, bidirectional=not decoder, query_offset=off)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    g = torch.randn_like(out)
    torch.testing.assert_close(torch.autograd.grad(out, w, g)[0], torch.autograd.grad(want, w, g)[0],
                               rtol=1e-4, atol=1e-5)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_alibi_score_mod_equals_sdpa_with_the_bias():
    from torch.nn.attention.flex_attention import flex_attention

    heads, lq, lk, off = 6, 12, 40, 28
    q, k, v = _qkv(heads, lq, lk, 6)
    slopes = pn.alibi_slopes(heads).requires_grad_()
    out = flex_attention(q, k, v, score_mod=pn.flex.alibi_score_mod(slopes, query_offset=off))
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=pn.alibi_bias(slopes, lq, lk, query_offset=off))
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    g = torch.randn_like(out)
    torch.testing.assert_close(torch.autograd.grad(out, slopes, g)[0], torch.autograd.grad(want, slopes, g)[0],
                               rtol=1e-4, atol=1e-5)


def test_alibi_score_mod_far_into_a_sequence():
    """flex_attention hands score mods int32 indices: an offset past 2^31 must not wrap the distance
    (the bias would change sign), nor one past 2^24 round it."""
    heads, lq, lk = 5, 6, 9
    slopes = torch.rand(heads, generator=torch.Generator().manual_seed(12)) * 2 - 1
    h, qi, ki = (torch.arange(n, dtype=torch.int32) for n in (heads, lq, lk))
    h, qi, ki = h[:, None, None], qi[None, :, None], ki[None, None, :]
    score = torch.randn(heads, lq, lk)
    for off in (2**24 + 3, 2**31 + 5, 2**32 + 1, -(2**31) - 9):
        got = pn.flex.alibi_score_mod(slopes, query_offset=off)(score, 0, h, qi, ki)
        bias = pn.alibi_bias(slopes, lq, lk, query_offset=off, dtype=torch.float64)[0]
        torch.testing.assert_close(got.double(), score.double() + bias, rtol=4 * 2.0**-24, atol=0)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_score_mods_under_compiled_flex_attention():
    from torch.nn.attention.flex_attention import flex_attention

    # lk a multiple of 32: on an AVX2-only CPU (AMD Zen 3), torch 2.14's compiled CPU flex attention
    # is wrong with lk = 24 even with no score mod at all (up to 0.65 off SDPA): its kv blocks then
    # end inside the tensor (pytorch/pytorch#159247 is that class of bug). This test is about the
    # score mods, so it keeps to lengths the template gets right.
    heads, lq, lk = 2, 16, 32
    q, k, v = _qkv(heads, lq, lk, 7)
    w = torch.randn(32, heads)
    slopes = pn.alibi_slopes(heads)
    # dynamic=False: a recompile with dynamic shapes hits an inductor bug in torch 2.14's CPU flex
    # template (generated C++ names an undeclared cur_qSplitSize), whatever the score mod.
    compiled = torch.compile(flex_attention, fullgraph=True, dynamic=False)
    out = compiled(q, k, v, score_mod=pn.flex.t5_score_mod(w, lq, lk, query_offset=lk - lq))
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=pn.relative_position_bias(w, lq, lk, query_offset=lk - lq))
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    out = compiled(q, k, v, score_mod=pn.flex.alibi_score_mod(slopes))
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=pn.alibi_bias(slopes, lq, lk))
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------------------
# opcheck, torch.compile, torch.export, TorchScript


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    g = torch.Generator().manual_seed(8)
    w = torch.randn(32, 4, generator=g).to(device).requires_grad_()
    s = torch.rand(4, generator=g).to(device).requires_grad_()
    grad = torch.randn(1, 4, 9, 13, generator=g).to(device)
    rp = torch.randint(-500, 500, (7, 11), generator=g).to(device)
    samples = [
        ("t5_relative_position_bucket", (rp, True, 32, 128)),
        ("t5_relative_position_bucket", (rp.int(), False, 16, 40)),
        ("relative_position_bias", (w, 9, 13, True, 32, 128, 4)),
        ("relative_position_bias", (w, 1, 300, False, 32, 100, 299)),
        ("relative_position_bias_backward", (grad, True, 32, 128, 4)),
        ("alibi_bias", (s, 9, 13, 4, None)),
        ("alibi_bias", (s, 5, 3, 0, torch.bfloat16)),
        ("alibi_bias_backward", (grad, 4)),
    ]
    for name, args in samples:
        torch.library.opcheck(getattr(torch.ops.posenc, name).default, args)


class BiasedAttention(nn.Module):
    """Attention whose scores get a T5 bias (encoder) or ALiBi (causal) from the modules."""

    def __init__(self, heads: int = 4, head_dim: int = 8, kind: str = "t5") -> None:
        super().__init__()
        self.heads, self.head_dim, self.kind = heads, head_dim, kind
        self.qkv = nn.Linear(heads * head_dim, 3 * heads * head_dim)
        self.t5 = pn.T5RelativePositionBias(heads)
        self.alibi = pn.ALiBi(heads)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        if self.kind == "t5":
            bias = self.t5(s, s)
        else:
            bias = self.alibi(s, s) + torch.full((s, s), float("-inf"), device=x.device).triu(1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias).transpose(1, 2).reshape(b, s, -1)


@pytest.mark.parametrize("kind", ["t5", "alibi"])
def test_compile_fullgraph_no_graph_breaks_dynamic_lengths(kind):
    from torch._dynamo.testing import CompileCounterWithBackend

    torch.manual_seed(9)
    model = BiasedAttention(kind=kind)
    explanation = torch._dynamo.explain(model)(torch.randn(2, 7, 32))
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(model, backend=counter, fullgraph=True, dynamic=True)
    for s in (7, 11, 20):
        x = torch.randn(2, s, 32, requires_grad=True)
        out = compiled(x)
        torch.testing.assert_close(out, model(x), rtol=1e-5, atol=1e-6)
        out.sum().backward()
    assert counter.frame_count == 1  # lengths are SymInts: one graph for every length
    assert model.t5.relative_attention_bias.weight.grad is not None or kind == "alibi"


def test_inductor_matches_eager():
    torch.manual_seed(10)
    model = BiasedAttention(kind="t5")
    x = torch.randn(2, 9, 32)
    compiled = torch.compile(model, fullgraph=True)
    torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-6)


def test_export():
    torch.manual_seed(11)
    for kind in ("t5", "alibi"):
        model = BiasedAttention(kind=kind).eval()
        x = torch.randn(2, 9, 32)
        seq = torch.export.Dim("seq", min=2, max=128)
        ep = torch.export.export(model, (x,), dynamic_shapes={"x": {1: seq}})
        names = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
        assert ("posenc.relative_position_bias.default" if kind == "t5" else "posenc.alibi_bias.default") in names
        x2 = torch.randn(2, 17, 32)
        torch.testing.assert_close(ep.module()(x2), model(x2), rtol=1e-5, atol=1e-6)


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning",
                            "ignore:`torch.jit.save` is deprecated:FutureWarning",
                            "ignore:`torch.jit.load` is deprecated:FutureWarning")
def test_torchscript_modules_and_ops(tmp_path):
    attn = t5_attention(heads=4, decoder=True, seed=12)
    t5 = pn.T5RelativePositionBias.from_t5(attn)
    alibi = pn.ALiBi(4)
    for module, args, want in ((t5, (3, 40, 37), attn.compute_bias(3, 40, past_seen_tokens=37)),
                               (alibi, (3, 40, 37), pn.alibi_bias(pn.alibi_slopes(4), 3, 40, query_offset=37))):
        scripted = torch.jit.script(module)
        path = tmp_path / f"{type(module).__name__}.pt"
        scripted.save(str(path))
        loaded = torch.jit.load(str(path))
        assert torch.equal(loaded(*args), want.detach())

    # ALiBi cast in Python, then scripted: exact slopes, biases of the cast dtype (as eager); cast after
    # scripting: no Python runs to rebuild the slopes, so the scripted code refuses rounded ones
    # (it returned float32 biases of fp16-rounded slopes, 0.31 off at distance 4096)
    half = torch.jit.script(pn.ALiBi(4).half())
    assert torch.equal(half(3, 40, 37), pn.alibi_bias(pn.alibi_slopes(4), 3, 40, query_offset=37, dtype=torch.half))
    with pytest.raises((RuntimeError, torch.jit.Error), match="slopes buffer was cast"):
        torch.jit.script(pn.ALiBi(4)).half()(3, 40, 37)

    @torch.jit.script
    def buckets(rp: torch.Tensor) -> torch.Tensor:
        return torch.ops.posenc.t5_relative_position_bucket(rp, True, 32, 128)

    rp = torch.randint(-1000, 1000, (50,))
    assert torch.equal(buckets(rp), hf_bucket(rp))


# ------------------------------------------------------------------------------------------------
# Bad input: a clear error naming the argument


def _bad_cases():
    w = torch.randn(32, 4)
    s = torch.rand(4)
    rp = torch.arange(-5, 5)
    T5 = pn.relative_position_bias
    return [
        (lambda: T5(torch.randn(31, 4), 4, 4), "num_buckets must be even"),
        (lambda: T5(torch.randn(2, 4), 4, 4), "num_buckets must be >= 4"),
        (lambda: T5(torch.randn(1, 4), 4, 4, bidirectional=False), "num_buckets must be >= 2"),
        (lambda: T5(w, 4, 4, max_distance=8), "max_distance must be > 8"),
        (lambda: T5(w, 4, 4, max_distance=16, bidirectional=False), "max_distance must be > 16"),
        (lambda: T5(torch.randn(4, 32), 4, 4, num_buckets=32), "weight must be [num_buckets = 32, heads]"),
        (lambda: T5(torch.randn(32), 4, 4, num_buckets=32), "weight must be [num_buckets = 32, heads]"),
        (lambda: T5(w.long(), 4, 4), "weight must be float32"),
        (lambda: T5(w, -1, 4), "query_length must be >= 0"),
        (lambda: T5(w, 4, -2), "key_length must be >= 0"),
        (lambda: pn.alibi_bias(s[None], 4, 4), "slopes must be 1-D [heads]"),
        (lambda: pn.alibi_bias(s.int(), 4, 4), "slopes must be float32"),
        (lambda: pn.alibi_bias(s, -3, 4), "query_length must be >= 0"),
        (lambda: pn.alibi_bias(s, 3, 4, dtype=torch.int32), "dtype must be float32"),
        (lambda: T5(w, 2**31, 2**31), "the output [1, heads, query_length, key_length] = [1, 4, 2147483648, "
         "2147483648] of Float has more than 2^63 bytes"),
        (lambda: pn.alibi_bias(s, 4, 2**59, dtype=torch.bfloat16), "the output [1, heads, query_length, key_length] "
         "= [1, 4, 4, 576460752303423488] of BFloat16 has more than 2^63 bytes"),
        (lambda: pn.t5_relative_position_bucket(rp.float()), "relative_position must be int32 or int64"),
        (lambda: pn.t5_relative_position_bucket(rp, num_buckets=3), "num_buckets must be even"),
        (lambda: pn.t5_relative_position_bucket(rp, num_buckets=1026), "num_buckets must be <= 1024 (T5 uses 32)"),
        (lambda: T5(torch.randn(2048, 4), 4, 4, bidirectional=False), "num_buckets must be <= 1024"),
        (lambda: pn.t5_relative_position_bucket(rp, max_distance=1), "max_distance must be > 8"),
        (lambda: pn.t5_relative_position_bucket(rp, max_distance=2 ** 40 + 1), "max_distance must be <= 2^40 (T5 uses "
         "128), got 1099511627777"),
        (lambda: T5(w, 4, 4, max_distance=2 ** 41), "max_distance must be <= 2^40"),
        (lambda: torch.ops.posenc.relative_position_bias_backward(torch.randn(4, 9, 9), True, 32, 128, 0),
         "grad must be [1, heads, query_length, key_length]"),
        (lambda: torch.ops.posenc.alibi_bias_backward(torch.randn(2, 4, 9, 9), 0),
         "grad must be [1, heads, query_length, key_length]"),
        (lambda: pn.alibi_slopes(0), "num_heads must be an int >= 1"),
        (lambda: pn.alibi_bias(s, 3, 4, query_offset=torch.tensor(2.7)), "query_offset must be an int or a one-element integer"),
        (lambda: T5(w, 3, 4, query_offset=torch.tensor(True)), "query_offset must be an int or a one-element integer"),
        (lambda: pn.ALiBi(4)(3, 4, torch.tensor([-0.5])), "query_offset must be an int or a one-element integer"),
        (lambda: pn.alibi_bias(s, 3, 4, query_offset=2.7), "query_offset must be an int, got float 2.7"),
        (lambda: pn.alibi_bias(s, 3, 4, query_offset=torch.tensor([1, 2])), "query_offset must be an int or a one-element tensor"),
        (lambda: pn.T5RelativePositionBias(4, num_buckets=33), "num_buckets must be even"),
    ]


@pytest.mark.parametrize("case", range(len(_bad_cases())))
def test_bad_input_names_the_argument(case):
    fn, message = _bad_cases()[case]
    with pytest.raises((RuntimeError, ValueError, TypeError)) as info:
        fn()
    assert message in str(info.value)


# ------------------------------------------------------------------------------------------------
# The CUDA kernels' work items (one (i, j) per thread; one diagonal per thread; one output per
# thread) run on the host against plain loops, so their indexing is checked without a GPU.


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_cuda_work_items_on_host(tmp_path):
    torch_dir = Path(torch.__file__).resolve().parent
    exe = tmp_path / "relative_bias_work_on_host_test"
    build = subprocess.run(
        ["g++", "-std=c++20", "-O1", f"-I{ROOT / 'csrc'}", f"-I{torch_dir / 'include'}",
         str(ROOT / "tests" / "cpp" / "relative_bias_work_on_host_test.cpp"), "-o", str(exe), f"-L{torch_dir / 'lib'}",
         "-lc10", f"-Wl,-rpath,{torch_dir / 'lib'}"],
        capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-4000:]
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert " 0 failed" in run.stdout and "passed" in run.stdout


# ------------------------------------------------------------------------------------------------
# The `posenc` command (plots, the main job's rows) and the benchmark's smoke run


def _posenc(*args: str) -> subprocess.CompletedProcess:
    import sys

    return subprocess.run([sys.executable, "-m", "posenc_native", *args], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ))


@pytest.mark.parametrize("what,extra", [
    ("t5-buckets", ["--num-buckets", "64", "--max-distance", "256", "--heads", "6"]),
    ("alibi", ["--heads", "12"]),
])
def test_plot_commands(tmp_path, what, extra):
    pytest.importorskip("matplotlib")
    import matplotlib.image

    out = tmp_path / f"{what}.png"
    proc = _posenc("plot", what, "--out", str(out), *extra)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert str(out) in proc.stdout
    img = matplotlib.image.imread(str(out))
    assert img.shape[0] >= 300 and img.shape[1] >= 800 and img.std() > 0.05
    assert len({tuple(px) for px in img.reshape(-1, img.shape[-1])[::31].tolist()}) > 20  # lines in several colours


def test_plot_t5_buckets_bad_argument_is_a_clear_error(tmp_path):
    proc = _posenc("plot", "t5-buckets", "--out", str(tmp_path / "x.png"), "--num-buckets", "33")
    assert proc.returncode == 2 and "num_buckets must be even" in proc.stderr and "Traceback" not in proc.stderr


def test_main_job_has_passing_rows_for_the_bias_ops():
    proc = _posenc()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    for op in ("relative_position_bias ", "relative_position_bias bwd", "alibi_bias ", "alibi_bias bwd"):
        for dtype in ("float32", "float16", "bfloat16"):
            assert any(line.startswith(op) and " cpu " in line and f" {dtype} " in line and line.endswith("pass")
                       for line in lines), f"no passing cpu/{dtype} row for {op!r}:\n{proc.stdout}"


def test_bench_bias_quick_runs():
    import sys

    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_bias.py"), "--quick"], capture_output=True,
                          text=True, timeout=600, env=dict(os.environ))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "command:  python benchmarks/bench_bias.py --quick" in out or "bench_bias.py --quick" in out
    for name in ("transformers compute_bias + .contiguous()", "BLOOM build_alibi_tensor", "torch.empty + fill_",
                 "grad.sum()"):
        assert name in out, out
    for dtype in ("float32", "bfloat16", "float16"):  # every dtype, each row after its check against transformers
        for name in (f"relative_position_bias H=4 L=256 {dtype} backward", f"alibi_bias H=4 L=256 {dtype} backward",
                     f"decode relative_position_bias H=4 1x256 {dtype}", f"decode alibi_bias H=4 1x256 {dtype}",
                     f"decode T5RelativePositionBias H=4 1x256 {dtype}", f"decode ALiBi module H=4 1x256 {dtype}"):
            assert name in out, out
    assert "goals met" in out


@pytest.mark.parametrize("bidirectional", [True, False])
def test_the_most_buckets_allowed_are_the_exact_ones(bidirectional):
    """1024 buckets, the most the ops take (float64's error margin grows with the square of the count:
    at 2^27 a distance got the bucket above): every distance through the log-spaced buckets as the
    exact integer reference gives it, forward and backward."""
    per = 512 if bidirectional else 1024
    max_distance = per // 2 + 24
    rp = torch.arange(-max_distance - 3, max_distance + 4)
    kw = dict(bidirectional=bidirectional, num_buckets=1024, max_distance=max_distance)
    want = reference.t5_relative_position_bucket(rp, **kw)
    assert want.unique().numel() > 24  # past the exact distances: log-spaced buckets
    assert torch.equal(pn.t5_relative_position_bucket(rp, **kw), want)
    weight = torch.randn(1024, 2, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(1, 2, 5, rp.numel(), dtype=torch.float64)
    offset = -int(rp[0]) - 2  # the five query rows see every distance of rp
    got = pn.relative_position_bias(weight, 5, rp.numel(), bidirectional=bidirectional, max_distance=max_distance,
                                    query_offset=offset)
    want = reference.relative_position_bias(weight, 5, rp.numel(), bidirectional=bidirectional,
                                            max_distance=max_distance, query_offset=offset)
    assert torch.equal(got, want)
    torch.testing.assert_close(torch.autograd.grad(got, weight, grad)[0], torch.autograd.grad(want, weight, grad)[0],
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("num_buckets,max_distance,relative,exact", [(128, 16463, -13545, 62), (64, 61179, -36534, 30)])
def test_bucket_just_below_an_integer_is_the_exact_one(num_buckets, max_distance, relative, exact):
    """Distances whose log-spaced value lies 8e-10 and 3e-10 below an integer k (not on it): the
    bucket is below k, as the exact reference says (a 1e-9 margin for float64's rounding gave k)."""
    rp = torch.tensor([relative, -relative, relative - 1, relative + 1])
    want = reference.t5_relative_position_bucket(rp, num_buckets=num_buckets, max_distance=max_distance)
    assert int(want[0]) == exact
    got = pn.t5_relative_position_bucket(rp, num_buckets=num_buckets, max_distance=max_distance)
    assert torch.equal(got, want)
    weight = torch.arange(num_buckets, dtype=torch.float64)[:, None].expand(num_buckets, 2).contiguous()
    bias = pn.relative_position_bias(weight, 1, 1, query_offset=-relative)
    assert torch.equal(bias, reference.relative_position_bias(weight, 1, 1, query_offset=-relative))
