"""The architecture facts the engine needs, read from a Hugging Face config.json.

Accepts configs written by transformers 4 and 5 (rope settings under `rope_scaling`
or `rope_parameters`, `torch_dtype` or `dtype`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ridgeline.errors import ModelLoadError
from ridgeline.weights import limits
from ridgeline.weights.families import ACTIVATIONS, FAMILIES, LLAMA, Family


@dataclass(frozen=True)
class MoEConfig:
    """A sparse MLP: a router picks top_k of num_experts experts per token."""
    num_experts: int
    top_k: int
    intermediate_size: int  # each expert's width
    norm_topk_prob: bool  # renormalise the top-k router probabilities to sum to 1
    shared_intermediate_size: int  # 0: none; else one shared expert that every token runs, sigmoid-gated
    sparse_layers: tuple[int, ...]  # the layers with a sparse MLP; the others keep a dense one
    bias: bool = False  # the router and each expert's projections carry biases (GPT-OSS)
    activation: str = "silu"  # the experts' gated activation: silu | swiglu_clamp (GPT-OSS)
    act_params: tuple[float, ...] = ()  # swiglu_clamp: (alpha, limit)


MOE_ARCHITECTURES = tuple(a for a, f in FAMILIES.items() if f.moe)


@dataclass(frozen=True)
class ArchConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    sliding_window: int | None  # the window of the layers that have one (None: no layer has)
    rope_scaling: tuple | None  # sorted (key, value) pairs, hashable
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    layer_windows: tuple[int | None, ...] = ()  # per layer: its sliding window, None = attends to every key

    def window_of(self, layer: int) -> int | None:
        return self.layer_windows[layer] if self.layer_windows else self.sliding_window

    @property
    def kv_window(self) -> int | None:
        """Keys a query can reach in any layer: the largest window when every layer has one, else None."""
        windows = [self.window_of(i) for i in range(self.num_layers)]
        return None if not windows or None in windows else max(windows)
    qk_norm: bool = False  # per-head RMSNorm of q and k before rotary (Qwen3, Gemma 3)
    moe: MoEConfig | None = None
    # the layer structure's switches (weights/families.py; models/layer_spec.py makes each layer's declaration)
    norm_offset: bool = False  # RMSNorm weights stored as w, applied as (1 + w): folded into them at load
    sandwich_norms: bool = False  # a norm on the attention output and on the MLP output too (Gemma 2/3)
    activation: str = "silu"  # the gated MLP's: silu | gelu_tanh
    embed_scale: float | None = None  # embeddings multiplied by this (Gemma: sqrt(hidden_size))
    query_scale: float | None = None  # attention scores' scale; None: head_dim ** -0.5
    attn_softcap: float | None = None  # scores -> cap * tanh(scores / cap) before the softmax (Gemma 2)
    final_softcap: float | None = None  # logits -> cap * tanh(logits / cap) (Gemma 2)
    local_rope: tuple | None = None  # (theta, rope_scaling pairs) of the windowed layers where it differs (Gemma 3)
    rotary_dim: int = 0  # the leading dims of each head that rotate; 0: all of them (Phi-4-mini: 3/4)
    fused_checkpoint: bool = False  # the checkpoint stores qkv_proj and gate_up_proj fused (Phi-3)
    sinks: bool = False  # a learned attention-sink logit per query head joins each softmax (GPT-OSS)

    @property
    def family(self) -> Family:
        return FAMILIES.get(self.architecture, LLAMA)

    @property
    def rope_scaling_dict(self) -> dict | None:
        return dict(self.rope_scaling) if self.rope_scaling else None

    @property
    def num_params(self) -> int:
        h, i, kv = self.hidden_size, self.intermediate_size, self.num_kv_heads * self.head_dim
        per_layer = h * self.num_heads * self.head_dim * 2 + 2 * h * kv + 3 * h * i + 2 * h
        emb = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        total = self.num_layers * per_layer + emb + h
        if self.moe is not None:
            m, sparse = self.moe, len(self.moe.sparse_layers)
            expert = 3 * h * m.intermediate_size
            shared = 3 * h * m.shared_intermediate_size + h if m.shared_intermediate_size else 0
            total += sparse * (m.num_experts * expert + shared + m.num_experts * h - 3 * h * i)
        return total


    @property
    def active_params(self) -> int:
        """Parameters one token runs through: a sparse layer counts its top_k experts, not all of them."""
        if self.moe is None:
            return self.num_params
        m, h = self.moe, self.hidden_size
        return self.num_params - len(m.sparse_layers) * (m.num_experts - m.top_k) * 3 * h * m.intermediate_size


def _ids(value, field: str, where: str) -> tuple[int, ...]:
    if value is None:
        return ()
    values = value if isinstance(value, (list, tuple)) else [value]
    return tuple(limits.checked_index(v, field, where) for v in values)


def freeze_rope_scaling(scaling: dict) -> tuple | None:
    """A rope_scaling dict as ArchConfig keeps it (sorted pairs, hashable); None when empty."""
    return tuple(sorted((k, _freeze(v)) for k, v in scaling.items())) or None


def load_arch_config(folder: Path) -> ArchConfig:
    path = Path(folder) / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except FileNotFoundError:
        raise ModelLoadError(f"{path} is missing: a Hugging Face model folder needs config.json") from None
    except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ModelLoadError(f"{path} is not valid JSON: {e}") from None
    if isinstance(cfg, dict) and isinstance(cfg.get("text_config"), dict) and "hidden_size" not in cfg:
        top = cfg  # an image-text checkpoint: its text model, with the ids written beside it
        cfg = {**{k: top[k] for k in ("bos_token_id", "eos_token_id") if k in top}, **cfg["text_config"],
               "architectures": top.get("architectures")}
    if not isinstance(cfg, dict):
        raise ModelLoadError(f"{path} is not a JSON object")
    archs = cfg.get("architectures") or []
    if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
        raise ModelLoadError(f"{path} has no 'architectures' entry")
    family = FAMILIES.get(archs[0])
    if family is not None and family.defaults:
        cfg = {**dict(family.defaults), **cfg}
    try:
        return _arch_config(cfg, archs[0], Path(folder), str(path))
    except KeyError as e:
        raise ModelLoadError(f"{path} lacks the field {e.args[0]!r}") from None


def _size(cfg: dict, key: str, kind: str, where: str, value=None) -> int:
    """cfg[key] (or `value`, what the field defaults to) as a size in 1..limits.LIMITS[kind]."""
    return limits.checked_int(cfg[key] if value is None else value, key, kind, where)


def _arch_config(cfg: dict, arch: str, folder: Path, where: str) -> ArchConfig:
    heads = _size(cfg, "num_attention_heads", "heads", where)
    hidden = _size(cfg, "hidden_size", "hidden", where)
    kv_heads = _size(cfg, "num_key_value_heads", "heads", where, cfg.get("num_key_value_heads") or heads)
    head_dim = _size(cfg, "head_dim", "head_dim", where, cfg.get("head_dim") or hidden // heads)
    limits.check_heads(heads, kv_heads, head_dim, ("num_attention_heads", "num_key_value_heads", "head_dim"), where)
    positions = _size(cfg, "max_position_embeddings", "positions", where, cfg.get("max_position_embeddings", 2048))
    layers = _size(cfg, "num_hidden_layers", "layers", where)
    family = FAMILIES.get(arch, LLAMA)
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    if not isinstance(rope, dict):
        raise ModelLoadError(f"{where}: rope_scaling is {type(rope).__name__}, not an object")
    local = None  # the windowed layers' own (theta, scaling) where they have one
    if isinstance(rope.get("full_attention"), dict):  # transformers 5: parameters per layer type
        if isinstance(rope.get("sliding_attention"), dict):
            local = _rope(rope["sliding_attention"], cfg, positions, where, nested=True)
        rope = rope["full_attention"]
        theta, scaling = _rope(rope, cfg, positions, where, nested=True)
    else:
        theta, scaling = _rope(rope, cfg, positions, where)
        if family.local_rope and "rope_local_base_freq" in cfg:  # transformers 4's Gemma 3: its own base, unscaled
            local = (limits.checked_float(cfg["rope_local_base_freq"], "rope_local_base_freq", where, positive=True),
                     None)
    rotary = head_dim
    partial = cfg.get("partial_rotary_factor", rope.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        partial = limits.checked_float(partial, "partial_rotary_factor", where, positive=True)
        rotary = int(head_dim * partial)
        if partial > 1 or rotary < 2 or rotary % 2:
            raise ModelLoadError(f"{where}: partial_rotary_factor = {partial} of head_dim {head_dim} does not give "
                                 "an even number of rotary dims")
    _check_longrope(scaling, rotary, where)
    gen_eos = _generation_eos(folder)
    windows = layer_windows(cfg, arch, where)
    act = cfg.get("hidden_activation") or cfg.get("hidden_act") or "silu"
    if act not in ACTIVATIONS:
        raise ModelLoadError(f"{where}: activation {act!r} is not supported; supported: {', '.join(sorted(ACTIVATIONS))}")
    return ArchConfig(
        architecture=arch,
        vocab_size=_size(cfg, "vocab_size", "vocab", where),
        hidden_size=hidden,
        intermediate_size=_size(cfg, "intermediate_size", "intermediate", where),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rope_theta=theta,
        rms_norm_eps=limits.checked_float(cfg.get("rms_norm_eps", 1e-6), "rms_norm_eps", where),
        max_position_embeddings=positions,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=family.qkv_bias or bool(cfg.get("attention_bias", False)),
        o_bias=bool(cfg.get("attention_bias", False)),
        sliding_window=max((w for w in windows if w), default=None),
        rope_scaling=scaling,
        bos_token_id=_token_id(cfg.get("bos_token_id"), "bos_token_id", where),
        eos_token_ids=tuple(dict.fromkeys(gen_eos + _ids(cfg.get("eos_token_id"), "eos_token_id", where))),
        layer_windows=windows,
        qk_norm=family.qk_norm,
        moe=_moe(cfg, arch, where),
        norm_offset=family.norm_offset,
        sandwich_norms=family.sandwich_norms,
        activation=ACTIVATIONS[act],
        embed_scale=hidden ** 0.5 if family.embed_scale else None,
        query_scale=(limits.checked_float(cfg.get("query_pre_attn_scalar", head_dim), "query_pre_attn_scalar", where,
                                          positive=True) ** -0.5 if family.query_scalar else None),
        attn_softcap=_softcap(cfg, "attn_logit_softcapping", where) if family.softcaps else None,
        final_softcap=_softcap(cfg, "final_logit_softcapping", where) if family.softcaps else None,
        local_rope=None if local is None or local == (theta, scaling) else local,
        rotary_dim=0 if rotary == head_dim else rotary,
        fused_checkpoint=family.fused_checkpoint,
        sinks=family.sinks,
    )


def _rope(rope: dict, cfg: dict, positions: int, where: str, nested: bool = False) -> tuple[float, tuple | None]:
    """(theta, frozen scaling) of one rope parameter set: rope_scaling (the config's rope_theta first), or
    one layer type's rope_parameters (nested: its own)."""
    theta = rope.get("rope_theta", 10000.0) if nested else cfg.get("rope_theta", rope.get("rope_theta", 10000.0))
    theta = limits.checked_float(theta, "rope_theta", where, positive=True)
    scaling = {k: v for k, v in rope.items() if k not in ("rope_theta", "partial_rotary_factor")}
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type == "default":
        scaling = {}
    elif rope_type in ("dynamic", "yarn", "longrope"):  # their original length, as transformers defaults it
        scaling.setdefault("original_max_position_embeddings", cfg.get("original_max_position_embeddings", positions))
        if rope_type == "longrope":  # the extension its attention factor is computed from
            old = limits.checked_int(scaling["original_max_position_embeddings"], "original_max_position_embeddings",
                                     "positions", where)
            scaling.setdefault("factor", positions / old)
    return theta, freeze_rope_scaling(scaling)


def _check_longrope(scaling: tuple | None, rotary: int, where: str) -> None:
    """LongRoPE lists one factor per rotary pair, short and long alike."""
    sc = dict(scaling or ())
    if sc.get("rope_type", sc.get("type")) != "longrope":
        return
    for key in ("short_factor", "long_factor"):
        f = sc.get(key)
        if not isinstance(f, tuple) or len(f) != rotary // 2:
            raise ModelLoadError(f"{where}: LongRoPE {key} has {len(f) if isinstance(f, tuple) else 'no'} factors; "
                                 f"{rotary} rotary dims need {rotary // 2}")
        for v in f:
            limits.checked_float(v, key, where, positive=True)


def _softcap(cfg: dict, key: str, where: str) -> float | None:
    v = cfg.get(key)
    return None if v is None else limits.checked_float(v, key, where, positive=True)


def _token_id(value, field: str, where: str) -> int | None:
    return None if value is None else limits.checked_index(value, field, where)


def layer_windows(cfg: dict, architecture: str, where: str = "config.json") -> tuple[int | None, ...]:
    """Each layer's sliding window as transformers applies it: `layer_types` where the config lists them
    ("sliding_attention" layers take `sliding_window`); else Qwen2: `use_sliding_window` (off by default)
    from layer `max_window_layers` on; a Gemma-style `sliding_window_pattern` p: every p-th layer attends
    to all keys; otherwise (Mistral) every layer, unless `use_sliding_window` is false."""
    n = cfg["num_hidden_layers"]
    window = cfg.get("sliding_window")
    types = cfg.get("layer_types")
    if not window:
        return (None,) * n
    window = limits.checked_int(window, "sliding_window", "positions", where)
    if types:
        if not isinstance(types, list) or len(types) != n:
            raise ModelLoadError(f"{where} lists {len(types) if isinstance(types, list) else 'no'} layer_types "
                                 f"for {n} layers")
        return tuple(window if t == "sliding_attention" else None for t in types)
    if architecture.startswith("Qwen2"):
        first = cfg.get("max_window_layers", n) if cfg.get("use_sliding_window") else n
        first = limits.checked_index(first, "max_window_layers", where)
        return tuple(window if i >= first else None for i in range(n))
    if cfg.get("use_sliding_window") is False:  # Mistral's configs write null or leave it out
        return (None,) * n
    pattern = cfg.get("sliding_window_pattern")
    pattern = pattern or FAMILIES.get(architecture, LLAMA).window_pattern
    if pattern:
        pattern = limits.checked_int(pattern, "sliding_window_pattern", "layers", where)
        return tuple(None if (i + 1) % pattern == 0 else window for i in range(n))
    return (window,) * n


def _moe(cfg: dict, arch: str, where: str = "config.json") -> MoEConfig | None:
    if arch not in MOE_ARCHITECTURES:
        return None
    layers = cfg["num_hidden_layers"]
    if arch == "MixtralForCausalLM":
        experts = _size(cfg, "num_local_experts", "experts", where)
        return MoEConfig(experts, _top_k(cfg, experts, where), cfg["intermediate_size"], True, 0,
                         tuple(range(layers)))
    if arch == "GptOssForCausalLM":  # softmax over the top-k logits: the renormalised top-k of the softmax
        experts = _size(cfg, "num_local_experts", "experts", where)
        params = tuple(limits.checked_float(cfg.get(k, d), k, where, positive=True)
                       for k, d in (("swiglu_alpha", 1.702), ("swiglu_limit", 7.0)))
        return MoEConfig(experts, _top_k(cfg, experts, where), _size(cfg, "intermediate_size", "intermediate", where),
                         True, 0, tuple(range(layers)), bias=True, activation="swiglu_clamp", act_params=params)
    key = "num_experts" if "num_experts" in cfg else "num_local_experts"  # Qwen3-MoE writes either
    experts = cfg[key] if cfg[key] == 0 and type(cfg[key]) is int else _size(cfg, key, "experts", where)
    step = _size(cfg, "decoder_sparse_step", "layers", where, cfg.get("decoder_sparse_step") or 1)
    dense = cfg.get("mlp_only_layers") or ()
    if not isinstance(dense, (list, tuple)):
        raise ModelLoadError(f"{where}: mlp_only_layers is {type(dense).__name__}, not a list of layers")
    dense = {limits.checked_index(i, "mlp_only_layers", where) for i in dense}
    sparse = tuple(i for i in range(layers) if i not in dense and experts > 0 and (i + 1) % step == 0)
    shared = (cfg.get("shared_expert_intermediate_size") or 0) if arch == "Qwen2MoeForCausalLM" else 0
    if shared:
        shared = _size(cfg, "shared_expert_intermediate_size", "intermediate", where)
    return MoEConfig(experts, _top_k(cfg, max(experts, 1), where), _size(cfg, "moe_intermediate_size",
                                                                        "intermediate", where),
                     bool(cfg.get("norm_topk_prob", False)), shared, sparse)


def _top_k(cfg: dict, experts: int, where: str) -> int:
    top_k = _size(cfg, "num_experts_per_tok", "experts", where)
    if top_k > experts:
        raise ModelLoadError(f"{where}: num_experts_per_tok = {top_k} is more than the {experts} experts")
    return top_k


def _freeze(v):
    return tuple(v) if isinstance(v, list) else v


def _generation_eos(folder: Path) -> tuple[int, ...]:
    path = folder / "generation_config.json"
    if not path.exists():
        return ()
    try:
        gen = json.loads(path.read_text())
    except (ValueError, RecursionError):
        return ()
    return _ids(gen.get("eos_token_id"), "eos_token_id", str(path)) if isinstance(gen, dict) else ()
