"""GGUF files of the non-Llama families (llama.cpp's `gemma2`, `gemma3`, `phi3`): their tensor names,
the config facts their metadata holds (or llama.cpp hard-codes), and the value conventions of
llama.cpp's converter, undone so the converted folder holds what a Hugging Face checkpoint holds:

- Gemma 2/3: every `*norm.weight` is stored as 1 + w (the converter adds the 1); q/k rows are not
  permuted (NEOX rotary). Gemma 3's local layers rotate with `rope.freq_base_swa` (10,000 unless
  given) in a pattern of `attention.sliding_window_pattern` (6 unless given); the query scale is
  1/sqrt(head_dim) except for the 27B sizes (46 / 62 layers), as llama.cpp sets it.
- Phi-3: q/k/v fused in `attn_qkv` and gate/up in `ffn_up` (2 x intermediate rows, gate first);
  LongRoPE's factor lists as the `rope_factors_long` / `rope_factors_short` tensors; the rotary dims
  in `rope.dimension_count`.
- GPT-OSS (`gpt-oss`): the sinks as `attn_sinks.weight` (the HF tensor has no `.weight`), the pre-MLP
  norm as `post_attention_norm`, the router with its bias as `ffn_gate_inp`; gate and up already
  de-interleaved into `ffn_gate_exps` / `ffn_up_exps` with their biases; the experts' blocks MXFP4
  (llama.cpp's nibble order, layouts.py); every 2nd layer global (`attention.sliding_window_pattern`,
  2 unless given), q/k not permuted, YaRN untruncated as the model was trained, the clamped SwiGLU's
  1.702 / 7.0 as llama.cpp hard-codes them.
"""
from __future__ import annotations

import torch

from ridgeline.errors import ModelLoadError
from ridgeline.gguf.meta import MISSING, meta_float, meta_int

# general.architecture -> its layer tensor names where they differ from the Llama-shaped table
NAMES = {
    "gemma2": {"ffn_norm": "pre_feedforward_layernorm", "post_attention_norm": "post_attention_layernorm",
               "post_ffw_norm": "post_feedforward_layernorm"},
    "phi3": {"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"},
}
NAMES["gemma3"] = NAMES["gemma2"]
NAMES["gpt-oss"] = {"post_attention_norm": "post_attention_layernorm", "attn_sinks": "self_attn.sinks",
                    "ffn_gate_inp": "mlp.router"}
BARE = {"attn_sinks"}  # HF tensors named without the `.weight` suffix
NORM_OFFSET = ("gemma2", "gemma3")
CONSUMED = ("rope_factors_long.weight", "rope_factors_short.weight")  # read into the config, not weights
_LARGE = {("gemma2", 46), ("gemma3", 62)}  # the 27B sizes: queries scaled by hidden / heads


def hf_value(arch: str, gguf_name: str, w: torch.Tensor) -> torch.Tensor:
    """A dense tensor of the file as the Hugging Face checkpoint holds it (Gemma's norms back to w)."""
    if arch in NORM_OFFSET and gguf_name.endswith("norm.weight"):
        return w.float() - 1.0
    return w


def config(g, arch: str, cfg: dict) -> dict:
    """The family's config.json fields, beside the Llama-shaped ones hf_config already set."""
    md, layers = g.metadata, cfg["num_hidden_layers"]
    if arch in ("gemma2", "gemma3"):
        out = {"hidden_activation": "gelu_pytorch_tanh", "hidden_act": "gelu_pytorch_tanh",
               "query_pre_attn_scalar": (cfg["hidden_size"] // cfg["num_attention_heads"]
                                         if (arch, layers) in _LARGE else cfg["head_dim"]),
               "tie_word_embeddings": "output.weight" not in g.tensors}
        if md.get(f"{arch}.attention.sliding_window", 0):
            out["sliding_window"] = meta_int(md, f"{arch}.attention.sliding_window", "positions")
            out["sliding_window_pattern"] = 2 if arch == "gemma2" else meta_int(
                md, f"{arch}.attention.sliding_window_pattern", "layers", 6)
        if arch == "gemma2":
            out["attn_logit_softcapping"] = meta_float(md, "gemma2.attn_logit_softcapping", 50.0, positive=True)
            out["final_logit_softcapping"] = meta_float(md, "gemma2.final_logit_softcapping", 30.0, positive=True)
        else:
            out["rope_local_base_freq"] = meta_float(md, "gemma3.rope.freq_base_swa", 10000.0, positive=True)
            if "gemma3.final_logit_softcapping" in md:
                out["final_logit_softcapping"] = meta_float(md, "gemma3.final_logit_softcapping", MISSING,
                                                            positive=True)
        return out
    if arch == "gpt-oss":
        window = meta_int(md, "gpt-oss.attention.sliding_window", "positions")
        pattern = meta_int(md, "gpt-oss.attention.sliding_window_pattern", "layers", 2)
        out = {"sliding_window": window, "attention_bias": True, "swiglu_alpha": 1.702, "swiglu_limit": 7.0,
               "layer_types": ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
                               for i in range(layers)]}
        if cfg.get("rope_scaling", {}).get("rope_type") == "yarn":
            out["rope_scaling"] = {**cfg["rope_scaling"], "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False}
        return out
    if arch == "phi3":
        out = {}
        rot = meta_int(md, "phi3.rope.dimension_count", "head_dim", cfg["head_dim"])
        if rot != cfg["head_dim"]:
            out["partial_rotary_factor"] = rot / cfg["head_dim"]
        if md.get("phi3.attention.sliding_window", 0):  # Phi-4 writes 0: none
            out["sliding_window"] = meta_int(md, "phi3.attention.sliding_window", "positions")
        if "rope_factors_long.weight" in g.tensors:
            from ridgeline.gguf.dequant import dequantize_tensor
            factors = {k: dequantize_tensor(g, f"rope_factors_{k}.weight").flatten().tolist() for k in ("long", "short")}
            for k, f in factors.items():
                if len(f) != rot // 2:
                    raise ModelLoadError(f"rope_factors_{k}.weight has {len(f)} factors; {rot} rotary dims need "
                                         f"{rot // 2}")
            old = meta_int(md, "phi3.rope.scaling.original_context_length", "positions")
            out["original_max_position_embeddings"] = old
            out["rope_scaling"] = {"rope_type": "longrope", "long_factor": factors["long"],
                                   "short_factor": factors["short"], "original_max_position_embeddings": old}
        return out
    return {}


def shapes(arch: str, cfg: dict) -> dict[str, tuple[int, ...]]:
    """The family's tensor kinds and their shapes (torch order), for the metadata check."""
    h, hd, ffn = cfg["hidden_size"], cfg["head_dim"], cfg["intermediate_size"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    if arch in ("gemma2", "gemma3"):
        return {"post_attention_norm": (h,), "post_ffw_norm": (h,)}
    if arch == "phi3":
        return {"attn_qkv": (q + 2 * kv, h), "ffn_up": (2 * ffn, h)}
    if arch == "gpt-oss":
        return {"post_attention_norm": (h,), "attn_sinks": (cfg["num_attention_heads"],)}
    return {}
