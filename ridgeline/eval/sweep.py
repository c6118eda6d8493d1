"""`ridgeline eval --sweep`: quantize one component at a time, everything else left as the reference
has it, and rank the components by how much each alone costs (mean KL against the reference).

Components: the weights of all linear layers (weight-only); the weights of one kind of linear layer
alone (q/k/v, attention output, gate/up, down, LM head), to show where the loss comes from; the same
weights with int8 activations (w8a8 / w4a8: what activations add on top of the weights); and, where
the engine has the option, the KV cache; and the attention scores (softmax inputs) rounded to int8
per query row and head (layers/attention_scores_q.py).
"""
from __future__ import annotations

import math
from dataclasses import fields

from ridgeline.errors import InvalidRequestError
from ridgeline.eval.harness import Result, Setting
from ridgeline.formats import options as quant_options

# (component, layer-name glob) of the kinds of linear layer in the Llama-family models
LAYER_KINDS = (("q/k/v projection", "*.qkv_proj"), ("attention output", "*.o_proj"),
               ("MLP gate/up", "*.gate_up_proj"), ("MLP down", "*.down_proj"), ("LM head", "lm_head"))
KV_SWEEP_DTYPE = "int8"
SCORES_BACKEND = "sdpa-scores-int8"  # attention with its softmax inputs rounded to int8
WEIGHTS_ONLY = {"none": "int8", "auto": "int8", "int8": "int8", "w8a8": "int8", "int4": "int4", "w4a8": "int4",
                "gguf": "int4"}
WITH_ACTIVATIONS = {"int8": "w8a8", "int4": "w4a8"}


def sweep_settings(options: dict) -> list[Setting]:
    """The sweep's settings for the weight format the options name (int8 when they name none)."""
    asked = options.get("quantization") or "none"
    if asked not in WEIGHTS_ONLY:
        raise InvalidRequestError(f"--sweep takes --quantization {', '.join(WEIGHTS_ONLY)}; got {asked} (evaluate "
                                  "it without --sweep)", "quantization")
    quant = WEIGHTS_ONLY[asked]
    group, sym = options.get("quant_group_size"), bool(options.get("quant_symmetric"))
    fmt = quant_options.format_name(quant, group, sym)
    head = dict(quant_options.implied_rules(quant)).get("lm_head", fmt)
    base = {"quantization": "none", "quant_group_size": None, "quant_symmetric": False}
    out = [Setting(f"{fmt}: all linear layers", {"quantization": quant, "quant_group_size": group,
                                                 "quant_symmetric": sym}, "weights")]
    for kind, glob in LAYER_KINDS:
        f = head if glob == "lm_head" else fmt
        out.append(Setting(f"{f}: {kind} only", {**base, "layer_formats": ((glob, f),)}, f"weights ({kind})"))
    act = WITH_ACTIVATIONS[quant]
    out.append(Setting(f"{quant_options.format_name(act, group, sym)}: all linear layers",
                       {"quantization": act, "quant_group_size": group, "quant_symmetric": sym},
                       "weights + activations"))
    if engine_has_option("kv_cache_dtype"):
        out.append(Setting(f"KV cache {KV_SWEEP_DTYPE}", {**base, "kv_cache_dtype": KV_SWEEP_DTYPE}, "KV cache"))
    out.append(Setting("attention scores int8", {**base, "attention_backend": SCORES_BACKEND},
                       "attention scores"))
    return out


def engine_has_option(name: str) -> bool:
    from ridgeline import config
    return any(name in {f.name for f in fields(c)} for c in (config.ModelConfig, config.CacheConfig,
                                                               config.SchedulerConfig, config.EngineConfig))


def ranking(results: list[Result]) -> list[Result]:
    """Sweep results, most sensitive (largest mean KL) first."""
    return sorted((r for r in results if r.kl is not None),
                  key=lambda r: -r.kl if not math.isnan(r.kl) else math.inf)
