"""The CPU RoPE kernels (and the 16-bit rows of the sinusoidal ops, of cos/sin tables and of bias
gradients) have one SIMD body per instruction set (csrc/cpu/isa.h: avx2, avx512, avx512bf16) and a
portable loop; POSENC_CPU_ISA caps the path. The float64-reference tests exercise whichever path this
CPU takes; these tests run the same problems on every path this CPU has, each in its own process, and
require the portable path's bits, with the SIMD kernels' software prefetch (POSENC_CPU_PREFETCH) on
and off (on by default except on AMD Zen 4), and on the AVX-512 paths with fp16 and float32 rows in
256- and 512-bit vectors (POSENC_CPU_VECTOR_BITS; by default 512 on AMD Zen 5 for fp16, and for
float32 under 32 MiB of rows): none may change bits.

Known exceptions, avoided by these inputs (random normal values): bf16 NaN payloads on avx512bf16
(vcvtneps2bf16 keeps them, the other paths write one canonical NaN; fp16 NaNs keep theirs on every
path, tested) and, on avx512bf16, bf16 results below 2^-126 (vcvtneps2bf16 flushes them to zero)."""
from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
import torch

PATHS = ("portable", "avx2", "avx512", "avx512bf16")

SCRIPT = r"""
import sys, torch, posenc_native as pn
info = pn.build_info()
print(info["cpu_isa"], info["cpu_prefetch"], info["cpu_prefetch_from_bytes"], info["cpu_fp16_bits"])
g = torch.Generator().manual_seed(0)
out = []
for dtype in (torch.float32, torch.bfloat16, torch.float16):
    # full, SIMD tails (36 and 20 pairs; 21 and 3: odd pair counts, an element tail past the last
    # vector), partial rotary, fewer pairs than any vector; the last two with padded head rows (a
    # head stride above head_dim: strided rows in place, and out of place into contiguous rows)
    # (64 tokens: past the size from which calls prefetch with POSENC_CPU_PREFETCH=1, csrc/cpu/isa.h
    # Prefetch::from_bytes, whose kernels differ: full rows, an odd pair count in padded rows, and
    # partial rotary)
    for seq, head_dim, rot, pad in ((9, 128, 128, 0), (9, 72, 72, 0), (9, 40, 40, 0), (9, 42, 42, 0), (9, 6, 6, 0),
                                    (9, 96, 64, 0), (9, 40, 8, 0), (9, 42, 42, 6), (9, 128, 128, 8),
                                    (64, 128, 128, 0), (64, 42, 42, 6), (64, 96, 64, 0)):
        q = torch.randn(2, seq, 4, head_dim + pad, generator=g).to(dtype)[..., :head_dim]
        k = torch.randn(2, seq, 2, head_dim + pad, generator=g).to(dtype)[..., :head_dim]
        inv = 1.0 / 10000 ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot)
        pos = torch.randint(0, 1 << 20, (2, seq), generator=g)
        for interleaved in (False, True):
            for inverse in (False, True):
                out += list(torch.ops.posenc.rope(q, k, pos, None, inv, 1.1, interleaved, "bshd", 3, inverse))
                out += list(torch.ops.posenc.rope(q, k, None, None, inv, 1.0, interleaved, "bshd", 0, inverse))
            # in place on copies with the same (padded) row strides
            q2 = q.new_empty(q.shape[:-1] + (head_dim + pad,))[..., :head_dim].copy_(q)
            k2 = k.new_empty(k.shape[:-1] + (head_dim + pad,))[..., :head_dim].copy_(k)
            torch.ops.posenc.rope_(q2, k2, pos, None, inv, 1.1, interleaved, "bshd", 0, False)
            out += [q2, k2]
            cos = torch.randn(2, seq, rot, generator=g).to(dtype)
            sin = torch.randn(2, seq, rot, generator=g).to(dtype)
            for inverse in (False, True):
                out += list(torch.ops.posenc.rope_cos_sin(q, k, cos, sin, None, "bshd", inverse))
    # axis layouts (MRoPE): one axis per pair (sections) or frequencies mixing the axes (every row
    # direct); positions of an image's patches ([axes, batch, seq]) or of text (every axis one id)
    for head_dim in (128, 40):
        pairs = head_dim // 2
        base = 1.0 / 10000 ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        sections = torch.zeros(3, pairs, dtype=torch.float64)
        sections[torch.arange(pairs) * 3 // pairs, torch.arange(pairs)] = 1.0
        q = torch.randn(2, 40, 4, head_dim, generator=g).to(dtype)
        k = torch.randn(2, 40, 2, head_dim, generator=g).to(dtype)
        patch = torch.arange(40)
        image = torch.stack([torch.full((40,), 7), 100 + patch // 8, 100 + patch % 8])[:, None].expand(3, 2, 40)
        text = torch.randint(0, 1 << 20, (2, 40), generator=g)
        for inv in (base * sections, base * torch.rand(3, pairs, generator=g, dtype=torch.float64)):
            for pos in (image, text):
                for interleaved in (False, True):
                    out += list(torch.ops.posenc.rope(q, k, pos, None, inv, 1.0, interleaved, "bshd", 0, False))
    # the sinusoidal ops' rows (csrc/cpu/sinusoidal_cpu.cpp: 16-bit rows by the SIMD kernel):
    # contiguous rows of whole lines, with a vector and two elements past them, fewer than a vector, odd;
    # strided x; per-batch positions; the tables in both layouts
    for shape in ((2, 9, 512), (2, 9, 138), (3, 5, 7), (2, 70, 33)):
        x = torch.randn(shape, generator=g).to(dtype)
        pos = torch.randint(0, 1 << 20, shape[:2], generator=g)
        out.append(pn.add_sinusoidal(x, offset=5, x_scale=1.7))
        out.append(pn.add_sinusoidal(x, pos, interleaved=False, cos_first=True))
        out.append(pn.add_sinusoidal(x.transpose(1, 2).contiguous().transpose(1, 2), offset=3))
        out.append(pn.sinusoidal_table(pos[0], shape[2], dtype=dtype))
        out.append(pn.sinusoidal_table(pos[0], shape[2], interleaved=False, dtype=dtype))
    # the bias gradients (csrc/cpu/relative_bias_cpu.cpp: 16-bit rows widened by the SIMD kernel, in
    # chunks of 256): rows of 300 keys (a chunk and a tail) and of 5, contiguous and strided
    for lq, lk in ((40, 300), (9, 5)):
        w = torch.randn(32, 3, generator=g).to(dtype).requires_grad_()
        slopes = (torch.rand(3, generator=g) + 0.1).requires_grad_()
        grad = torch.randn(1, 3, lq, lk, generator=g).to(dtype)
        for gr in (grad, grad.transpose(2, 3).contiguous().transpose(2, 3)):
            out.append(torch.autograd.grad(pn.relative_position_bias(w, lq, lk, query_offset=2), w, gr)[0])
            out.append(torch.autograd.grad(pn.alibi_bias(slopes, lq, lk, dtype=dtype), slopes, gr)[0])
# fp16 NaNs keep their sign and the top ten bits of their payload on every path (F16C's conversion,
# which the portable one follows), compared as bits: quiet and signalling ones, one negative
nans = torch.tensor([0x7e01, 0x7f55, -0x1ff, 0x7fff, 0x7d00], dtype=torch.int16)
for shape in ((2, 9, 130), (3, 5, 7)):
    x = torch.randn(shape, generator=g).half()
    flat = x.view(torch.int16).view(-1)
    flat[::3] = nans.repeat(flat[::3].numel() // 5 + 1)[:flat[::3].numel()]
    out.append(pn.add_sinusoidal(x, offset=5, x_scale=1.7).view(torch.int16))
for slope in (float("nan"), -float("nan")):
    out.append(pn.alibi_bias(torch.tensor([slope, 0.5, 0.25]), 3, 40, dtype=torch.float16).view(torch.int16))
torch.save(out, sys.argv[1])
"""


