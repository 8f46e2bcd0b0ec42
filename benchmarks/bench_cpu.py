#!/usr/bin/env python
"""CPU benchmark of posenc-native against the pure-PyTorch code it replaces.

    python benchmarks/bench_cpu.py                 # full sizes (a few minutes on 2 cores)
    python benchmarks/bench_cpu.py --quick         # small sizes: a smoke test, numbers mean little
    python benchmarks/bench_cpu.py --only rope     # one section: sinusoidal | rope | decode | vmap
    POSENC_CPU_ISA=avx2 python benchmarks/bench_cpu.py   # cap the kernels' instruction set (see README)
    python benchmarks/bench_cpu.py --threads 1     # one thread (steadier on a shared machine)
    python benchmarks/bench_cpu.py --threads 1 --clock cpu  # this thread's CPU time: immune to time slicing
    python benchmarks/bench_cpu.py --malloc system # let large outputs pay first-touch page faults

Every number is the median wall time of several repeats after warm-up, measured in this one run, so
the ratios compare like with like on this machine. Each row is (name, ours, baseline, ratio = ours /
baseline, goal); a goal reads PASS or MISS. A section is one function returning rows: add one by
writing another ``section_*`` function and listing it in SECTIONS.
"""
from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import itertools
import math
import os
import platform
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch

import posenc_native as pn


# --------------------------------------------------------------------------------------------
# Measuring


@dataclass
class Settings:
    quick: bool
    warmup: int
    repeat: int
    min_time: float
    compile: bool
    clock: Callable[[], float] = time.perf_counter
    # median (default) or min of the samples: min is the noise-robust estimate of the cost itself on
    # a machine whose neighbours come and go (each statistic is applied to ours and the floor alike)
    stat: Callable[[list[float]], float] = statistics.median


def bench(fn: Callable[[], object], settings: Settings) -> float:
    """Median wall time of fn() in milliseconds, after warm-up: at least ``repeat`` calls, and more
    (up to 100) until ``min_time`` seconds are spent, so short calls are not at the mercy of one
    scheduler hiccup."""
    for _ in range(settings.warmup):
        fn()
    times: list[float] = []
    while len(times) < settings.repeat or (sum(times) < settings.min_time and len(times) < 100):
        t0 = settings.clock()
        fn()
        times.append(settings.clock() - t0)
    return 1e3 * settings.stat(times)


def time_together(fns: list[Callable[[], object]], settings: Settings) -> list[list[float]]:
    """Wall times (seconds) of every call of each of fns, timed in alternation (one call of each per
    round), so load from other processes on a shared machine drifts into all of them alike and their
    ratios stay meaningful. Each round runs them in a new order (seeded, so runs repeat): a call pays
    for the dirty cache lines the call before it left, and in a fixed order one function would always
    follow the same other (an in-place RoPE call measured 3-7% slower after the in-place floor than
    in shuffled order; benchmarks/RESULTS.md)."""
    for fn in fns:
        for _ in range(settings.warmup):
            fn()
    order = random.Random(len(fns))
    times: list[list[float]] = [[] for _ in fns]
    while len(times[0]) < settings.repeat or (sum(map(sum, times)) < settings.min_time * len(fns)
                                              and len(times[0]) < 100):
        for i in order.sample(range(len(fns)), len(fns)):
            t0 = settings.clock()
            fns[i]()
            times[i].append(settings.clock() - t0)
    return times


def bench_together(fns: list[Callable[[], object]], settings: Settings) -> list[float]:
    """``settings.stat`` (median by default) of each of fns' times from `time_together`, in ms."""
    return [1e3 * settings.stat(ts) for ts in time_together(fns, settings)]


@dataclass
class Goal:
    """ours / baseline must be <= limit (a "3x faster" goal is limit 1/3)."""
    limit: float
    text: str

    def verdict(self, ratio: float) -> str:
        return "PASS" if ratio <= self.limit else "MISS"


@dataclass
class Row:
    name: str
    ours_ms: float
    baseline_name: str
    baseline_ms: Optional[float]
    goal: Optional[Goal] = None

    @property
    def ratio(self) -> Optional[float]:
        return None if self.baseline_ms is None else self.ours_ms / self.baseline_ms


