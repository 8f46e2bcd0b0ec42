"""Same inputs, same bits, whatever the thread count, the batch, or the cut of the sequence (CPU).

The CPU kernels evaluate sin/cos directly at anchor positions (multiples of 16) and rotate the rows
past them (csrc/cpu/sincos_stream.h), so a row is a function of its position alone; these tests run
every op with 1, 2 and 3 intra-op threads on sizes large enough to be split into several parallel
chunks at odd places, each sequence alone and cut into pieces, and require identical bits: both
angle sources, both pairings, forward and inverse, out of place and in place, every dtype."""
from __future__ import annotations

import pytest
import torch

import posenc_native as pn

DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
THREADS = (1, 2, 3)


def with_threads(n: int, fn):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        return fn()
    finally:
        torch.set_num_threads(before)


def runs_of_positions(g: torch.Generator, batch: int, seq: int) -> torch.Tensor:
    """Mostly consecutive positions (where the kernels advance angles), some repeated (where they reuse
    them) and random jumps (where they restart), a different start per batch row."""
    u = torch.rand(batch, seq, generator=g)
    steps = torch.where(u < 0.03, torch.randint(2, 5000, (batch, seq), generator=g),
                        (u >= 0.13).long())  # 10% repeats: step 0
    start = torch.randint(0, 1 << 20, (batch, 1), generator=g)
    return start + steps.cumsum(1)


def assert_same_bits(results: dict[int, list[torch.Tensor]]) -> None:
    first = results[THREADS[0]]
    assert len(first) > 0
    for n in THREADS[1:]:
        assert len(results[n]) == len(first)
        for i, (a, b) in enumerate(zip(first, results[n])):
            assert a.abs().sum() > 0, f"output {i} is all zeros"
            assert torch.equal(a, b), (f"output {i}: {THREADS[0]} vs {n} threads differ by up to "
                                       f"{(a.double() - b.double()).abs().max().item():.3g}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleaved", (False, True))