def _env(**set_vars: str) -> dict:
    env = dict(os.environ)
    env.pop("POSENC_CPU_PORTABLE", None)
    env.pop("POSENC_CPU_ISA", None)
    env.pop("POSENC_CPU_PREFETCH", None)
    env.pop("POSENC_CPU_STREAM", None)
    env.pop("POSENC_CPU_VECTOR_BITS", None)
    env.update(set_vars)
    return env


def _run(tmp_path: Path, name: str, env: dict) -> tuple[str, list]:
    """(the path taken, its outputs); _run_prefetch also gives whether it prefetched, and from how many
    bytes of rows ("True from 32768")."""
    taken, _, out = _run_prefetch(tmp_path, name, env)
    return taken, out


def _run_prefetch(tmp_path: Path, name: str, env: dict) -> tuple[str, str, list]:
    path = tmp_path / f"{name}.pt"
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(path)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    taken, prefetch, from_bytes, fp16_bits = proc.stdout.split()[:4]
    if "POSENC_CPU_VECTOR_BITS" in env:
        assert fp16_bits == env["POSENC_CPU_VECTOR_BITS"]
    return taken, f"{prefetch} from {from_bytes}", torch.load(path)


@pytest.fixture(scope="module")
def portable(tmp_path_factory) -> list:
    taken, out = _run(tmp_path_factory.mktemp("portable"), "portable", _env(POSENC_CPU_ISA="portable"))
    assert taken == "portable"
    return out


