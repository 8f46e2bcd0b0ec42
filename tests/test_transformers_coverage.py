"""Coverage of posenc_native.integrations.transformers over every transformers model family that
defines a rotary-embedding class (run by `make coverage`; skipped in the ordinary suite).

For each family (a ``transformers/models/<family>`` folder whose modeling code defines a
``*RotaryEmbedding`` class) a tiny random model is built from its config class (causal LM when
the family has one, else the base model), in float32 with eager attention. Then:

- patched: ``patch`` accepted it; fp32 logits (base models: last hidden state) within 1e-4 of the
  unpatched model, identical 10-token greedy generation (causal LMs), and after ``unpatch`` the
  outputs are bit-identical to the original's;
- refused: ``patch`` raised ``UnsupportedModelError``/``ValueError`` (the reason is listed);
- not built: no tiny model could be built or run from the config class (the error is listed), or its
  outputs do not depend on the rotary path (weight matrices left at zero by the family's init are
  drawn at random first, so that attention reaches the outputs);
- WRONG: patched, but the outputs differ (always a failure).

The table goes to docs/transformers_coverage.md. The test fails when a family the committed table
lists as patched is now refused, not built or wrong, and when ``supported_model_types()`` names a
model type not verified here. ``POSENC_UPDATE_COVERAGE=1`` also rewrites
python/posenc_native/integrations/transformers/verified.py (what ``supported_model_types`` returns).
``python tests/test_transformers_coverage.py FAMILY...`` runs some families and prints the results.
"""
from __future__ import annotations

import copy
import gc
import importlib
import inspect
import os
import re
import sys
import time
import traceback
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "docs" / "transformers_coverage.md"
VERIFIED = ROOT / "python" / "posenc_native" / "integrations" / "transformers" / "verified.py"
LOGIT_ATOL = 1e-4
NEW_TOKENS = 10
VOCAB = 128
MAX_PARAMS = 30_000_000

# Small sizes for whatever of these a config class has (sub-configs too: text, vision, audio, ...).
_SMALL = dict(
    hidden_size=64, n_embd=64, d_model=64, n_positions=256, rotary_dim=8, intermediate_size=128, num_hidden_layers=2, num_layers=2, n_layer=2,
    num_attention_heads=4, num_key_value_heads=2, n_head=4, head_dim=16, max_position_embeddings=256,
    initializer_range=0.2, num_experts=4, num_local_experts=4, n_routed_experts=4, num_experts_per_tok=2,
    moe_intermediate_size=32, shared_expert_intermediate_size=32, n_shared_experts=1, moe_num_experts=4,
    kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16,
    first_k_dense_replace=1, n_group=1, topk_group=1, sliding_window=64, depth=1, embed_dim=32, hidden_dim=64,
    linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=16, linear_value_head_dim=16,
    mamba_n_heads=4, mamba_d_head=16, mamba_d_state=16, ssm_state_size=16, mamba_d_conv=4, mamba_expand=1,
    H_cycles=1, L_cycles=1, hidden_size_per_layer_input=16,
    num_key_value_groups=None, tie_word_embeddings=False, use_cache=True,
)
_SUBCONFIGS = ("text_config", "decoder_config", "language_config", "llm_config", "thinker_config", "talker_config",
               "audio_config", "vision_config", "encoder_config", "depth_decoder_config", "backbone_config")


def _rotary_families() -> list[str]:
    import transformers

    models = Path(transformers.__file__).parent / "models"
    pattern = re.compile(r"^class \w+RotaryEmbedding\(", re.M)
    return sorted(d.name for d in models.iterdir()
                  if d.is_dir() and any(pattern.search(f.read_text()) for f in d.glob("modeling_*.py")))


def _model_types(family: str) -> list[tuple[str, str]]:
    """(model_type, "causal"|"base") candidates of a family, causal LMs first."""
    from transformers.models.auto import configuration_auto as ca
    from transformers.models.auto import modeling_auto as ma

    types = [mt for mt in ca.CONFIG_MAPPING_NAMES if ca.model_type_to_module_name(mt) == family]
    causal = [(mt, "causal") for mt in types if mt in ma.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES]
    base = [(mt, "base") for mt in types if mt in ma.MODEL_MAPPING_NAMES]
    return causal + base


