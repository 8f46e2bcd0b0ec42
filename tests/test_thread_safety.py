"""Caches under concurrent callers and under torch.compile.

Threads share one RopeConfig / module and call it with positions that move between regimes (dynamic
NTK lengths past max_position_embeddings, LongRoPE short and long), so entries are added and evicted
while others read them. Every result is compared with the float64 reference on fresh random inputs.
"""
from __future__ import annotations

import copy
import dataclasses
import os
import pickle
import sys
import threading
import time
from typing import ClassVar

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

import posenc_native as pn
from posenc_native import reference
from posenc_native.config import RopeConfig
from posenc_native.config.scheme import RopeScaling, default_inv_freq
from posenc_native.modules import RoPEPositionalEncoding, YaRNPositionalEncoding

THREADS, STEPS = 4, 60
D = 16

SCHEMES = {
    "default": {},
    "linear": {"rope_type": "linear", "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "factor": 3.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
    "longrope": {"rope_type": "longrope", "short_factor": [1.0 + 0.1 * i for i in range(D // 2)],
                 "long_factor": [1.0 + 2.0 * i for i in range(D // 2)], "original_max_position_embeddings": 16},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16},
    "proportional": {"rope_type": "proportional", "factor": 1.0},
}


def make_config(name: str) -> RopeConfig:
    return RopeConfig(head_dim=D, base=10000.0, max_position_embeddings=64, scaling=SCHEMES[name],
                      partial_rotary_factor=0.5 if name == "proportional" else None)


@pytest.fixture(autouse=True)
def _tight_switching():
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: races show up
    yield
    sys.setswitchinterval(old)


def run_threads(work) -> None:
    """Run ``work(thread_index, generator)`` in THREADS threads started together; re-raise the first error."""
    barrier = threading.Barrier(THREADS)
    errors: list[BaseException] = []

    def target(i: int) -> None:
        try:
            barrier.wait()
            work(i, torch.Generator().manual_seed(1000 + i))
        except BaseException as e:  # noqa: BLE001 - reported in the main thread
            errors.append(e)

    threads = [threading.Thread(target=target, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def random_positions(gen: torch.Generator, step: int) -> torch.Tensor:
    """Two positions per step whose maximum wanders across 16 (LongRoPE switch) and 64 (dynamic NTK L)."""
    top = int(torch.randint(1, 200, (1,), generator=gen)) + step
    return torch.tensor([top - 1, top]) if top > 0 else torch.tensor([0, 1])


@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_shared_rotary_embedding_matches_reference_under_threads(scheme):
    cfg = make_config(scheme)
    module = pn.RotaryEmbedding(cfg)

    def work(i: int, gen: torch.Generator) -> None:
        for step in range(STEPS):
            q = torch.randn(1, 2, 3, D, generator=gen, dtype=torch.float64)
            k = torch.randn(1, 2, 1, D, generator=gen, dtype=torch.float64)
            pos = random_positions(gen, step)
            out_q, out_k = module(q, k, pos)
            ref_q, ref_k = reference.apply_rope(q, k, pos, cfg)
            torch.testing.assert_close(out_q, ref_q, rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(out_k, ref_k, rtol=1e-12, atol=1e-12)

    run_threads(work)


@pytest.mark.parametrize("scheme", ["dynamic", "longrope", "yarn"])
def test_shared_config_in_place_and_frequencies_under_threads(scheme):
    cfg = make_config(scheme)

    def work(i: int, gen: torch.Generator) -> None:
        for step in range(STEPS):
            seq_len = int(torch.randint(0, 300, (1,), generator=gen))
            got = cfg.inv_freq_on("cpu", seq_len)
            assert torch.equal(got, cfg.inv_freq(seq_len)), (scheme, seq_len)
            q = torch.randn(2, 3, 2, D, generator=gen, dtype=torch.float64)
            pos = torch.randint(0, 300, (2, 3), generator=gen)
            ref_q, _ = reference.apply_rope(q, None, pos, cfg)
            pn.apply_rope_(q, None, pos, config=cfg)
            torch.testing.assert_close(q, ref_q, rtol=1e-12, atol=1e-12)

    run_threads(work)
    assert len(cfg._frequencies._cache) <= cfg._frequencies.MAX_ENTRIES  # bounded, even for dynamic NTK


class YieldingInt(int):
    """An int that lets other threads run whenever a cache hashes or compares it: it opens the
    windows between a cache's lookups and writes that the interpreter otherwise rarely switches in."""

    def __hash__(self) -> int:
        time.sleep(0)
        return int.__hash__(self)

    def __eq__(self, other: object) -> bool:
        time.sleep(0)
        return int(self) == other


@pytest.mark.parametrize("scheme", ["dynamic", "longrope"])
def test_frequency_cache_hammered_by_threads(scheme):
    """Many regimes, few entries: threads add and evict entries while others read (a shared dict
    cleared in place raised KeyError here)."""
    cfg = make_config(scheme)
    module = pn.RotaryEmbedding(cfg)
    expected = {n: cfg.inv_freq(n) for n in range(0, 400)}

    def work(i: int, gen: torch.Generator) -> None:
        lengths = torch.randint(0, 400, (1500,), generator=gen).tolist()
        for n in lengths:
            assert torch.equal(module.inv_freq(torch.device("cpu"), YieldingInt(n)), expected[n])

    run_threads(work)


def test_seed_modules_shared_under_threads():
    rope, yarn = RoPEPositionalEncoding(D), YaRNPositionalEncoding(D, original_max_position_embeddings=32,
                                                                     scaling_factor=4.0)

    def work(i: int, gen: torch.Generator) -> None:
        for _ in range(STEPS):
            seq = int(torch.randint(1, 50, (1,), generator=gen))
            angles = rope(seq)
            expected = reference.rope_angles(torch.arange(seq), rope.config.inv_freq())
            torch.testing.assert_close(angles, torch.cat((expected, expected), -1).float(), rtol=0, atol=0)
            cos, sin = yarn(seq)
            ref_cos, ref_sin = reference.rope_tables(seq, yarn.config, dtype=torch.float32)
            assert torch.equal(cos, ref_cos) and torch.equal(sin, ref_sin)
            q = torch.randn(1, 2, seq, D, generator=gen, dtype=torch.float64)
            out, _ = yarn.rotate(q)
            torch.testing.assert_close(out, reference.apply_rope(q, None, None, yarn.config, layout="bhsd")[0],
                                       rtol=1e-12, atol=1e-12)

    run_threads(work)


def test_copies_get_their_own_cache():
    cfg = make_config("dynamic")
    module = pn.RotaryEmbedding(cfg)
    q = torch.randn(1, 5, 2, D, dtype=torch.float64)
    expected, _ = module(q, None, torch.arange(100, 105))
    for other in (copy.deepcopy(module), pickle.loads(pickle.dumps(module))):
        assert other.config == cfg and other.config._frequencies is not cfg._frequencies
        got, _ = other(q, None, torch.arange(100, 105))
        assert torch.equal(got, expected)


@dataclasses.dataclass(frozen=True)
class _HalvedPastOriginal(RopeScaling):
    """A user scheme whose long regime is built from its own config's cached short frequencies (or,
    a faulty one, ``of_itself``, from the long regime being made)."""

    rope_type: ClassVar[str] = "test-halved-past-32"
    needs_seq_len: ClassVar[bool] = True
    of_itself: bool = False

    def regime(self, cfg, seq_len):
        return seq_len is not None and seq_len > 32

    def compute_inv_freq(self, cfg, seq_len):
        if seq_len is not None and seq_len > 32:
            # through the cache being filled: the short regime's (of_itself, at 40: this regime's)
            return cfg.inv_freq_on("cpu", seq_len if self.of_itself and seq_len == 40 else 1) / 2
        return default_inv_freq(cfg.base, cfg.rotary_dim)


def test_a_scheme_reading_its_own_cache_while_it_is_filled_does_not_hang():
    """The long regime's fill runs the scheme, which reads (and first fills) the short regime's
    entry of the same cache on the same thread: a non-reentrant cache lock hung here."""
    cfg = RopeConfig(head_dim=D, base=500.0, scaling=_HalvedPastOriginal())
    gen = torch.Generator().manual_seed(7)
    q, k = torch.randn(1, 40, 3, D, generator=gen, dtype=torch.float64), torch.randn(1, 40, 1, D, generator=gen, dtype=torch.float64)
    result = {}

    def call():
        result["inv_freq"] = cfg.inv_freq_on("cpu", 40)
        result["rotated"] = pn.apply_rope(q, k, torch.arange(40), config=cfg)

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive(), "filling one regime's frequencies hung reading another's"
    short = default_inv_freq(500.0, D)
    assert torch.equal(result["inv_freq"], short / 2) and torch.equal(cfg.inv_freq_on("cpu", 1), short)
    ref_q, ref_k = reference.apply_rope(q, k, torch.arange(40), cfg)
    torch.testing.assert_close(result["rotated"][0], ref_q, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(result["rotated"][1], ref_k, rtol=1e-12, atol=1e-12)


def test_a_scheme_that_needs_its_own_regime_to_make_it_gets_a_clear_error():
    """The fill that the long regime's own fill starts raises (it recursed until RecursionError), and
    leaves nothing behind: the same regime made at another length (no self-read) is the short
    regime's halved, and the short regime still works."""
    cfg = RopeConfig(head_dim=D, base=500.0, scaling=_HalvedPastOriginal(of_itself=True))
    for _ in range(2):
        with pytest.raises(RuntimeError, match="needs that same tensor"):
            cfg.inv_freq_on("cpu", 40)
    assert torch.equal(cfg.inv_freq_on("cpu", 41), default_inv_freq(500.0, D) / 2)
    q = torch.randn(1, 8, 2, D, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    got, _ = pn.apply_rope(q, None, torch.arange(8), config=cfg)
    torch.testing.assert_close(got, reference.apply_rope(q, None, torch.arange(8), cfg)[0], rtol=1e-12, atol=1e-12)


@pytest.fixture
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("scheme", ["default", "yarn", "llama3", "proportional"])
def test_config_path_compiles_once_without_graph_breaks(scheme, _fresh_dynamo):
    """config= and the module read the cached frequencies inside a compiled decode loop: one graph,
    no recompiles after the int offset becomes a symbol."""
    cfg = make_config(scheme)
    module = pn.RotaryEmbedding(cfg)

    def step(q, k, cache_len: int):
        a = pn.apply_rope(q, k, config=cfg, offset=cache_len)
        b = module(q, k, offset=cache_len)
        return a[0] + b[0], a[1] + b[1]

    explanation = torch._dynamo.explain(step)(torch.randn(1, 1, 4, D), torch.randn(1, 1, 2, D), 3)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(step, backend=counter, fullgraph=True)
    compiles = None
    for cache_len in range(5, 12):
        q, k = torch.randn(1, 1, 4, D, dtype=torch.float64), torch.randn(1, 1, 2, D, dtype=torch.float64)
        got = compiled(q, k, cache_len)
        ref_q, ref_k = reference.apply_rope(q, k, None, cfg, offset=cache_len)
        torch.testing.assert_close(got[0], 2 * ref_q, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(got[1], 2 * ref_k, rtol=1e-12, atol=1e-12)
        if cache_len == 6:
            compiles = counter.frame_count
    assert counter.frame_count == compiles


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_child_forked_while_a_lock_is_held_does_not_hang():
    """A child forked while a thread of the parent holds one of the package's locks (a shared
    config's frequency cache being filled, a patched dynamic NTK update) gets the lock anew: it hung
    forever on its first new regime. Its result is the reference's."""
    cfg = RopeConfig(head_dim=64, max_position_embeddings=16, scaling={"rope_type": "dynamic", "factor": 2.0})
    lock = cfg._frequencies._cache._lock
    held, release = threading.Event(), threading.Event()

    def holder():
        with lock:
            held.set()
            release.wait(30)
    thread = threading.Thread(target=holder)
    thread.start()
    held.wait(30)
    q = torch.randn(1, 1, 2, 64, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    want = reference.apply_rope(q, None, None, cfg, offset=1000)[0]
    try:
        pid = os.fork()
        if pid == 0:  # the child: a new regime (sequence length 1001) fills the cache under the lock
            got = pn.apply_rope(q, None, config=cfg, offset=1000)[0]
            os._exit(0 if torch.allclose(got, want, atol=1e-12, rtol=0) else 3)
        deadline = time.monotonic() + 60
        while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        if done[0] == 0:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("the forked child hung on a lock its parent's thread held")
        assert os.waitstatus_to_exitcode(done[1]) == 0
    finally:
        release.set()
        thread.join()


def test_a_config_is_freed_by_reference_counting():
    """No reference cycle between a config and its frequency cache: a config is freed when its last
    reference goes, without the cycle collector (20000 short-lived configs with gc off held 180 MiB)."""
    import gc
    import weakref
    cfg = RopeConfig(head_dim=64)
    cfg.inv_freq_on("cpu")  # (the cache filled)
    ref = weakref.ref(cfg)
    gc.disable()
    try:
        del cfg
        assert ref() is None
    finally:
        gc.enable()
