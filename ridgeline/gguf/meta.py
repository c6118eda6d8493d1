"""Typed reads of a GGUF file's metadata (md: `read_gguf(path).metadata`), and the check that the model
it describes matches the file's tensors.

A value of the wrong type (a string where a count belongs, an array where a flag does) or out of range
is a ModelLoadError naming the key and the value, raised where the value is read.
"""
from __future__ import annotations

import re

import numpy as np

from ridgeline.errors import ModelLoadError, UnsupportedArchitectureError
from ridgeline.weights import limits

MISSING = object()  # a default that makes an absent key an error
_LAYER = re.compile(r"blk\.(\d+)\.")
_TENSOR = re.compile(r"blk\.\d+\.(\w+)\.(weight|bias)")


def in_file(e: ModelLoadError, path) -> ModelLoadError:
    """A metadata error (it names the key) as raised for the file it came from."""
    return e if str(path) in e.message else type(e)(f"GGUF file {path}: {e.message}", e.param, e.code)


def _get(md: dict, key: str, default):
    value = md.get(key, default)
    if value is MISSING:
        raise ModelLoadError(f"metadata lacks {key}")
    return value


def meta_int(md: dict, key: str, kind: str, default=MISSING) -> int:
    """A size in 1..limits.LIMITS[kind]."""
    value = _get(md, key, default)
    if isinstance(value, np.ndarray):
        raise UnsupportedArchitectureError(f"GGUF {key} varies per layer, which Ridgeline does not support")
    return limits.checked_int(value, key, kind, "metadata")


def meta_index(md: dict, key: str, default=None) -> int | None:
    value = md.get(key, default)
    return None if value is None else limits.checked_index(value, key, "metadata")


def meta_float(md: dict, key: str, default, positive: bool = False) -> float:
    return limits.checked_float(_get(md, key, default), key, "metadata", positive)


def meta_str(md: dict, key: str, default=None) -> str | None:
    value = md.get(key, default)
    if value is not None and not isinstance(value, str):
        raise ModelLoadError(f"metadata {key} is {limits.describe(value)}, not a string")
    return value


def meta_bool(md: dict, key: str, default: bool) -> bool:
    value = md.get(key, default)
    if isinstance(value, (bool, np.bool_)) or (isinstance(value, int) and value in (0, 1)):
        return bool(value)
    raise ModelLoadError(f"metadata {key} is {limits.describe(value)}, not a boolean")


def meta_strings(md: dict, key: str) -> list[str] | None:
    value = md.get(key)
    if value is not None and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
        raise ModelLoadError(f"metadata {key} is {limits.describe(value)}, not an array of strings")
    return value


def meta_numbers(md: dict, key: str, length: int) -> np.ndarray | None:
    """A numeric array with one entry per token (`length` of them)."""
    value = md.get(key)
    if value is None:
        return None
    if not isinstance(value, np.ndarray) or value.dtype.kind not in "iuf":
        raise ModelLoadError(f"metadata {key} is {limits.describe(value)}, not a numeric array")
    if len(value) != length:
        raise ModelLoadError(f"metadata {key} has {len(value)} entries for {length} tokens")
    return value


def check_tensors(g, cfg: dict, arch: str, family_shapes: dict | None = None) -> None:
    """The sizes the metadata gives match the file's tensors: the model built from them reads no more
    than the file holds. cfg: the HF config hf_config made from g; family_shapes: the architecture's own
    tensor kinds and shapes (gguf/families.py), over the Llama-shaped ones."""
    t, where_ = g.tensors, f"GGUF file {g.path}"
    embd = t["token_embd.weight"].shape
    for name in ("token_embd.weight", "output.weight"):
        if name in t and (len(t[name].shape) != 2 or t[name].shape != (embd[0], cfg["hidden_size"])):
            raise ModelLoadError(f"{where_}: {name} has shape {list(t[name].shape)}, but {arch}.embedding_length "
                                 f"is {cfg['hidden_size']}")
    if "output_norm.weight" in t and t["output_norm.weight"].shape != (cfg["hidden_size"],):
        raise ModelLoadError(f"{where_}: output_norm.weight has shape {list(t['output_norm.weight'].shape)}, but "
                             f"{arch}.embedding_length is {cfg['hidden_size']}")
    vocab = limits.checked_int(embd[0], "the vocabulary size (rows of token_embd.weight)", "vocab", where_)
    tokens = g.metadata.get("tokenizer.ggml.tokens")
    if isinstance(tokens, list) and len(tokens) > vocab:  # a token id past the table would index outside it
        raise ModelLoadError(f"{where_}: tokenizer.ggml.tokens has {len(tokens)} tokens, more than the {vocab} rows "
                             "of token_embd.weight")
    layers = {int(m.group(1)) for name in t if (m := _LAYER.match(name))}
    n = cfg["num_hidden_layers"]
    if layers != set(range(n)):
        extra = sorted(layers - set(range(n)))
        raise ModelLoadError(f"{where_}: {arch}.block_count is {n}, but the file has tensors for "
                             + (f"layer {extra[0]}" if extra else f"{len(layers)} layers"))
    want = _shapes(cfg) | (family_shapes or {})
    for name, info in t.items():
        m = _TENSOR.fullmatch(name)
        kind = m and want.get(m.group(1))
        if kind is None:
            continue  # the converter places (or refuses) the rest
        shape = kind[:-1] if m.group(2) == "bias" and len(kind) > 1 else kind  # a weight's rows (per expert)
        if info.shape != shape:
            raise ModelLoadError(f"{where_}: {name} has shape {list(info.shape)}, but the metadata ({arch}.*) "
                                 f"describe {list(shape)}")


def _shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    """Layer tensor kind -> the shape (torch order) the config calls for; a bias has the weight's rows."""
    h, hd, ffn = cfg["hidden_size"], cfg["head_dim"], cfg["intermediate_size"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    out = {"attn_norm": (h,), "ffn_norm": (h,), "attn_q_norm": (hd,), "attn_k_norm": (hd,), "attn_q": (q, h),
           "attn_k": (kv, h), "attn_v": (kv, h), "attn_output": (h, q), "ffn_gate": (ffn, h), "ffn_up": (ffn, h),
           "ffn_down": (h, ffn)}
    experts = cfg.get("num_experts") or cfg.get("num_local_experts")
    if experts:
        e_ffn = cfg.get("moe_intermediate_size", ffn)
        out |= {"ffn_gate_inp": (experts, h), "ffn_gate_exps": (experts, e_ffn, h), "ffn_up_exps": (experts, e_ffn, h),
                "ffn_down_exps": (experts, h, e_ffn)}
    shared = cfg.get("shared_expert_intermediate_size")
    if shared:
        out |= {"ffn_gate_shexp": (shared, h), "ffn_up_shexp": (shared, h), "ffn_down_shexp": (h, shared),
                "ffn_gate_inp_shexp": (h,)}
    return out
