"""Build a ModelSpec from a config.json (path or dict), a shipped table entry, or a model Ridgeline loads."""
from __future__ import annotations

import json
from pathlib import Path

from ridgeline.advisor.errors import AdvisorError
from ridgeline.advisor.model_spec import MLA, ModelSpec
from ridgeline.advisor.model_table import TABLE, lookup

REQUIRED = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size",
            "max_position_embeddings")


def _int(cfg: dict, key: str, where: str, default: int | None = None) -> int:
    value = cfg.get(key, default)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or int(value) != value:
        raise AdvisorError(f"{where}: field {key!r} must be a non-negative integer, got {value!r}", key)
    return int(value)


def spec_from_hf(cfg: dict, name: str, where: str = "config.json") -> ModelSpec:
    """Hugging Face config keys: Llama/Mistral/Qwen2 (dense), Mixtral, Qwen2-MoE, DeepSeek-V2/V3 (MLA)."""
    if not isinstance(cfg, dict):
        raise AdvisorError(f"{where} is not a JSON object")
    if "text_config" in cfg and "hidden_size" not in cfg:
        cfg = cfg["text_config"]
    missing = [k for k in REQUIRED if cfg.get(k) is None]
    if missing:
        raise AdvisorError(f"{where} lacks the field(s) {', '.join(map(repr, missing))}; the advisor needs "
                           f"{', '.join(REQUIRED)} (and num_key_value_heads / head_dim when they differ "
                           f"from the defaults)", missing[0])
    heads = _int(cfg, "num_attention_heads", where)
    hidden = _int(cfg, "hidden_size", where)
    layers = _int(cfg, "num_hidden_layers", where)
    if not (heads and hidden and layers):
        raise AdvisorError(f"{where}: num_hidden_layers, hidden_size and num_attention_heads must be > 0")
    experts = _int(cfg, "num_local_experts", where) or _int(cfg, "n_routed_experts", where) \
        or _int(cfg, "num_experts", where)
    mla = None
    if cfg.get("kv_lora_rank"):
        mla = MLA(*(_int(cfg, k, where) for k in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                                                  "qk_rope_head_dim", "v_head_dim")))
    archs = cfg.get("architectures") or [""]
    kv_heads = _int(cfg, "num_key_value_heads", where) or heads
    if heads % kv_heads:
        raise AdvisorError(f"{where}: num_attention_heads {heads} is not a multiple of num_key_value_heads "
                           f"{kv_heads}")
    spec = ModelSpec(
        name=name, num_layers=layers, hidden_size=hidden, num_heads=heads, num_kv_heads=kv_heads,
        head_dim=_int(cfg, "head_dim", where) or (mla.qk_nope_head_dim + mla.qk_rope_head_dim if mla
                                                  else hidden // heads),
        intermediate_size=_int(cfg, "intermediate_size", where), vocab_size=_int(cfg, "vocab_size", where),
        max_context=_int(cfg, "max_position_embeddings", where),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=str(archs[0]).startswith("Qwen2") or bool(cfg.get("attention_bias", False)),
        num_experts=experts,
        experts_per_token=_int(cfg, "num_experts_per_tok", where) if experts else 0,
        # Mixtral's experts are intermediate_size wide; DeepSeek/Qwen-MoE name their width
        moe_intermediate_size=(_int(cfg, "moe_intermediate_size", where) or _int(cfg, "intermediate_size", where))
        if experts else 0,
        shared_experts=_int(cfg, "n_shared_experts", where) if experts else 0,
        shared_expert_intermediate=_int(cfg, "shared_expert_intermediate_size", where) if experts else 0,
        dense_layers=_int(cfg, "first_k_dense_replace", where) if experts else 0,
        mla=mla,
    )
    if experts and not 0 < spec.experts_per_token <= experts:
        raise AdvisorError(f"{where}: num_experts_per_tok must be in 1..{experts} for a MoE model")
    return spec


def spec_from_file(path: Path) -> ModelSpec:
    try:
        cfg = json.loads(path.read_text())
    except OSError as e:
        raise AdvisorError(f"cannot read {path}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise AdvisorError(f"{path} is not valid JSON: {e}") from None
    name = path.parent.name if path.name == "config.json" else path.stem
    return spec_from_hf(cfg, name, str(path))


def resolve_spec(model: str) -> ModelSpec:
    """A config.json path (or a folder holding one), a table name, or a model Ridgeline can load."""
    path = Path(model).expanduser()
    if path.is_file():
        return spec_from_file(path)
    if path.is_dir() and (path / "config.json").is_file():
        return spec_from_file(path / "config.json")
    if model.endswith(".json"):
        raise AdvisorError(f"config file {path} does not exist", "model")
    entry = lookup(model)
    if entry is not None:
        name, cfg = entry
        return spec_from_hf(cfg, name, f"table entry {name}")
    return spec_from_loadable(model)


def spec_from_loadable(model: str) -> ModelSpec:
    from ridgeline.errors import ModelLoadError
    from ridgeline.weights.hf_config import load_arch_config
    from ridgeline.weights.pull import ALIASES
    from ridgeline.models.resolve import HUB_ID, resolve_model

    if model not in ALIASES and not HUB_ID.fullmatch(model) and not model.endswith(".gguf"):
        raise AdvisorError(f"unknown model {model!r}: not a config.json path, not a Ridgeline alias "
                           f"({', '.join(sorted(ALIASES))}), and not one of the shipped configurations: "
                           f"{', '.join(TABLE)}", "model")
    try:
        arch = load_arch_config(resolve_model(model, progress=False))
    except ModelLoadError as e:
        raise AdvisorError(f"{e.message} (shipped configurations: {', '.join(TABLE)})", "model") from None
    return spec_from_arch(arch, model)


def spec_from_arch(arch, name: str) -> ModelSpec:
    """From the engine's ArchConfig (ridgeline.weights.hf_config): dense Llama-family models."""
    return ModelSpec(name=name, num_layers=arch.num_layers, hidden_size=arch.hidden_size,
                     num_heads=arch.num_heads, num_kv_heads=arch.num_kv_heads, head_dim=arch.head_dim,
                     intermediate_size=arch.intermediate_size, vocab_size=arch.vocab_size,
                     max_context=arch.max_position_embeddings, tie_embeddings=arch.tie_word_embeddings,
                     qkv_bias=arch.qkv_bias)