def rel_err(out: torch.Tensor, truth: torch.Tensor) -> float:
    out, truth = out.double(), truth.double()
    return float((out - truth).norm() / truth.norm().clamp_min(1e-300))


def check(label: str, out: torch.Tensor, truth: torch.Tensor, tol: float) -> None:
    """Sanity check before timing: we time the same computation as the baseline."""
    err = rel_err(out, truth)
    if not err <= tol:
        raise SystemExit(f"bench_cpu: {label}: ours and the baseline disagree (rel error {err:.2e} > {tol:.0e})")


# --------------------------------------------------------------------------------------------
# Sinusoidal


def seed_sinusoidal_table(max_len: int, d: int) -> torch.Tensor:
    """The seed article's construction, verbatim."""
    pe = torch.zeros(max_len, d)
    position = torch.arange(0, max_len).unsqueeze(1).float()
    div_term = torch.exp(torch.arange(0, d, 2).float() * (-math.log(10000.0) / d))
    pe[:, 0::2] = torch.sin(position * div_term)
    pe[:, 1::2] = torch.cos(position * div_term)
    return pe


def section_sinusoidal(s: Settings) -> list[Row]:
    L, d = (2048, 256) if s.quick else (32768, 1024)
    B, S, D = (2, 512, 256) if s.quick else (8, 4096, 1024)
    rows = []

    # The seed forms its angles in float32 (errors up to ~L * 6e-8 rad), hence the loose check.
    check("sinusoidal_table vs seed", pn.sinusoidal_table(L, d), seed_sinusoidal_table(L, d), 1e-3)
    # each timed alongside its floor (bench_together), as the RoPE rows are
    ours, fill = bench_together([lambda: pn.sinusoidal_table(L, d), lambda: torch.empty(L, d).fill_(0.5)], s)
    seed = bench(lambda: seed_sinusoidal_table(L, d), s)
    name = f"sinusoidal_table L={L} d={d} fp32"
    rows.append(Row(name, ours, "seed pure-PyTorch table", seed, Goal(1 / 3, ">= 3x faster")))
    rows.append(Row(name, ours, "torch.empty + fill_", fill, Goal(1.5, "<= 1.5x")))

    g = torch.Generator().manual_seed(0)
    x = torch.randn(B, S, D, generator=g)
    pe = pn.sinusoidal_table(S, D).unsqueeze(0)  # precomputed, as the seed module's buffer
    check("add_sinusoidal vs x + pe", pn.add_sinusoidal(x), x + pe[:, :S], 1e-6)
    ours, eager, copy = bench_together([lambda: pn.add_sinusoidal(x), lambda: x + pe[:, :S], lambda: x.clone()], s)
    name = f"add_sinusoidal x=[{B},{S},{D}] fp32"
    rows.append(Row(name, ours, "eager x + pe[:, :S]", eager))
    rows.append(Row(name, ours, "x.clone()", copy, Goal(1.3, "<= 1.3x")))

    # The 16-bit dtypes (their rows converted by the SIMD row kernels: csrc/cpu/simd_rows.h)
    for dtype in (torch.bfloat16, torch.float16):
        dt = _dt(dtype)
        table = pn.sinusoidal_table(L, d, dtype=dtype)
        check(f"sinusoidal_table {dt} vs fp32", table, pn.sinusoidal_table(L, d).to(dtype), 1e-2)
        ours, fill = bench_together([lambda: pn.sinusoidal_table(L, d, dtype=dtype),
                                     lambda: torch.empty(L, d, dtype=dtype).fill_(0.5)], s)
        rows.append(Row(f"sinusoidal_table L={L} d={d} {dt}", ours, "torch.empty + fill_", fill))
        xh, peh = x.to(dtype), pe.to(dtype)
        check(f"add_sinusoidal {dt} vs x + pe", pn.add_sinusoidal(xh), xh.float() + pe[:, :S], 1e-2)
        ours, eager, copy = bench_together([lambda: pn.add_sinusoidal(xh), lambda: xh + peh[:, :S],
                                            lambda: xh.clone()], s)
        name = f"add_sinusoidal x=[{B},{S},{D}] {dt}"
        rows.append(Row(name, ours, "eager x + pe[:, :S]", eager))
        rows.append(Row(name, ours, "x.clone()", copy))
    return rows