# POSENC_CPU_STREAM=1: the out-of-place calls whose rows lie on 64-byte boundaries (head_dim 128 and 96
# with float32, 128 with 16-bit types here) write them with non-temporal stores (csrc/cpu/rope_cpu.cpp,
# streams_output); the same bits. POSENC_CPU_VECTOR_BITS picks the AVX-512 paths' float32 and fp16 row
# kernels (the avx2 path has only 256-bit ones).
@pytest.mark.parametrize("prefetch,stream,bits", (("0", "0", "256"), ("1", "0", "256"), ("0", "1", "256"),
                                                  ("1", "1", "256"), ("0", "0", "512"), ("1", "1", "512")))
@pytest.mark.parametrize("path", PATHS[1:])
def test_every_simd_path_equals_portable(tmp_path, portable, path, prefetch, stream, bits):
    if path == "avx2" and bits == "512":
        pytest.skip("the avx2 path has no 512-bit vectors")
    taken, prefetched, out = _run_prefetch(tmp_path, path, _env(POSENC_CPU_ISA=path, POSENC_CPU_PREFETCH=prefetch,
                                                                POSENC_CPU_STREAM=stream, POSENC_CPU_VECTOR_BITS=bits))
    if taken != path:
        pytest.skip(f"this CPU or build has no {path} path (capped to {taken})")
    # forced on: from 32 KiB of rows on every CPU, so the 64-token problems run the prefetching kernels
    assert prefetched == {"0": "False from 32768", "1": "True from 32768"}[prefetch]
    assert len(out) == len(portable) > 0
    for i, (a, b) in enumerate(zip(out, portable)):
        assert a.dtype == b.dtype and a.abs().sum() > 0
        assert torch.equal(a, b), f"{path}: output {i} ({a.dtype}) differs from portable"


def test_legacy_portable_switch(tmp_path, portable):
    taken, out = _run(tmp_path, "legacy", _env(POSENC_CPU_PORTABLE="1"))
    assert taken == "portable"
    assert all(torch.equal(a, b) for a, b in zip(out, portable))