def test_rope_from_frequencies_thread_count_independent(dtype, interleaved):
    g = torch.Generator().manual_seed(11)
    B, S, Hq, Hk, D, R = 3, 211, 3, 2, 72, 72   # 633 tokens: several chunks at odd rows
    q = torch.randn(B, S, Hq, D, generator=g).to(dtype)
    k = torch.randn(B, S, Hk, D, generator=g).to(dtype)
    qp = torch.randn(B, S, Hq, 80, generator=g).to(dtype)  # partial rotary: 64 of 80 dims
    inv = 1.0 / 10000 ** (torch.arange(0, R, 2, dtype=torch.float64) / R)
    inv_partial = inv[:32]
    pos = runs_of_positions(g, B, S)
    cu = torch.tensor([0, 150, 151, 400, B * S])  # packed: positions restart per sequence
    qt, kt = q.reshape(B * S, Hq, D), k.reshape(B * S, Hk, D)
    q_step = torch.randn(400, 1, Hq, D, generator=g).to(dtype)
    k_step = torch.randn(400, 1, Hk, D, generator=g).to(dtype)

    def run() -> list[torch.Tensor]:
        out = []
        for inverse in (False, True):
            out += torch.ops.posenc.rope(q, k, None, None, inv, 1.07, interleaved, "bshd", 5, inverse)
            out += torch.ops.posenc.rope(q, k, pos, None, inv, 1.0, interleaved, "bshd", 0, inverse)
            out += torch.ops.posenc.rope(qt, kt, None, cu, inv, 1.0, interleaved, "thd", 3, inverse)
            q2, k2 = q.clone(), k.clone()
            torch.ops.posenc.rope_(q2, k2, pos, None, inv, 1.0, interleaved, "bshd", 0, inverse)
            out += [q2, k2]
        out += pn.apply_rope(q, k, pos, inv_freq=inv, interleaved=interleaved)
        out.append(pn.apply_rope(qp, None, pos, inv_freq=inv_partial, interleaved=interleaved)[0])
        # decode: one token per sequence, every sequence at the same position (the angles repeat)
        out += pn.apply_rope(q_step, k_step, torch.full((400, 1), 12345), inv_freq=inv, interleaved=interleaved)
        return out

    assert_same_bits({n: with_threads(n, run) for n in THREADS})


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleaved", (False, True))
def test_big_rope_calls_thread_count_independent(dtype, interleaved):
    """Calls of four 1 MiB blocks a thread and more hand out their tokens in blocks as threads finish
    them (csrc/cpu/kernels.h, parallel_balanced): ~17 MiB of rows here, so with 2 and 3 threads every
    op below runs so, and with 1 thread as one range. Every token must come out as with 1 thread."""
    g = torch.Generator().manual_seed(13)
    Hq, Hk, D = 12, 4, 128
    S = (17 << 20) // ((Hq + Hk) * D * torch.empty((), dtype=dtype).element_size()) // 3 + 1  # odd blocks
    q = torch.randn(3, S, Hq, D, generator=g).to(dtype)
    k = torch.randn(3, S, Hk, D, generator=g).to(dtype)
    inv = 1.0 / 10000 ** (torch.arange(0, D, 2, dtype=torch.float64) / D)
    pos = runs_of_positions(g, 3, S)
    cos, sin = torch.randn(2, 3, S, D, generator=g).to(dtype)

    def run() -> list[torch.Tensor]:
        out = list(torch.ops.posenc.rope(q, k, pos, None, inv, 1.07, interleaved, "bshd", 0, False))
        if not interleaved:  # rope_cos_sin has no pairing argument: once per dtype is enough
            out += torch.ops.posenc.rope_cos_sin(q, k, cos, sin, None, "bshd", False)
        q2, k2 = q.clone(), k.clone()
        torch.ops.posenc.rope_(q2, k2, pos, None, inv, 1.0, interleaved, "bshd", 0, True)
        return out + [q2, k2]

    assert_same_bits({n: with_threads(n, run) for n in THREADS})


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleaved", (False, True))
def test_rope_from_cos_sin_thread_count_independent(dtype, interleaved):
    g = torch.Generator().manual_seed(12)
    B, S, Hq, Hk, D = 2, 301, 3, 1, 40
    q = torch.randn(B, S, Hq, D, generator=g).to(dtype)
    k = torch.randn(B, S, Hk, D, generator=g).to(dtype)
    angles = runs_of_positions(g, B, S).double()[..., None] * (1.0 / 10000 ** (torch.arange(0, D, 2) / D))
    emb = torch.repeat_interleave(angles, 2, -1) if interleaved else torch.cat((angles, angles), -1)
    cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)

    def run() -> list[torch.Tensor]:
        out = []
        for inverse in (False, True):
            out += torch.ops.posenc.rope_cos_sin(q, k, cos, sin, None, "bshd", inverse)
            q2, k2 = q.clone(), k.clone()
            torch.ops.posenc.rope_cos_sin_(q2, k2, cos, sin, None, "bshd", inverse)
            out += [q2, k2]
        return out

    assert_same_bits({n: with_threads(n, run) for n in THREADS})


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleaved", (False, True))
def test_sinusoidal_thread_count_independent(dtype, interleaved):
    g = torch.Generator().manual_seed(13)
    B, S, D = 3, 401, 65   # odd dim; 1203 rows
    x = torch.randn(B, S, D, generator=g).to(dtype)
    pos = runs_of_positions(g, B, S)
    float_pos = pos[0].double() + 0.25

    def run() -> list[torch.Tensor]:
        return [
            pn.sinusoidal_table(2 * S + 7, D, interleaved=interleaved, dtype=dtype),
            pn.sinusoidal_table(float_pos, D, interleaved=interleaved, cos_first=True, dtype=dtype),
            pn.add_sinusoidal(x, interleaved=interleaved),
            pn.add_sinusoidal(x, pos[0], offset=9, interleaved=interleaved),
            pn.add_sinusoidal(x, pos, x_scale=2.0, interleaved=interleaved),
            pn.add_sinusoidal(x.transpose(0, 1).contiguous().transpose(0, 1), pos, interleaved=interleaved),
        ]

    assert_same_bits({n: with_threads(n, run) for n in THREADS})


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleaved", (False, True))
def test_rows_between_anchors_match_reference(dtype, interleaved):
    """Rows are direct at anchor positions (multiples of 16) and the anchor's row rotated in the math
    type past them (csrc/cpu/sincos_stream.h). Against the float64 reference,
    forward and inverse, on every thread count: runs, repeats and jumps that land anywhere in a block
    of 8 rows (runs_of_positions), one sequence starting near 2^24, unit-norm pairs."""
    from posenc_native import reference
    g = torch.Generator().manual_seed(17)
    B, S, H, D = 2, 389, 2, 64
    pos = runs_of_positions(g, B, S)
    pos[1] += (1 << 24) - 250_000 - pos[1, 0]  # below 2^24 whatever the jumps add
    assert pos.max() < (1 << 24)
    ang = torch.rand(B, S, 2 * H, D // 2, generator=g, dtype=torch.float64) * 2 * torch.pi
    pairs = torch.stack([ang.cos(), ang.sin()], -1).flatten(-2) if interleaved else torch.cat([ang.cos(), ang.sin()], -1)
    q, k = pairs[:, :, :H].to(dtype), pairs[:, :, H:].to(dtype)
    inv = 1.0 / 10000 ** (torch.arange(0, D, 2, dtype=torch.float64) / D)
    atol = {torch.float32: 2e-6, torch.float64: 1e-8}.get(dtype, 1e-2)  # float64: angles near 2^24 round by ~2e-9
    for inverse in (False, True):
        # the inverse rotation is the forward one by minus the angles
        want = reference.apply_rope(q.double(), k.double(), pos, inv_freq=-inv if inverse else inv,
                                    attention_factor=1.3, interleaved=interleaved)
        bits = None
        for n in THREADS:
            got = with_threads(n, lambda: torch.ops.posenc.rope(q, k, pos, None, inv, 1.3, interleaved, "bshd", 0,
                                                                inverse))
            for name, a, b in zip("qk", got, want):
                torch.testing.assert_close(a.double(), b, atol=atol, rtol=0 if atol < 1e-2 else 1e-2,
                                           msg=lambda m: f"{name}, {n} threads, inverse={inverse}: {m}")
            bits = bits or got
            assert all(torch.equal(a, b) for a, b in zip(got, bits))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleaved", (False, True))
def test_encoding_rows_between_anchors_match_reference(dtype, interleaved):
    """The sinusoidal ops' rows past an anchor are the anchor's row rotated in the math type
    and written in the same pass (csrc/cpu/sinusoidal_cpu.cpp, EncodingRow): the table and
    add_sinusoidal against the float64 reference, on every thread count, on positions with runs,
    repeats and jumps anywhere in a block of 16 rows, one sequence near 2^24, both column orders and
    an odd dim. float32 rows keep within a few float32 ulp of the direct rows' error."""
    from posenc_native import reference
    g = torch.Generator().manual_seed(19)
    B, S, D = 2, 389, 67
    pos = runs_of_positions(g, B, S)
    pos[1] += (1 << 24) - 250_000 - pos[1, 0]
    assert pos.max() < (1 << 24)
    x = torch.randn(B, S, D, generator=g, dtype=torch.float64)
    atol = {torch.float32: 4e-7, torch.float64: 1e-8}.get(dtype, 1e-2)  # |values| <= 1 (table), ~4 (x + PE)
    rtol = 1e-2 if dtype in (torch.bfloat16, torch.float16) else 0.0
    for cos_first in (False, True):
        kw = dict(interleaved=interleaved, cos_first=cos_first)
        want = [reference.sinusoidal_table(pos[b], D, **kw) for b in range(B)]
        want.append(reference.add_sinusoidal(x.to(dtype).double(), pos, x_scale=1.5, **kw))
        bits = None
        for n in THREADS:
            got = with_threads(n, lambda: [pn.sinusoidal_table(pos[b], D, dtype=dtype, **kw) for b in range(B)] +
                               [pn.add_sinusoidal(x.to(dtype), pos, x_scale=1.5, **kw)])
            for i, (a, b) in enumerate(zip(got, want)):
                # x + PE in float32: the sum's own rounding (|x * 1.5 + PE| up to ~8) comes on top
                tol = atol * 16 if (i == B and dtype == torch.float32) else atol
                torch.testing.assert_close(a.double(), b, atol=tol, rtol=rtol,
                                           msg=lambda m: f"output {i}, {n} threads, cos_first={cos_first}: {m}")
            bits = bits or got
            assert all(torch.equal(a, b) for a, b in zip(got, bits))


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16))
def test_chunk_starting_on_a_repeated_position_matches_reference(dtype):
    """Every position twice (0, 0, 1, 1, ...): wherever a parallel chunk begins, its first row
    repeats the row before it, whose anchor row and rotation the stream reuses (csrc/cpu/
    sincos_stream.h). They must be that row's, on any thread count."""
    from posenc_native import reference
    g = torch.Generator().manual_seed(13)
    S, D = 301, 64
    q = torch.randn(1, S, 2, D, generator=g, dtype=torch.float64)
    k = torch.randn(1, S, 1, D, generator=g, dtype=torch.float64)
    pos = (torch.arange(S) // 2 + 1000)[None]
    inv = 1.0 / 10000 ** (torch.arange(0, D, 2, dtype=torch.float64) / D)
    want_q, want_k = reference.apply_rope(q, k, pos, inv_freq=inv, attention_factor=1.5)
    atol, rtol = (3e-6, 0.0) if dtype == torch.float32 else (1e-2, 1e-2)  # bf16: 8 bits, |values| up to ~6
    for n in THREADS:
        got_q, got_k = with_threads(n, lambda: pn.apply_rope(q.to(dtype), k.to(dtype), pos, inv_freq=inv,
                                                             attention_factor=1.5))
        torch.testing.assert_close(got_q.double(), want_q, atol=atol, rtol=rtol, msg=lambda m: f"{n} threads: {m}")
        torch.testing.assert_close(got_k.double(), want_k, atol=atol, rtol=rtol, msg=lambda m: f"{n} threads: {m}")


def _batch_cases(g: torch.Generator, batch: int, seq: int) -> dict[str, torch.Tensor]:
    """Positions [batch, seq] whose rows meet at batch boundaries in every way the stream tells apart:
    each row's own runs, all rows alike, a decode batch at one position, and rows continuing one another
    (row b + 1 starts one past row b's end, the same position as row b's end, or at its start)."""
    runs = runs_of_positions(g, batch, seq)
    chained = (torch.arange(batch * seq) + 40)[:, None].reshape(batch, seq)
    return {"runs": runs, "shared": runs[:1].expand(batch, seq),
            "decode": torch.full((batch, seq), 70_000), "chained": chained,
            "repeat at the boundary": chained - torch.arange(batch)[:, None],
            "restart": (torch.arange(seq) + 8)[None].expand(batch, seq).contiguous()}


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16, torch.float64))
@pytest.mark.parametrize("interleaved", (False, True))
@pytest.mark.parametrize("case", ["runs", "shared", "decode", "chained", "repeat at the boundary", "restart"])
def test_a_sequence_gets_the_same_bits_in_any_batch(dtype, interleaved, case):
    """Batch invariance: a sequence's rotation does not depend on the other sequences of the call
    (nor, so, on how torch.func.vmap folds a vmapped dimension into the batch): each batch row of one
    call equals, bit for bit, a call on that row alone, on any thread count (csrc/cpu/sincos_stream.h:
    a row depends on its position alone; once, its anchors counted rows across the batch, and a row's
    bits depended on its index in the batch)."""
    g = torch.Generator().manual_seed(31)
    B, S, D = 7, 45, 64
    pos = _batch_cases(g, B, S)[case]
    q = torch.randn(B, S, 3, D, generator=g, dtype=torch.float64).to(dtype)
    k = torch.randn(B, S, 1, D, generator=g, dtype=torch.float64).to(dtype)
    cfg = pn.RopeConfig(head_dim=D, interleaved=interleaved,
                        scaling=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=4096))
    for n in THREADS:
        got_q, got_k = with_threads(n, lambda: pn.apply_rope(q, k, pos, config=cfg))
        for b in range(B):
            alone_q, alone_k = pn.apply_rope(q[b:b + 1], k[b:b + 1], pos[b:b + 1], config=cfg)
            assert torch.equal(got_q[b:b + 1], alone_q) and torch.equal(got_k[b:b + 1], alone_k), (n, b)
    # and the same for the packed layout: each sequence of cu_seqlens as a call of its own
    lengths = torch.tensor([5, 64, 1, 70, 9, 66])
    cu = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    qt = torch.randn(int(cu[-1]), 2, D, generator=g, dtype=torch.float64).to(dtype)
    packed, _ = pn.apply_rope(qt, None, None, config=cfg, layout="thd", cu_seqlens=cu, offset=3)
    for i in range(len(lengths)):
        part = qt[cu[i]:cu[i + 1]]
        alone, _ = pn.apply_rope(part, None, None, config=cfg, layout="thd", offset=3)
        assert torch.equal(packed[cu[i]:cu[i + 1]], alone), i


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16))
def test_a_sequence_gets_the_same_encoding_bits_in_any_batch(dtype):
    """add_sinusoidal with per-row positions: each batch row as in a call of its own."""
    g = torch.Generator().manual_seed(32)
    B, S, D = 6, 50, 96
    pos = runs_of_positions(g, B, S)
    x = torch.randn(B, S, D, generator=g, dtype=torch.float64).to(dtype)
    for n in THREADS:
        got = with_threads(n, lambda: pn.add_sinusoidal(x, pos))
        for b in range(B):
            assert torch.equal(got[b:b + 1], pn.add_sinusoidal(x[b:b + 1], pos[b:b + 1])), (n, b)