# --------------------------------------------------------------------------------------------
# RoPE


def default_inv_freq(head_dim: int, base: float = 10000.0) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))


def yarn_inline(head_dim: int, base: float, factor: float, original: int, beta_fast: float = 32.0,
                beta_slow: float = 1.0) -> tuple[torch.Tensor, float]:
    """YaRN frequencies and attention factor, docs/architecture.md section 3 and the YaRN formula, in float64."""
    d = head_dim
    inv = default_inv_freq(d, base)

    def cdim(r: float) -> float:
        return d * math.log(original / (2 * math.pi * r)) / (2 * math.log(base))

    lo, hi = math.floor(cdim(beta_fast)), math.ceil(cdim(beta_slow))
    lo, hi = max(lo, 0), min(hi, d - 1)
    if lo == hi:
        hi += 0.001
    i = torch.arange(d // 2, dtype=torch.float64)
    ramp = ((i - lo) / (hi - lo)).clamp(0, 1)
    inv = (inv / factor) * ramp + inv * (1 - ramp)
    return inv, 0.1 * math.log(factor) + 1.0


def yarn_params(head_dim: int, base: float, factor: float, original: int) -> tuple[torch.Tensor, float, str]:
    """From posenc_native.RopeConfig when it supports YaRN (checked against the formula), else inline."""
    inv_ref, att_ref = yarn_inline(head_dim, base, factor, original)
    try:
        cfg = pn.RopeConfig(head_dim=head_dim, base=base, max_position_embeddings=int(original * factor),
                            scaling={"rope_type": "yarn", "factor": factor,
                                     "original_max_position_embeddings": original})
        inv, att = cfg.inv_freq().to(torch.float64), float(cfg.attention_factor)
    except (TypeError, ValueError, AttributeError):  # a RopeConfig without scaling support yet
        return inv_ref, att_ref, "inline (the YaRN formula)"
    if inv.shape != inv_ref.shape or not torch.allclose(inv, inv_ref, rtol=1e-12) or abs(att - att_ref) > 1e-12:
        raise SystemExit("bench_cpu: RopeConfig's YaRN disagrees with the YaRN formula")
    return inv, att, "posenc_native.RopeConfig"


def hf_cos_sin(x: torch.Tensor, position_ids: torch.Tensor, inv_freq: torch.Tensor, attention_scaling):
    """cos/sin as transformers' LlamaRotaryEmbedding builds them (float32 math, cast to x's dtype)."""
    inv_freq_expanded = inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1)
    position_ids_expanded = position_ids[:, None, :].float()
    freqs = (inv_freq_expanded @ position_ids_expanded).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos = emb.cos() * attention_scaling
    sin = emb.sin() * attention_scaling
    return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)


