#!/usr/bin/env python
"""End-to-end: a tiny random transformers model, patched by posenc vs its own rotary path.

    python benchmarks/bench_e2e.py                       # CPU, float32, all models
    python benchmarks/bench_e2e.py --device cuda --dtype bfloat16
    python benchmarks/bench_e2e.py --quick               # 256-token prefill, 8 new tokens: a smoke run
    python benchmarks/bench_e2e.py --only gemma2 mixtral
    python benchmarks/bench_e2e.py --only qwen3-vl-tower # a vision tower's forward on one image

Each model (random weights, built from its config class, nothing downloaded) runs a prefill of
``--prefill`` tokens (batch 1) and a greedy generation of ``--new`` tokens after it (KV cache),
unpatched and then patched (:func:`posenc_native.integrations.transformers.patch`), alternating
``--repeat`` times; the table shows the median wall times and ratio = patched / unpatched. The
generated tokens of both paths are compared (``same tokens``). ``qwen3-vl-tower`` is a Qwen3-VL
vision tower (Qwen3-VL's widths, 4 blocks) running one image of ``--grid`` x ``--grid`` patches:
its axial rotary (``[N, 2]`` height/width ids) patched vs its own, and the outputs' largest
difference. Speed is measured here, never asserted in tests.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

_COMMON = dict(vocab_size=32000, hidden_size=512, intermediate_size=1408, num_hidden_layers=4, num_attention_heads=8,
               num_key_value_heads=2, max_position_embeddings=8192, initializer_range=0.2, tie_word_embeddings=False,
               bos_token_id=1, eos_token_id=None, pad_token_id=None)


_EAGER = {"gemma2"}  # no sdpa in transformers (attention logit soft-capping)


def _configs() -> dict:
    import transformers as t

    return {
        "llama-yarn": lambda: t.LlamaConfig(**_COMMON, rope_parameters=dict(
            rope_type="yarn", factor=4.0, original_max_position_embeddings=1024, rope_theta=10000.0)),
        "gemma2": lambda: t.Gemma2Config(**dict(_COMMON, head_dim=64), sliding_window=1024),
        "olmo2": lambda: t.Olmo2Config(**_COMMON),
        "mixtral": lambda: t.MixtralConfig(**_COMMON, num_local_experts=4, num_experts_per_tok=2),
    }


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


@torch.no_grad()
def _timed(fn, device) -> tuple[float, object]:
    _sync(device)
    t0 = time.perf_counter()
    out = fn()
    _sync(device)
    return time.perf_counter() - t0, out


def run(name: str, args, device: torch.device, dtype: torch.dtype) -> dict:
    import transformers

    from posenc_native.integrations import transformers as hfi

    torch.manual_seed(0)
    attn = "eager" if name in _EAGER else "sdpa"
    model = transformers.AutoModelForCausalLM.from_config(_configs()[name](), attn_implementation=attn,
                                                          dtype=dtype).to(device).eval()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(2, 32000, (1, args.prefill), generator=g).to(device)

    def prefill():
        return model(input_ids=ids, logits_to_keep=1).logits  # as generate() does

    def generate():
        return model.generate(ids, max_new_tokens=args.new, min_new_tokens=args.new, do_sample=False)

    times = {("prefill", False): [], ("prefill", True): [], ("generate", False): [], ("generate", True): []}
    tokens = {}
    for rep in range(args.repeat + 1):  # the first round warms up
        for patched in (False, True):
            if patched:
                hfi.patch(model)
            tp, _ = _timed(prefill, device)
            tg, out = _timed(generate, device)
            tokens[patched] = out
            if patched:
                hfi.unpatch(model)
            if rep:
                times[("prefill", patched)].append(tp)
                times[("generate", patched)].append(tg)
    med = {k: 1e3 * statistics.median(v) for k, v in times.items()}
    return dict(name=name, prefill=(med[("prefill", False)], med[("prefill", True)]),
                generate=(med[("generate", False)], med[("generate", True)]),
                same=bool(torch.equal(tokens[False], tokens[True])))


TOWER = "qwen3-vl-tower"


def run_tower(args, device: torch.device, dtype: torch.dtype) -> dict:
    import transformers

    from posenc_native.integrations import transformers as hfi

    cfg = transformers.Qwen3VLVisionConfig(depth=4, hidden_size=1152, intermediate_size=4304, num_heads=16,
                                           patch_size=16, temporal_patch_size=2, spatial_merge_size=2,
                                           out_hidden_size=2048, num_position_embeddings=2304,
                                           deepstack_visual_indexes=[1])
    torch.manual_seed(0)
    tower = transformers.models.qwen3_vl.modeling_qwen3_vl.Qwen3VLVisionModel._from_config(
        cfg, attn_implementation="sdpa", dtype=dtype).to(device).eval()
    grid = torch.tensor([[1, args.grid, args.grid]], device=device)
    g = torch.Generator().manual_seed(1)
    patches = torch.randn(args.grid * args.grid, 3 * 2 * 16 * 16, generator=g).to(device, dtype)

    def forward():
        return tower(patches, grid_thw=grid).last_hidden_state

    times: dict = {False: [], True: []}
    out = {}
    for rep in range(args.repeat + 1):  # the first round warms up
        for patched in (False, True):
            if patched:
                hfi.patch(tower)
            t, out[patched] = _timed(forward, device)
            if patched:
                hfi.unpatch(tower)
            if rep:
                times[patched].append(t)
    diff = (out[True].float() - out[False].float()).abs().max().item()
    return dict(unpatched=1e3 * statistics.median(times[False]), patched=1e3 * statistics.median(times[True]),
                diff=diff, scale=out[False].float().abs().max().item())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--prefill", type=int, default=2048)
    p.add_argument("--new", type=int, default=64)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    p.add_argument("--quick", action="store_true", help="256-token prefill, 8 new tokens, 16x16 patches, 1 repeat")
    p.add_argument("--only", nargs="*", default=None, help="models: " + " ".join(["llama-yarn", "gemma2", "olmo2",
                                                                                  "mixtral", TOWER]))
    p.add_argument("--grid", type=int, default=48, help=f"{TOWER}: patches per image side (48: 2304 patches)")
    args = p.parse_args(argv)
    if args.quick:
        args.prefill, args.new, args.repeat, args.grid = 256, 8, 1, 16
    if args.threads:
        torch.set_num_threads(args.threads)
    import transformers

    transformers.logging.set_verbosity_error()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    names = args.only or [*_configs(), TOWER]
    print("command:  python benchmarks/bench_e2e.py " + " ".join(argv if argv is not None else sys.argv[1:]))
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else ""
    print(f"machine:  {platform.machine()}, {os.cpu_count()} cores, torch threads {torch.get_num_threads()}, "
          f"torch {torch.__version__}, transformers {transformers.__version__} {gpu}")
    import posenc_native as pn

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_cpu import print_library

    print_library(pn.build_info()["library"])
    print(f"models:   random weights, 4 layers, hidden 512, 8 heads (2 kv), vocab 32000, sdpa (Gemma 2: eager), {args.dtype}, "
          f"{device}; prefill {args.prefill} tokens, then greedy generation of {args.new} tokens; median of "
          f"{args.repeat}\n")
    head = (f"{'model':12s} {'prefill ms':>11s} {'patched':>9s} {'ratio':>6s}   {'generate ms':>11s} {'patched':>9s} "
            f"{'ratio':>6s}  {'ms/token':>8s} {'patched':>8s}  same tokens")
    print(head)
    print("-" * len(head))
    for name in names:
        if name == TOWER:
            continue
        r = run(name, args, device, dtype)
        (pu, pp), (gu, gp) = r["prefill"], r["generate"]
        # decode time per token: generation minus its own prefill, over the new tokens
        du, dp = (gu - pu) / args.new, (gp - pp) / args.new
        print(f"{name:12s} {pu:11.1f} {pp:9.1f} {pp / pu:6.2f}   {gu:11.1f} {gp:9.1f} {gp / gu:6.2f}  {du:8.2f} "
              f"{dp:8.2f}  {'yes' if r['same'] else 'NO'}", flush=True)
    if TOWER in names:
        r = run_tower(args, device, dtype)
        print(f"\n{TOWER}: Qwen3-VL vision widths (hidden 1152, 16 heads of 72, rotary pairs height then width), "
              f"4 blocks, one image of {args.grid}x{args.grid} patches, {args.dtype}, {device}; median of {args.repeat}")
        print(f"forward ms {r['unpatched']:.1f}, patched {r['patched']:.1f}, ratio {r['patched'] / r['unpatched']:.2f}; "
              f"outputs differ by at most {r['diff']:.2g} (largest output {r['scale']:.3g})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