def _cuts(g: torch.Generator, length: int) -> list[tuple[int, int]]:
    """[start, end) pieces of range(length): random chunk lengths from 1 (decode steps) to 40."""
    cuts, start = [], 0
    while start < length:
        end = min(length, start + int(torch.randint(1, 41, (), generator=g)))
        cuts.append((start, end))
        start = end
    return cuts


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleaved", (False, True))
def test_a_token_gets_the_same_bits_however_its_sequence_is_cut(dtype, interleaved):
    """Position invariance: a token's rotation depends on its position alone, not on where its call
    begins. Chunked prefill, decode steps and a prefix cache's earlier call give, bit for bit, the
    rows of one call over the whole sequence (the CPU stream once evaluated rows directly by their
    index in the call and advanced the others, so ~half the float32 values moved by an ulp with the
    chunking). Positions start mid-anchor and jump; the whole call matches the float64 reference."""
    from posenc_native import reference
    g = torch.Generator().manual_seed(41)
    S, D = 230, 64
    pos = runs_of_positions(g, 1, S) - 600_000  # negative positions too
    q = torch.randn(1, S, 3, D, generator=g, dtype=torch.float64)
    k = torch.randn(1, S, 1, D, generator=g, dtype=torch.float64)
    cfg = pn.RopeConfig(head_dim=D, interleaved=interleaved,
                        scaling=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=4096))
    whole_q, whole_k = pn.apply_rope(q.to(dtype), k.to(dtype), pos, config=cfg)
    want_q, want_k = reference.apply_rope(q, k, pos, cfg)
    atol = {torch.float64: 1e-10, torch.float32: 3e-6}.get(dtype, 6e-2)
    torch.testing.assert_close(whole_q.double(), want_q, atol=atol, rtol=0)
    torch.testing.assert_close(whole_k.double(), want_k, atol=atol, rtol=0)
    for n in (1, 3):
        cut_q, cut_k = q.to(dtype).clone(), k.to(dtype).clone()  # rotated in place, piece by piece
        for a, b in _cuts(g, S):
            with_threads(n, lambda: pn.apply_rope_(cut_q[:, a:b], cut_k[:, a:b], pos[:, a:b], config=cfg))
        assert torch.equal(cut_q, whole_q) and torch.equal(cut_k, whole_k), n
    # packed sequences (cu_seqlens, an offset): each token as in a call of one sequence from position 0
    lengths = torch.tensor([13, 1, 70, 9])
    cu = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    qt = torch.randn(int(cu[-1]), 2, D, generator=g, dtype=torch.float64).to(dtype)
    packed, _ = pn.apply_rope(qt, None, None, config=cfg, layout="thd", cu_seqlens=cu, offset=5)
    for i in range(len(lengths)):
        for a, b in _cuts(g, int(lengths[i])):
            part = qt[int(cu[i]) + a:int(cu[i]) + b]
            alone, _ = pn.apply_rope(part, None, torch.arange(a, b) + 5, config=cfg, layout="thd")
            assert torch.equal(packed[int(cu[i]) + a:int(cu[i]) + b], alone), (i, a, b)


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16))
def test_interleaved_decode_streams_get_their_own_bits(dtype):
    """Decode steps of several streams in turn on one thread (layers of two rope_theta, an
    attention factor on one, a sinusoidal encoder between them), as a model's decode loop makes
    them: each step's rows are those of one call over its stream's whole sequence, bit for bit
    (the thread keeps each frequency set's last anchor row across calls, keyed by frequencies,
    attention factor and anchor)."""
    g = torch.Generator().manual_seed(47)
    S, D, start = 40, 64, 1000 - 5  # from mid-anchor, across anchors
    f1 = 1.0 / 10000.0 ** (torch.arange(0, D, 2, dtype=torch.float64) / D)
    f2 = 1.0 / 1_000_000.0 ** (torch.arange(0, D, 2, dtype=torch.float64) / D)
    streams = [(f1, 1.0), (f1, 0.625), (f2, 1.0)]
    qs = [torch.randn(1, S, 2, D, generator=g, dtype=torch.float64).to(dtype) for _ in streams]
    x = torch.randn(1, S, 96, generator=g, dtype=torch.float64).to(dtype)
    pos = torch.arange(start, start + S)
    whole = [pn.apply_rope(q, None, pos, inv_freq=f, attention_factor=a)[0] for q, (f, a) in zip(qs, streams)]
    whole_x = pn.add_sinusoidal(x, offset=start)
    for t in range(S):
        for q, (f, a), w in zip(qs, streams, whole):
            step, _ = pn.apply_rope(q[:, t:t + 1], None, pos[t:t + 1], inv_freq=f, attention_factor=a)
            assert torch.equal(step, w[:, t:t + 1]), (t, a)
        assert torch.equal(pn.add_sinusoidal(x[:, t:t + 1], offset=start + t), whole_x[:, t:t + 1]), t


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16))
def test_an_encoding_row_gets_the_same_bits_however_its_sequence_is_cut(dtype):
    """The sinusoidal ops alike: table rows and add_sinusoidal rows (with an offset, as a decoder
    adds them step by step) equal one call over the whole sequence, which matches the reference."""
    from posenc_native import reference
    g = torch.Generator().manual_seed(42)
    S, D = 150, 96
    whole_table = pn.sinusoidal_table(torch.arange(1000, 1000 + S), D, dtype=dtype)
    torch.testing.assert_close(whole_table.double(), reference.sinusoidal_table(torch.arange(1000, 1000 + S), D),
                               atol=3e-7 if dtype == torch.float32 else 8e-3, rtol=0)
    x = torch.randn(1, S, D, generator=g, dtype=torch.float64).to(dtype)
    whole = pn.add_sinusoidal(x, offset=1000)
    for a, b in _cuts(g, S):
        assert torch.equal(pn.sinusoidal_table(torch.arange(1000 + a, 1000 + b), D, dtype=dtype), whole_table[a:b])
        assert torch.equal(pn.add_sinusoidal(x[:, a:b], offset=1000 + a), whole[:, a:b]), (a, b)