def _dt(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def section_rope(s: Settings) -> list[Row]:
    """Prefill-sized RoPE per dtype and pairing: in place against the in-place memory floor
    ``q.mul_(c); k.mul_(c)`` (the same bytes read and written once), out of place against the
    allocating floor ``q * c, k * c``, and (half-split) against transformers' eager code and its
    torch.compile."""
    try:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as hf_apply
    except ImportError:
        hf_apply = None
        print("note: transformers is not installed: no eager/compiled baselines")

    B, S, Hq, Hk, D = (1, 256, 8, 2, 64) if s.quick else (1, 4096, 32, 8, 128)
    base = 10000.0
    yarn_inv, yarn_att, yarn_source = yarn_params(D, base, factor=4.0, original=4096)
    print(f"YaRN inv_freq and attention factor ({yarn_att:.6f}) from {yarn_source}")
    rows = []
    g = torch.Generator().manual_seed(1)
    position_ids = torch.arange(S)[None, :].expand(B, S)

    def eager_path(q, k, inv_freq, scaling):
        # transformers' layout [B, H, S, D]: transposed views of our [B, S, H, D] tensors.
        qt, kt = q.transpose(1, 2), k.transpose(1, 2)
        cos, sin = hf_cos_sin(qt, position_ids, inv_freq, scaling)
        return hf_apply(qt, kt, cos, sin)

    compiled_path = torch.compile(eager_path, dynamic=False) if (hf_apply and s.compile) else None
    inplace_goal = {torch.float32: Goal(1.05, "<= 1.05x"), torch.bfloat16: Goal(1.1, "<= 1.1x"),
                    torch.float16: Goal(1.1, "<= 1.1x")}

    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        q = torch.randn(B, S, Hq, D, generator=g).to(dtype)
        k = torch.randn(B, S, Hk, D, generator=g).to(dtype)
        tol = 1e-5 if dtype == torch.float32 else 1e-2
        dt = _dt(dtype)
        c = torch.tensor(0.999, dtype=dtype)
        qf, kf = q.clone(), k.clone()

        def floor_inplace():
            qf.mul_(c)
            kf.mul_(c)

        floor_alloc_fn = lambda: (q * c, k * c)  # noqa: E731
        schemes = [("default", default_inv_freq(D, base), 1.0)]
        if dtype == torch.float32:
            schemes.append(("yarn x4", yarn_inv, yarn_att))
        for interleaved in (False, True):
            for scheme, inv_freq, att in schemes:
                pairing = "interleaved" if interleaved else "half-split"
                name = f"rope {scheme} {pairing} q=[{B},{S},{Hq},{D}] k=[..,{Hk},..] {dt}"

                def ours_oop():
                    return pn.apply_rope(q, k, inv_freq=inv_freq, attention_factor=att, interleaved=interleaved)

                qi, ki = q.clone(), k.clone()

                def ours_inplace():
                    return pn.apply_rope_(qi, ki, inv_freq=inv_freq, attention_factor=att, interleaved=interleaved)

                # each pairing's rows are timed against floors measured alongside them (bench_together)
                floor_in, inplace, floor_alloc, oop = bench_together(
                    [floor_inplace, ours_inplace, floor_alloc_fn, ours_oop], s)
                rows.append(Row(name + " in-place", inplace, "q.mul_(c); k.mul_(c)", floor_in, inplace_goal[dtype]))
                rows.append(Row(name + " out-of-place", oop, "q * c, k * c", floor_alloc))
                if hf_apply is None or interleaved:
                    continue  # transformers' apply_rotary_pos_emb is half-split
                inv32 = inv_freq.float()
                scaling = torch.tensor(att, dtype=torch.float32)  # a tensor: no recompile per scheme
                hq, hk = eager_path(q, k, inv32, scaling)
                oq, ok = ours_oop()
                check(f"{name} vs transformers (q)", oq.transpose(1, 2), hq, 10 * tol)
                check(f"{name} vs transformers (k)", ok.transpose(1, 2), hk, 10 * tol)
                eager = bench(lambda: eager_path(q, k, inv32, scaling), s)
                rows.append(Row(name + " out-of-place", oop, "transformers eager", eager))
                # The transformers drop-in with the model's own cos/sin (the table path)
                qt, kt = q.transpose(1, 2), k.transpose(1, 2)
                cos, sin = hf_cos_sin(qt, position_ids, inv32, scaling)
                tq, tk = pn.apply_rotary_pos_emb(qt, kt, cos, sin)
                check(f"{name} apply_rotary_pos_emb vs transformers (q)", tq, hq, 10 * tol)
                check(f"{name} apply_rotary_pos_emb vs transformers (k)", tk, hk, 10 * tol)
                floor_t, table, hf_table = bench_together(
                    [floor_alloc_fn, lambda: pn.apply_rotary_pos_emb(qt, kt, cos, sin),
                     lambda: hf_apply(qt, kt, cos, sin)], s)
                tname = f"apply_rotary_pos_emb(q, k, cos, sin) {scheme} q=[{B},{Hq},{S},{D}] {dt}"
                rows.append(Row(tname, table, "q * c, k * c", floor_t))
                rows.append(Row(tname, table, "transformers apply_rotary_pos_emb", hf_table))
                if compiled_path is not None:
                    compiled = bench(lambda: compiled_path(q, k, inv32, scaling), s)
                    rows.append(Row(name + " out-of-place", oop, "torch.compile(transformers)", compiled,
                                    Goal(0.5, ">= 2x faster")))
                    rows.append(Row(name + " in-place", inplace, "torch.compile(transformers)", compiled,
                                    Goal(0.5, ">= 2x faster")))
    return rows


LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192}