def _small_kwargs(cls, default) -> dict:
    known = set(default.to_dict())
    try:
        known |= set(inspect.signature(cls.__init__).parameters)
    except (TypeError, ValueError):
        pass
    kw = {k: v for k, v in _SMALL.items() if k in known and v is not None}
    if "vocab_size" in known:  # small, but above every token id the config names (pad, image, ...)
        ids = [v for k, v in default.to_dict().items() if k.endswith(("_token_id", "_token_index", "_id"))
               and isinstance(v, int) and not isinstance(v, bool)]
        kw["vocab_size"] = max([512] + [i + 1 for i in ids])
        if "vocab_size_per_layer_input" in known:  # Gemma 3n/4's per-layer embeddings: as small
            kw["vocab_size_per_layer_input"] = kw["vocab_size"]
    if "qk_rope_head_dim" in known and "head_dim" in kw:  # MLA: head_dim is the rotated part
        kw["head_dim"] = kw["qk_rope_head_dim"]
    if "kv_lora_rank" in known and "num_key_value_heads" in kw:  # MLA expands k/v to every head
        kw["num_key_value_heads"] = kw["num_attention_heads"]
    params = getattr(default, "rope_parameters", None)
    if "mrope_section" in getattr(cls, "ignore_keys_at_rope_validation", ()) and isinstance(params, dict) and (
            "rope_type" in params or "rope_theta" in params):
        # MRoPE: sections (T, H, W) that cover the small head's pairs (the defaults are for head_dim 128)
        head_dim = kw.get("head_dim") or kw.get("hidden_size", 64) // kw.get("num_attention_heads", 4)
        prf = params.get("partial_rotary_factor") or getattr(default, "partial_rotary_factor", None) or 1.0
        pairs = int(head_dim * prf) // 2
        kw["rope_parameters"] = {**params, "mrope_section": [pairs - 2 * (pairs // 3), pairs // 3, pairs // 3]}
    for name in _SUBCONFIGS:
        sub = getattr(default, name, None)
        if sub is not None and hasattr(sub, "to_dict") and not isinstance(sub, dict):
            try:
                kw[name] = type(sub)(**_small_kwargs(type(sub), sub))
            except Exception:  # noqa: BLE001 - keep the default sub-config
                pass
    if "layer_types" in known and isinstance(getattr(default, "layer_types", None), list):
        lt = default.layer_types
        if lt:  # keep both kinds of layers when the default mixes them
            kinds = list(dict.fromkeys(lt))
            kw["layer_types"] = (kinds * 2)[: _SMALL["num_hidden_layers"]] if len(kinds) > 1 else [lt[0]] * 2
    return kw


def _build(model_type: str, kind: str):
    import transformers
    from transformers.models.auto import configuration_auto as ca

    cls = ca.CONFIG_MAPPING[model_type]
    cfg = cls(**_small_kwargs(cls, cls()))
    auto = transformers.AutoModelForCausalLM if kind == "causal" else transformers.AutoModel
    with torch.device("meta"):  # count first: some config classes keep large parts the sizes above miss
        n = sum(p.numel() for p in auto.from_config(cfg, attn_implementation="eager").parameters())
    if n > MAX_PARAMS:
        raise ValueError(f"the smallest config tried still has {n / 1e6:.0f}M parameters")
    torch.manual_seed(0)
    model = auto.from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    with torch.no_grad():  # zero-initialised projections (NeoMME's o_proj) would cut attention off the outputs
        for p in model.parameters():
            if p.dim() >= 2 and not p.any():
                p.normal_(0.0, 0.02)
    return model.eval()


def _inputs(seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (2, 12), generator=g)  # below every family's vocabulary size


@torch.no_grad()
def _out(model, kind: str, ids) -> torch.Tensor:
    out = model(input_ids=ids)
    t = out.logits if kind == "causal" else getattr(out, "last_hidden_state", None)
    if t is None:
        t = out[0]
    return t.float()


@torch.no_grad()
def _generate(model, ids) -> torch.Tensor:
    return model.generate(ids, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                          eos_token_id=None, pad_token_id=0)


def _first_line(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".replace("\n", " ").replace("|", "/")
    text = re.sub(r"posenc_native\.integrations\.transformers: ", "", text)
    return text[:300]


def _run(model_type: str, kind: str) -> tuple[str, str]:
    """(status, reason) of one model type."""
    from posenc_native.integrations import transformers as hfi

    try:
        model = _build(model_type, kind)
        ids = _inputs()
        want = _out(model, kind, ids)
        if not torch.isfinite(want).all():
            return "not built", "the tiny random model gives non-finite outputs"
        want_gen = _generate(model, ids) if kind == "causal" else None
    except Exception as e:  # noqa: BLE001
        return "not built", _first_line(e)
    try:
        hfi.patch(model)
    except (hfi.UnsupportedModelError, ValueError) as e:
        return "refused", _first_line(e)
    try:
        got = _out(model, kind, ids)
        err = (got - want).abs().max().item()
        if not err <= LOGIT_ATOL:
            return "WRONG", f"patched outputs differ by {err:.3g}"
        if err == 0.0:  # float32 angles vs the kernel's float64 ones always differ somewhere: nothing was compared
            return "not built", "the tiny model's outputs do not depend on its rotary path (patched = unpatched bit for bit)"
        if kind == "causal":
            got_gen = _generate(model, ids)
            if not torch.equal(got_gen, want_gen):
                return "WRONG", "greedy generation differs"
        hfi.unpatch(model)
        if not torch.equal(_out(model, kind, ids), want):
            return "WRONG", "unpatched outputs are not bit-identical to the original's"
    except Exception as e:  # noqa: BLE001
        return "WRONG", "patched model failed: " + _first_line(e)
    finally:
        if hfi.is_patched(model):
            hfi.unpatch(model)
    what = "logits, greedy generation" if kind == "causal" else "last hidden state"
    return "patched", f"{type(model).__name__}: max abs diff {err:.1e} ({what})"


_RANK = {"WRONG": 3, "patched": 2, "refused": 1, "not built": 0}


def run_family(family: str) -> tuple[str, str, str]:
    """(model type, status, reason) of a family: the best outcome over its model types (any WRONG wins)."""
    candidates = _model_types(family)
    if not candidates:
        return "-", "not built", "no config class with a model class"
    best = None
    for model_type, kind in candidates:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            status, reason = _run(model_type, kind)
        gc.collect()
        row = (model_type, status, reason)
        if status == "WRONG":
            return row
        if best is None or _RANK[status] > _RANK[best[1]]:
            best = row
        if status == "patched":
            break
    return best


def read_table(path: Path = TABLE) -> dict[str, tuple[str, str, str]]:
    rows = {}
    if path.exists():
        for line in path.read_text().splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) == 4 and cells[0] not in ("family", "") and not set(cells[0]) <= {"-"}:
                rows[cells[0]] = (cells[1].strip("`"), cells[2], cells[3])
    return rows


def write_table(results: dict[str, tuple[str, str, str]], seconds: float, path: Path = TABLE) -> None:
    import transformers

    counts = {s: sum(1 for r in results.values() if r[1] == s) for s in _RANK}
    lines = [
        "# transformers model families and posenc's patcher",
        "",
        f"Written by `make coverage` (tests/test_transformers_coverage.py) with transformers {transformers.__version__}: "
        "every model family whose modeling code defines a `*RotaryEmbedding` class, a tiny random model built "
        "from its config class (causal LM where the family has one, else the base model), fp32, eager attention, "
        "weight matrices its init leaves at zero drawn at random (else attention may not reach the outputs). "
        "**patched**: `patch()` accepted it, outputs within 1e-4 of the unpatched model, identical 10-token greedy "
        "generation (causal LMs), bit-identical outputs after `unpatch()`. **refused**: `patch()` raised "
        "`UnsupportedModelError` with the reason shown. **not built**: no tiny model could be built or run from "
        "the config class alone.",
        "",
        f"{len(results)} families: {counts['patched']} patched, {counts['refused']} refused, "
        f"{counts['not built']} not built, {counts['WRONG']} wrong ({seconds:.0f} s).",
        "",
        "| family | model type | status | reason / what was compared |",
        "|---|---|---|---|",
    ]
    for family in sorted(results):
        mt, status, reason = results[family]
        lines.append(f"| {family} | `{mt}` | {status} | {reason} |")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def write_verified(results: dict[str, tuple[str, str, str]], path: Path = VERIFIED) -> None:
    import transformers

    types = sorted({mt for mt, status, _ in results.values() if status == "patched"})
    body = ",\n".join(f"    {t!r}" for t in types)
    path.write_text('"""Model types verified end to end by tests/test_transformers_coverage.py (written by it with\n'
                    'POSENC_UPDATE_COVERAGE=1; do not edit)."""\n'
                    f"TRANSFORMERS = {transformers.__version__!r}\nMODEL_TYPES = (\n{body},\n)\n")


@pytest.mark.skipif(os.environ.get("POSENC_COVERAGE") != "1", reason="run by `make coverage` (POSENC_COVERAGE=1)")
def test_every_rotary_family():
    pytest.importorskip("transformers")
    import transformers

    from posenc_native.integrations.transformers import verified

    transformers.logging.set_verbosity_error()
    before = read_table()
    t0 = time.perf_counter()
    results = {family: run_family(family) for family in _rotary_families()}
    write_table(results, time.perf_counter() - t0)
    if os.environ.get("POSENC_UPDATE_COVERAGE") == "1":
        write_verified(results)
        importlib.reload(verified)
    wrong = {f: r for f, r in results.items() if r[1] == "WRONG"}
    lost = {f: results.get(f, ("-", "missing", "")) for f, r in before.items()
            if r[1] == "patched" and results.get(f, (None, None))[1] != "patched"}
    patched_types = {mt for mt, status, _ in results.values() if status == "patched"}
    unverified = set(verified.MODEL_TYPES) - patched_types
    assert not wrong, f"patched but wrong: {wrong}"
    assert not lost, f"patched in the committed table, not any more: {lost}"
    assert not unverified, f"supported_model_types() names model types not verified here: {sorted(unverified)}"


if __name__ == "__main__":
    import transformers

    transformers.logging.set_verbosity_error()
    for fam in sys.argv[1:] or _rotary_families():
        t = time.perf_counter()
        try:
            res = run_family(fam)
        except Exception:  # noqa: BLE001
            res = ("?", "CRASH", traceback.format_exc()[-300:])
        print(f"{fam:32s} {res[0]:28s} {res[1]:10s} {time.perf_counter() - t:5.1f}s  {res[2][:200]}", flush=True)