@pytest.mark.parametrize("axes", ["sections", "interleaved sections", "mixed frequencies"])
def test_a_multi_axis_token_gets_the_same_bits_however_its_sequence_is_cut(axes):
    """Multi-axis positions (three axes: text runs, image patches) alike: each axis anchored on its
    own in the axis layouts (contiguous MRoPE sections, interleaved ones), every row direct where a
    pair's frequencies mix axes; against the float64 reference too."""
    from posenc_native import reference
    g = torch.Generator().manual_seed(43)
    S, D = 120, 64
    text = torch.arange(40)
    h, w = torch.meshgrid(torch.arange(8), torch.arange(5), indexing="ij")
    image = torch.stack([torch.full((40,), 40), 40 + h.flatten(), 40 + w.flatten()])
    pos = torch.cat([text.expand(3, 40), image, (torch.arange(40) + 48).expand(3, 40)], 1)[:, None]  # [3, 1, S]
    q = torch.randn(1, S, 2, D, generator=g, dtype=torch.float64)
    if axes == "mixed frequencies":  # [3, D/2], every entry non-zero
        inv = torch.rand(3, D // 2, generator=g, dtype=torch.float64) * 0.5
        rotate = lambda x, p: pn.apply_rope(x, None, p, inv_freq=inv)[0]  # noqa: E731
        angle = torch.einsum("as,ai->si", pos[:, 0].double(), inv)[None, :, None]  # sum over axes, [1, S, 1, D/2]
        x1, x2 = q[..., :D // 2], q[..., D // 2:]
        want = torch.cat([x1 * angle.cos() - x2 * angle.sin(), x2 * angle.cos() + x1 * angle.sin()], -1)
    else:
        cfg = pn.RopeConfig(head_dim=D, mrope_section=[8, 12, 12], mrope_interleaved=axes == "interleaved sections")
        rotate = lambda x, p: pn.apply_rope(x, None, p, config=cfg)[0]  # noqa: E731
        want = reference.apply_rope(q, None, pos, cfg)[0]
    whole = rotate(q.float(), pos)
    torch.testing.assert_close(whole.double(), want, atol=3e-6, rtol=0)
    for a, b in _cuts(g, S):
        assert torch.equal(rotate(q[:, a:b].float(), pos[:, :, a:b]), whole[:, a:b]), (a, b)