def test_default_path_is_the_best_available(tmp_path):
    proc = subprocess.run([sys.executable, "-c", "import posenc_native as pn; print(pn.build_info()['cpu_isa'])"],
                          env=_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    if "avx512_bf16" in flags and "avx512bw" in flags:
        assert proc.stdout.strip() == "avx512bf16"
    elif " avx2" in flags and " fma" in flags and " f16c" in flags and "avx512bw" not in flags:
        assert proc.stdout.strip() == "avx2"
    assert proc.stdout.strip() in PATHS


def _cpu() -> tuple[bool, bool, bool, int]:
    """(x86, AMD, AVX-512F, cpu family) from /proc/cpuinfo, as csrc/cpu/isa.cpp (CpuKind) tells CPUs apart."""
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    field = lambda name: next((line.split(":", 1)[1].strip() for line in cpuinfo.splitlines()  # noqa: E731
                               if line.split(":", 1)[0].strip() == name), "")
    family = field("cpu family")
    return (platform.machine() in ("x86_64", "AMD64"), field("vendor_id") == "AuthenticAMD",
            "avx512f" in field("flags").split(), int(family) if family.isdigit() else 0)


def test_prefetch_default_follows_the_cpu():
    """On by default except on AMD Zen 4 (AVX-512, family 25), as csrc/cpu/isa.cpp decides; from 16 MiB
    of rows on AMD Zen 2/3 (no AVX-512), from 32 MiB on AMD Zen 5 and later (family 26 on), from 32 KiB
    elsewhere and wherever POSENC_CPU_PREFETCH=1; 8 KiB ahead on AMD CPUs, 2 KiB
    elsewhere, whatever POSENC_CPU_PREFETCH says."""
    code = ("import posenc_native as pn; i = pn.build_info(); "
            "print(i['cpu_prefetch'], i['cpu_prefetch_from_bytes'], i['cpu_prefetch_distance'])")
    proc = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    prefetch, from_bytes, distance = proc.stdout.split()
    forced = subprocess.run([sys.executable, "-c", code], env=_env(POSENC_CPU_PREFETCH="1"), capture_output=True,
                            text=True, timeout=120)
    assert forced.returncode == 0, forced.stderr[-2000:]
    assert forced.stdout.split() == ["True", str(32 * 1024), distance]
    x86, amd, avx512, family = _cpu()  # elsewhere than x86: no SIMD kernels, no prefetch
    amd_zen2_3 = x86 and amd and not avx512
    amd_zen4 = x86 and amd and avx512 and family < 26
    amd_zen5_on = x86 and amd and family >= 26
    assert prefetch == str(x86 and not amd_zen4)
    assert from_bytes == str((16 << 20) if amd_zen2_3 else (32 << 20) if amd_zen5_on else 32 * 1024)
    assert distance == str(8192 if x86 and amd else 2048)


def test_vector_width_follows_the_cpu():
    """By default on AMD Zen 5 and later 512-bit fp16 rows, and 512-bit float32 rows in calls under
    32 MiB of rows; 256-bit ones elsewhere. POSENC_CPU_VECTOR_BITS=512 takes 512-bit rows for every
    call, =256 for none."""
    code = "import posenc_native as pn; i = pn.build_info(); print(i['cpu_fp16_bits'], i['cpu_fp32_512_below_bytes'])"
    runs = {v: subprocess.run([sys.executable, "-c", code], env=_env(**({"POSENC_CPU_VECTOR_BITS": v} if v else {})),
                              capture_output=True, text=True, timeout=120) for v in ("", "256", "512")}
    assert all(r.returncode == 0 for r in runs.values()), [r.stderr[-2000:] for r in runs.values()]
    x86, amd, _, family = _cpu()
    full_width = x86 and amd and family >= 26
    assert runs[""].stdout.split() == (["512", str(32 << 20)] if full_width else ["256", "0"])
    assert runs["256"].stdout.split() == ["256", "0"]
    assert runs["512"].stdout.split() == ["512", str(2 ** 63 - 1)]


@pytest.mark.parametrize("var,value,expected", (("POSENC_CPU_PREFETCH", "yes", "0 or 1"),
                                                ("POSENC_CPU_ISA", "sse9", "avx2"),
                                                ("POSENC_CPU_VECTOR_BITS", "1024", "256 or 512")))
def test_bad_cpu_setting_is_a_clear_error(var, value, expected):
    """A value the library does not know fails the first RoPE call, naming the variable, the value and
    what it accepts; the rows are left as they were."""
    code = ("import torch, posenc_native as pn\n"
            "q = torch.randn(1, 4, 2, 8, dtype=torch.float16)\n"
            "k, q0 = q.clone(), q.clone()\n"
            "try:\n"
            "    pn.apply_rope_(q, k, inv_freq=torch.ones(4, dtype=torch.float64))\n"
            "finally:\n"
            "    assert torch.equal(q, q0) and torch.equal(k, q0), 'rows written before the error'\n")
    proc = subprocess.run([sys.executable, "-c", code], env=_env(**{var: value}), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode != 0
    assert f"{var}={value}" in proc.stderr and expected in proc.stderr
    assert "rows written" not in proc.stderr


# Sinusoidal tables over POSENC_CPU_STREAM: float32 in both layouts and an odd dim (rows of 4 * 77 bytes,
# off 16-byte boundaries: plain stores even so, csrc/cpu/isa.h rows_aligned), 16-bit and float64
# outputs, fractional positions, and one table past the default 32 MiB threshold; then add_sinusoidal
# the same way (an odd dim, bf16, x with a strided last dim, batch rows with their own positions, 36 MiB
# of output).
_X_SHAPES = [(3, 200, 77), (2, 100, 96), (2, 120, 96), (2, 90, 64), (9, 1000, 1024)]
_TABLES = """
import sys, torch, posenc_native as pn
g = torch.Generator().manual_seed(int(sys.argv[2]))
pos = torch.rand(300, generator=g, dtype=torch.float64) * 2 ** 20
out = [pn.sinusoidal_table(1000, 64), pn.sinusoidal_table(1000, 77, interleaved=False, cos_first=True),
       pn.sinusoidal_table(pos, 130, freq_shift=1.0, angle_scale=0.5), pn.sinusoidal_table(513, 96, dtype=torch.bfloat16),
       pn.sinusoidal_table(513, 96, dtype=torch.float16), pn.sinusoidal_table(700, 62, dtype=torch.float64),
       pn.sinusoidal_table(8200, 1024), pos]
xs = [torch.randn(s, generator=g) for s in %r]
xs[1] = xs[1].bfloat16()
xs[2] = xs[2].transpose(1, 2).contiguous().transpose(1, 2)  # last dim strided
bpos = torch.randint(0, 5000, (2, 90), generator=g)
adds = [pn.add_sinusoidal(xs[0], x_scale=2.0), pn.add_sinusoidal(xs[1], interleaved=False),
        pn.add_sinusoidal(xs[2]), pn.add_sinusoidal(xs[3], bpos), pn.add_sinusoidal(xs[4])]
torch.save((pn.build_info()["cpu_stream_from_bytes"], out, adds, bpos), sys.argv[1])
""" % (_X_SHAPES,)


def _tables(tmp_path: Path, name: str, env: dict, seed: int) -> tuple[int, list]:
    path = tmp_path / f"{name}.pt"
    proc = subprocess.run([sys.executable, "-c", _TABLES, str(path), str(seed)], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return torch.load(path)


def test_streamed_tables_have_the_same_bits(tmp_path):
    """POSENC_CPU_STREAM=1 writes every table with non-temporal stores, =0 none, the default those of
    32 MiB and more (csrc/cpu/isa.h, Streaming); with POSENC_CPU_PREFETCH=1 add_sinusoidal prefetches
    the rows of every contiguous x, with =0 none: the same bits every way, and the float64
    reference's values."""
    seed = int(torch.randint(0, 2 ** 31, ()))
    never_from, never, never_adds, _ = _tables(tmp_path, "never", _env(POSENC_CPU_STREAM="0", POSENC_CPU_PREFETCH="0"),
                                               seed)
    always_from, always, always_adds, bpos = _tables(tmp_path, "always",
                                                     _env(POSENC_CPU_STREAM="1", POSENC_CPU_PREFETCH="1"), seed)
    default_from, default, default_adds, _ = _tables(tmp_path, "default", _env(), seed)
    assert always_from == 0 and never_from == 2 ** 63 - 1
    assert default_from == (32 << 20 if platform.machine() in ("x86_64", "AMD64") else never_from)
    for i, (a, b, c) in enumerate(zip(always + always_adds, never + never_adds, default + default_adds)):
        assert torch.equal(a, b) and torch.equal(a, c), f"output {i} differs with streaming"
    from posenc_native import reference
    pos = always[-1]
    truths = [reference.sinusoidal_table(1000, 64), reference.sinusoidal_table(1000, 77, interleaved=False, cos_first=True),
              reference.sinusoidal_table(pos, 130, freq_shift=1.0, angle_scale=0.5),
              reference.sinusoidal_table(513, 96), reference.sinusoidal_table(513, 96),
              reference.sinusoidal_table(700, 62), reference.sinusoidal_table(8200, 1024)]
    for i, (out, truth) in enumerate(zip(always, truths)):
        tol = {torch.float32: 2e-6, torch.bfloat16: 8e-3, torch.float16: 1e-3, torch.float64: 1e-12}[out.dtype]
        err = (out.double() - truth).abs().max().item()
        assert err <= tol, f"table {i} ({out.dtype}): max error {err:.2e} > {tol:.0e}"
        assert out.abs().sum() > 0
    g = torch.Generator().manual_seed(seed)  # the subprocess's inputs again, drawn in the same order
    torch.rand(300, generator=g, dtype=torch.float64)
    xs = [torch.randn(s, generator=g) for s in _X_SHAPES]
    xs[1] = xs[1].bfloat16()
    want = [reference.add_sinusoidal(xs[0].double(), x_scale=2.0), reference.add_sinusoidal(xs[1].double(), interleaved=False),
            reference.add_sinusoidal(xs[2].double()), reference.add_sinusoidal(xs[3].double(), bpos),
            reference.add_sinusoidal(xs[4].double())]
    for i, (out, truth) in enumerate(zip(always_adds, want)):
        tol = 8e-3 * 4 if out.dtype == torch.bfloat16 else 4e-6  # |x + pe| up to ~5: bf16's 8 bits
        err = (out.double() - truth).abs().max().item()
        assert err <= tol, f"add_sinusoidal {i} ({out.dtype}): max error {err:.2e} > {tol:.0e}"


# The relative position biases over POSENC_CPU_STREAM (csrc/cpu/relative_bias_cpu.cpp: each output row
# a copy of a window of the diagonal table, streamed or not): key lengths whose rows start on and off
# 16-byte boundaries (off them never streamed, csrc/cpu/isa.h rows_aligned) and rows shorter than one
# vector, every dtype, a query offset.
_BIASES = """
import sys, torch, posenc_native as pn
g = torch.Generator().manual_seed(int(sys.argv[2]))
cases = []
for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
    for heads, lq, lk, off in ((3, 40, 77, 0), (2, 33, 5, 9), (4, 64, 128, -20), (1, 7, 1001, 3), (2, 9, 72, 1)):
        w = torch.randn(32, heads, generator=g).to(dtype)
        slopes = torch.rand(heads, generator=g, dtype=torch.float64) * 2 - 1
        cases.append((w, slopes, lq, lk, off))
out = [(pn.relative_position_bias(w, lq, lk, max_distance=64, query_offset=off),
        pn.alibi_bias(slopes, lq, lk, query_offset=off, dtype=w.dtype)) for w, slopes, lq, lk, off in cases]
torch.save((cases, out), sys.argv[1])
"""


def test_streamed_biases_have_the_same_bits(tmp_path):
    """POSENC_CPU_STREAM=1 writes every bias with non-temporal stores, =0 none, the default those of
    32 MiB and more into pages already in memory (csrc/cpu/isa.h, Streaming): the same bits every way,
    those of the float64 reference (T5: the weight's entries; ALiBi: the float64 product rounded once)."""
    seed = str(int(torch.randint(0, 2 ** 31, ())))
    runs = {}
    for name, env in (("never", _env(POSENC_CPU_STREAM="0")), ("always", _env(POSENC_CPU_STREAM="1")),
                      ("default", _env())):
        path = tmp_path / f"{name}.pt"
        proc = subprocess.run([sys.executable, "-c", _BIASES, str(path), seed], env=env, capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        runs[name] = torch.load(path)
    from posenc_native import reference
    cases, always = runs["always"]
    for i, (w, slopes, lq, lk, off) in enumerate(cases):
        t5 = reference.relative_position_bias(w, lq, lk, max_distance=64, query_offset=off)
        alibi = reference.alibi_bias(slopes, lq, lk, query_offset=off)
        alibi = alibi if w.dtype == torch.float64 else alibi.float().to(w.dtype)
        assert torch.equal(always[i][0], t5), f"T5 bias {i} ({w.dtype}, Lk={lk}) differs from the reference"
        assert torch.equal(always[i][1], alibi), f"ALiBi bias {i} ({w.dtype}, Lk={lk}) differs from the reference"
        assert always[i][0].abs().sum() > 0 and always[i][1].abs().sum() > 0
        for name in ("never", "default"):
            for a, b in zip(always[i], runs[name][1][i]):
                assert torch.equal(a, b), f"bias {i} ({w.dtype}, Lk={lk}) differs with POSENC_CPU_STREAM {name}"

def test_bad_stream_value_is_a_clear_error():
    code = "import posenc_native as pn\npn.sinusoidal_table(8, 4)\n"
    proc = subprocess.run([sys.executable, "-c", code], env=_env(POSENC_CPU_STREAM="on"),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "POSENC_CPU_STREAM=on" in proc.stderr and "0 or 1" in proc.stderr