def _patched_llama_rotary(Hq: int, Hk: int, D: int):
    """A patched transformers Llama's rotary path (rotary module + the attention's apply_rotary_pos_emb),
    or None when transformers or the integration is missing."""
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
        from transformers.models.llama import modeling_llama
        from posenc_native.integrations.transformers import patch
    except ImportError:
        return None
    cfg = LlamaConfig(hidden_size=256, intermediate_size=32, num_hidden_layers=1, num_attention_heads=Hq,
                      num_key_value_heads=Hk, head_dim=D, vocab_size=32, max_position_embeddings=131072,
                      rope_parameters={"rope_theta": 500000.0, **LLAMA3_SCALING})
    try:
        model = patch(LlamaForCausalLM(cfg).eval())
    except Exception as exc:  # an integration that refuses this config: report, keep benchmarking
        print(f"note: patching a transformers Llama failed ({type(exc).__name__}: {exc})")
        return None
    rotary = model.model.rotary_emb

    def step(q, k, position_ids):  # q, k in transformers' [B, H, 1, D]
        cos, sin = rotary(q, position_ids)
        return modeling_llama.apply_rotary_pos_emb(q, k, cos, sin)

    return step, model


def _repeated(fn: Callable[[], object], calls: int) -> Callable[[], None]:
    def run() -> None:
        for _ in range(calls):
            fn()
    return run


def section_decode(s: Settings) -> list[Row]:
    """One-token decode steps: per-call time of each way in, against two ``mul_`` calls on the same
    tensors (the least a fused in-place call could cost from Python)."""
    Hq, Hk, D = 32, 8, 128
    cfg = pn.RopeConfig(head_dim=D, base=500000.0, max_position_embeddings=131072, scaling=LLAMA3_SCALING)
    inv_freq, att = cfg.inv_freq().to(torch.float64), float(cfg.attention_factor)
    module = pn.RotaryEmbedding(cfg)
    patched = _patched_llama_rotary(Hq, Hk, D)
    if patched is None:
        print("note: transformers or its integration is not importable: no patched-model decode row")
    rows = []
    g = torch.Generator().manual_seed(2)
    # float32, and the 16-bit dtypes a server runs (their rows through the SIMD row kernels); the
    # patched model's row in float32 only
    for B, dtype in itertools.product((1, 64), (torch.float32, torch.bfloat16, torch.float16)):
        q = torch.randn(B, 1, Hq, D, generator=g).to(dtype)
        k = torch.randn(B, 1, Hk, D, generator=g).to(dtype)
        pos = torch.full((B, 1), 1000, dtype=torch.long)
        c = torch.tensor(0.999, dtype=dtype)
        name = f"decode B={B} q=[{B},1,{Hq},{D}] k=[..,{Hk},..] {_dt(dtype)}"
        base_name = "q.mul_(c); k.mul_(c)"
        ways = [(" apply_rope_(inv_freq=)", lambda: pn.apply_rope_(q, k, pos, inv_freq=inv_freq, attention_factor=att),
                 None),
                (" apply_rope_(config=llama3)", lambda: pn.apply_rope_(q, k, pos, config=cfg), Goal(1.5, "<= 1.5x")),
                (" RotaryEmbedding(cfg)", lambda: module(q, k, pos), Goal(2.0, "<= 2.0x"))]
        if B > 1:  # a served batch: every sequence at its own position, so no row repeats its angles
            spread = 1000 + torch.randperm(4 * B, generator=g)[:B, None]
            ways.append((" apply_rope_(config=llama3), distinct positions",
                         lambda: pn.apply_rope_(q, k, spread, config=cfg), None))
        if patched is not None and dtype == torch.float32:
            step = patched[0]
            qt, kt = q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous()
            ways.append((" patched transformers Llama rotary", lambda: step(qt, kt, pos), None))
        # each sample times `calls` calls: a call takes microseconds, and reading the clock (a system
        # call for --clock cpu) would otherwise add a fixed cost to every sample, ours and the floor's
        calls = 50 if B == 1 else 5
        # the module returns new tensors: also against the allocating floor, what any out-of-place call pays
        floor, floor_alloc, *times = bench_together([_repeated(lambda: (q.mul_(c), k.mul_(c)), calls),
                                                     _repeated(lambda: (q * c, k * c), calls)]
                                                    + [_repeated(fn, calls) for _, fn, _ in ways], s)
        for (label, _, goal), ms in zip(ways, times):
            rows.append(Row(name + label, ms / calls, base_name, floor / calls, goal))
            if label == " RotaryEmbedding(cfg)":
                rows.append(Row(name + label, ms / calls, "q * c, k * c", floor_alloc / calls))
    # A sinusoidal model's decode step: x [B, 1, d_model] plus the encoding at the cache length,
    # against the allocating floor and the seed module's precomputed table slice.
    d_model, at = 1024, 1000
    pe = pn.sinusoidal_table(4096, d_model).unsqueeze(0)
    module = pn.SinusoidalPositionalEncoding(d_model)
    for B in (1, 64):
        x = torch.randn(B, 1, d_model, generator=g)
        c = torch.tensor(0.999)
        check(f"decode add_sinusoidal B={B} vs x + pe", pn.add_sinusoidal(x, offset=at), x + pe[:, at:at + 1], 1e-6)
        check(f"decode SinusoidalPositionalEncoding B={B} vs x + pe", module(x, at), x + pe[:, at:at + 1], 1e-6)
        calls = 50 if B == 1 else 5
        ours, by_module, eager, floor = bench_together([_repeated(lambda: pn.add_sinusoidal(x, offset=at), calls),
                                                        _repeated(lambda: module(x, at), calls),
                                                        _repeated(lambda: x + pe[:, at:at + 1], calls),
                                                        _repeated(lambda: x * c, calls)], s)
        name = f"decode add_sinusoidal(x, offset={at}) x=[{B},1,{d_model}] float32"
        rows.append(Row(name, ours / calls, "x * c", floor / calls))
        rows.append(Row(name, ours / calls, f"eager x + pe[:, {at}:{at + 1}]", eager / calls))
        name = f"decode SinusoidalPositionalEncoding({d_model})(x, {at}) x=[{B},1,{d_model}] float32"
        rows.append(Row(name, by_module / calls, "x * c", floor / calls))
        rows.append(Row(name, by_module / calls, f"eager x + pe[:, {at}:{at + 1}]", eager / calls))
    return rows


def section_vmap(s: Settings) -> list[Row]:
    """``torch.func.vmap(apply_rope)`` over V slices (a model ensemble) with shared positions, against
    V calls in a Python loop and one call on the folded ``[V * B, ...]`` tensors (what the vmap rule
    makes of it, python/posenc_native/_functorch.py)."""
    Hq, Hk, D = 32, 8, 128
    cfg = pn.RopeConfig(head_dim=D)
    g = torch.Generator().manual_seed(3)
    rows = []
    cases = [(8, 1, 1), (64, 1, 1)] + ([] if s.quick else [(8, 4, 128)])
    for V, B, S in cases:
        q = torch.randn(V, B, S, Hq, D, generator=g)
        k = torch.randn(V, B, S, Hk, D, generator=g)
        pos = torch.arange(1000, 1000 + S).expand(B, S).contiguous()
        folded_pos = pos.repeat(V, 1)
        pn.apply_rope(q[0], k[0], pos, config=cfg)  # the config's frequency cache is filled in eager mode only
        vmapped = torch.func.vmap(lambda a, b: pn.apply_rope(a, b, pos, config=cfg))
        ours, loop, folded = bench_together([
            lambda: vmapped(q, k),
            lambda: [pn.apply_rope(q[i], k[i], pos, config=cfg) for i in range(V)],
            lambda: pn.apply_rope(q.view(V * B, S, Hq, D), k.view(V * B, S, Hk, D), folded_pos, config=cfg)], s)
        name = f"vmap V={V} q=[{B},{S},{Hq},{D}] float32"
        rows.append(Row(name, ours, f"{V} calls in a loop", loop))
        rows.append(Row(name, ours, "one call on [V*B, ...]", folded))
    return rows


SECTIONS: dict[str, Callable[[Settings], list[Row]]] = {
    "sinusoidal": section_sinusoidal,
    "rope": section_rope,
    "decode": section_decode,
    "vmap": section_vmap,
}


# --------------------------------------------------------------------------------------------
# Report


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def fmt_ms(ms: float) -> str:
    return f"{ms:.3f}" if ms >= 0.1 else f"{ms:.4f}"  # decode calls take microseconds


def print_verdicts(rows: list[Row], start: float) -> None:
    """The closing line of every benchmark: goals met and missed, and the seconds since ``start``."""
    verdicts = [r.goal.verdict(r.ratio) for r in rows if r.goal and r.ratio is not None]
    print()
    print(f"{verdicts.count('PASS')} goals met, {verdicts.count('MISS')} missed; {time.perf_counter() - start:.0f} s")


def print_table(rows: list[Row]) -> None:
    headers = ("benchmark", "ours ms", "baseline", "baseline ms", "ratio", "goal", "")
    cells = []
    for r in rows:
        ratio = r.ratio
        cells.append((
            r.name,
            fmt_ms(r.ours_ms),
            r.baseline_name,
            "n/a" if r.baseline_ms is None else fmt_ms(r.baseline_ms),
            "n/a" if ratio is None else f"{ratio:.2f}x",
            r.goal.text if r.goal else "",
            r.goal.verdict(ratio) if (r.goal and ratio is not None) else "",
        ))
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, h in enumerate(headers)]
    right = {1, 3, 4}

    def fmt(row):
        return "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))).rstrip()

    print(fmt(headers))
    print(fmt(["-" * w for w in widths]))
    for c in cells:
        print(fmt(c))


def steady_malloc() -> str:
    """Keep glibc from returning large blocks to the OS between calls.

    By default glibc serves blocks above its (dynamic, at most 32 MiB) mmap threshold with fresh
    mmaps, so each call of an op that allocates a large output pays first-touch page faults (on a VM
    they can cost more than the op itself), and whether a 30 MiB tensor pays them depends on what was
    freed before. Raising the thresholds makes every allocation a reuse after warm-up, as a caching
    allocator would: the numbers then measure the kernels and are reproducible. ``--malloc system``
    keeps glibc's behaviour.
    """
    name = ctypes.util.find_library("c")
    if not name or platform.libc_ver()[0] != "glibc":
        return "system allocator (not glibc)"
    libc = ctypes.CDLL(name)
    m_trim_threshold, m_mmap_threshold = -1, -3
    ok = libc.mallopt(m_mmap_threshold, 1 << 30) == 1 and libc.mallopt(m_trim_threshold, (1 << 31) - 1) == 1
    return "glibc, mmap/trim thresholds raised (steady-state reuse, no first-touch faults)" if ok else "glibc (mallopt failed)"


BUILD_INPUTS = ("csrc", "CMakeLists.txt", "pyproject.toml")


def stale_build_warning(library: str, checkout: Path = Path(__file__).resolve().parent.parent) -> Optional[str]:
    """A warning when the checkout these benchmarks run from has a build input (BUILD_INPUTS) newer than
    the op library they measure: an installed wheel not rebuilt since the kernels changed measures the
    old kernels (benchmarks/RESULTS.md, "Twelfth session"). None when the library is as new, or when
    there is no checkout (benchmarks copied elsewhere)."""
    files = []
    for name in BUILD_INPUTS:
        path = checkout / name
        files += [path] if path.is_file() else [f for f in path.rglob("*") if f.is_file()]
    if not files or not os.path.exists(library):
        return None
    newest = max(files, key=lambda f: f.stat().st_mtime)
    age = newest.stat().st_mtime - os.path.getmtime(library)
    if age <= 0:
        return None
    return (f"WARNING: the op library is {age / 60:.0f} min older than {newest.relative_to(checkout)}: these "
            f"numbers are of an older build (rebuild it: `make build`)")


def print_library(library: str) -> None:
    """The header's line naming the op library measured, and the stale-build warning under it."""
    print(f"library:  {library}")
    warning = stale_build_warning(library)
    if warning:
        print(warning)


def print_header(title: str, script: str, argv, quick: bool) -> dict:
    """The lines every benchmark starts with (what ran, where, with which software, and whether that
    build is older than the checkout's sources); returns build_info()."""
    command = " ".join(["python", os.path.relpath(script)] + (sys.argv[1:] if argv is None else argv))
    info = pn.build_info()
    print(title + (" (--quick: smoke-test sizes)" if quick else ""))
    print(f"command:  {command}")
    load = f", load average {os.getloadavg()[0]:.2f} at start" if hasattr(os, "getloadavg") else ""
    print(f"machine:  {cpu_model()}, {os.cpu_count()} cores, torch threads {torch.get_num_threads()}{load}")
    print(f"software: python {platform.python_version()}, torch {torch.__version__}, posenc-native {info['version']} "
          f"({info['cxx_compiler']})")
    print_library(info["library"])
    return info


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes and few repeats (a smoke test)")
    parser.add_argument("--only", choices=sorted(SECTIONS), help="run one section")
    parser.add_argument("--repeat", type=int, help="timed repeats per measurement (median is reported)")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's choice)")
    parser.add_argument("--malloc", choices=["steady", "system"], default="steady",
                        help="steady (default): large blocks are reused between calls; system: glibc's own "
                             "policy (large outputs pay page faults on each call)")
    parser.add_argument("--stat", choices=["median", "min"], default="median",
                        help="median (default) or min of the timed samples (min: robust to a noisy machine)")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                        help="wall (default): elapsed time; cpu: this thread's CPU time (needs --threads 1: "
                             "time spent descheduled by other processes is not counted)")
    args = parser.parse_args(argv)
    if args.clock == "cpu" and args.threads != 1:
        parser.error("--clock cpu measures one thread: add --threads 1")
    allocator = steady_malloc() if args.malloc == "steady" else "glibc defaults (--malloc system)"
    if args.threads:
        torch.set_num_threads(args.threads)
    settings = Settings(quick=args.quick, warmup=1 if args.quick else 2,
                        repeat=args.repeat or (3 if args.quick else 7), min_time=0.05 if args.quick else 0.5,
                        compile=not args.no_compile,
                        clock=time.thread_time if args.clock == "cpu" else time.perf_counter,
                        stat=min if args.stat == "min" else statistics.median)

    info = print_header("posenc-native CPU benchmark", __file__, argv, args.quick)
    isa = info.get("cpu_isa", "unknown (a library without POSENC_CPU_ISA)")
    print(f"CPU path: {isa} (POSENC_CPU_ISA={os.environ.get('POSENC_CPU_ISA', '')!r} caps it), software prefetch "
          f"{info.get('cpu_prefetch', 'unknown')} from {info.get('cpu_prefetch_from_bytes', 'unknown')} bytes of rows, "
          f"{info.get('cpu_prefetch_distance', 'unknown')} bytes ahead (POSENC_CPU_PREFETCH={os.environ.get('POSENC_CPU_PREFETCH', '')!r}); "
          f"tables streamed from {info.get('cpu_stream_from_bytes', 'unknown')} bytes "
          f"(POSENC_CPU_STREAM={os.environ.get('POSENC_CPU_STREAM', '')!r}); on AVX-512 paths fp16 rows in "
          f"{info.get('cpu_fp16_bits', 'unknown')}-bit vectors, float32 in 512-bit ones under "
          f"{info.get('cpu_fp32_512_below_bytes', 'unknown')} bytes of rows "
          f"(POSENC_CPU_VECTOR_BITS={os.environ.get('POSENC_CPU_VECTOR_BITS', '')!r})")
    print(f"malloc:   {allocator}")
    print(f"decode:   fast path through the {info.get('fast_path') or 'general path (no _direct extension)'}")
    print(f"timing:   {args.clock} clock, {args.stat} of >= {settings.repeat} calls (and >= {settings.min_time} s) after {settings.warmup} "
          "warm-up; ratio = ours / baseline")
    print()
    start = time.perf_counter()
    rows: list[Row] = []
    for name, section in SECTIONS.items():
        if args.only and name != args.only:
            continue
        rows.extend(section(settings))
    print()
    print_table(rows)
    print_verdicts(rows, start)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
