"""Convert a GGUF file into a cached Hugging Face-format folder: config, tokenizer and a link to the file.

The folder lives in `model_cache_dir()/converted/<stem>-<key>/`, keyed by the GGUF's resolved path,
size and mtime. It is built in a temporary sibling and renamed into place, so it either exists
whole or not at all. The weights stay in the GGUF file and are read from it in place (source.py); only
`ensure_converted(..., weights=True)` writes them out as float32 safetensors, for tools that read a
folder themselves (transformers).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import uuid
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file
from tqdm.auto import tqdm

from ridgeline.errors import ModelLoadError, UnsupportedArchitectureError
from ridgeline.gguf import families
from ridgeline.gguf.dequant import check_type, dequantize_tensor
from ridgeline.gguf.meta import MISSING, check_tensors, in_file, meta_bool, meta_float, meta_index, meta_int, meta_str
from ridgeline.gguf.reader import GGUFFile, read_gguf
from ridgeline.gguf.source import write_source
from ridgeline.gguf.tokenizer import build_tokenizer, special_tokens
from ridgeline.weights import limits
from ridgeline.weights.cache_dir import model_cache_dir

_FORMAT_VERSION = 2  # bump when the converted folder's contents change (2: weights read from the file)

# general.architecture -> (HF architecture, model_type, q/k stored in llama.cpp's rope permutation);
# a "llama" file with experts (llama.expert_count) is Mixtral
ARCHITECTURES = {
    "llama": ("LlamaForCausalLM", "llama", True),
    "mistral": ("MistralForCausalLM", "mistral", True),
    "qwen2": ("Qwen2ForCausalLM", "qwen2", False),
    "qwen3": ("Qwen3ForCausalLM", "qwen3", False),
    "qwen2moe": ("Qwen2MoeForCausalLM", "qwen2_moe", False),
    "qwen3moe": ("Qwen3MoeForCausalLM", "qwen3_moe", False),
    "gemma2": ("Gemma2ForCausalLM", "gemma2", False),
    "gemma3": ("Gemma3ForCausalLM", "gemma3_text", False),
    "phi3": ("Phi3ForCausalLM", "phi3", False),
    "gpt-oss": ("GptOssForCausalLM", "gpt_oss", False),
}
MIXTRAL = ("MixtralForCausalLM", "mixtral", True)
_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate",  # [hidden] in GGUF, [1, hidden] in HF
}
# stacked experts [E, rows, cols] -> one HF tensor per expert: (Qwen name, Mixtral name)
_EXPERT_NAMES = {"ffn_gate_exps": ("gate_proj", "w1"), "ffn_up_exps": ("up_proj", "w3"),
                 "ffn_down_exps": ("down_proj", "w2")}
_LAYER_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


def _f32(x) -> float:
    # GGUF stores float32; print the shortest decimal that round-trips it (1e-05, not 9.9999997e-06).
    return float(str(np.float32(x)))


def _experts(md: dict, key: str) -> int:
    """expert_count: absent or 0 for a dense model."""
    value = md.get(key, 0)
    return 0 if type(value) is int and value == 0 else meta_int(md, key, "experts")


def hf_name(gguf_name: str, mixtral: bool = False, arch: str | None = None) -> str | None:
    """GGUF tensor name -> HF name (None for tensors the HF model has no place for). Stacked expert
    tensors name the first expert's; `hf_tensors` splits them. arch: the file's general.architecture,
    for a family's own names (gguf/families.py)."""
    base, _, suffix = gguf_name.rpartition(".")
    if base in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[base]}.{suffix}"
    m = _LAYER_RE.fullmatch(gguf_name)
    if m is None:
        return None
    mlp = "block_sparse_moe" if mixtral else "mlp"
    if m.group(2) in _EXPERT_NAMES:
        return f"model.layers.{m.group(1)}.{mlp}.experts.0.{_EXPERT_NAMES[m.group(2)][mixtral]}.{m.group(3)}"
    own = families.NAMES.get(arch, {})
    if m.group(2) in own or m.group(2) in _LAYER_NAMES:
        name = own.get(m.group(2)) or _LAYER_NAMES[m.group(2)]
        if mixtral and m.group(2) == "ffn_gate_inp":
            name = "block_sparse_moe.gate"
        if m.group(2) in families.BARE:
            return f"model.layers.{m.group(1)}.{name}"
        return f"model.layers.{m.group(1)}.{name}.{m.group(3)}"
    return None


def is_stacked_expert(gguf_name: str) -> bool:
    """A stacked [E, ...] expert tensor (ffn_{gate,up,down}_exps)."""
    m = _LAYER_RE.fullmatch(gguf_name)
    return bool(m and m.group(2) in _EXPERT_NAMES)


def hf_tensors(gguf_name: str, w: torch.Tensor, mixtral: bool, arch: str | None = None) -> dict[str, torch.Tensor]:
    """One GGUF tensor (dequantized, torch order) -> its HF tensors: stacked experts [E, ...] become
    one per expert; the shared expert's gate vector becomes a [1, hidden] matrix."""
    target = hf_name(gguf_name, mixtral, arch)
    m = _LAYER_RE.fullmatch(gguf_name)
    if m and m.group(2) in _EXPERT_NAMES:
        return {target.replace(".experts.0.", f".experts.{e}."): w[e].contiguous() for e in range(w.shape[0])}
    if m and m.group(2) == "ffn_gate_inp_shexp":
        return {target: w.reshape(1, -1)}
    return {target: families.hf_value(arch, gguf_name, w)}


def unpermute_rope(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row permutation: per head, llama.cpp interleaves the two rotary halves
    (rows 0, d/2, 1, d/2+1, ...); HF keeps them as two contiguous halves. w: [n_heads*d, ...]."""
    rest = w.shape[1:]
    half = w.shape[0] // n_heads // 2
    return w.reshape(n_heads, half, 2, *rest).transpose(1, 2).reshape(w.shape).contiguous()


def hf_config(g: GGUFFile) -> dict:
    md = g.metadata
    arch = meta_str(md, "general.architecture")
    if arch not in ARCHITECTURES:
        raise UnsupportedArchitectureError(
            f"GGUF architecture {arch!r} in {g.path} is not supported (supported: {', '.join(ARCHITECTURES)})")
    experts = _experts(md, f"{arch}.expert_count")
    if arch in ("llama", "mistral") and experts and "blk.0.ffn_gate_exps.weight" not in g.tensors:
        raise UnsupportedArchitectureError(f"{g.path} stores its experts one tensor each (an old llama.cpp "
                                           "layout); only stacked ffn_*_exps tensors are supported")
    if "rope_freqs.weight" in g.tensors:
        raise UnsupportedArchitectureError(f"{g.path} uses per-dimension rope frequency factors (Llama 3.1-style "
                                           "rope scaling), which the GGUF converter does not support yet")
    hf_arch, model_type, _ = MIXTRAL if arch == "llama" and experts else ARCHITECTURES[arch]
    hidden = meta_int(md, f"{arch}.embedding_length", "hidden")
    heads, kv_heads, head_dim = _attention(g, arch, hidden)
    t = g.tensors
    if "token_embd.weight" not in t:
        raise ModelLoadError(f"GGUF file {g.path} has no token_embd.weight")
    cfg = {
        "architectures": [hf_arch],
        "model_type": model_type,
        "vocab_size": t["token_embd.weight"].shape[0],
        "hidden_size": hidden,
        "intermediate_size": meta_int(md, f"{arch}.feed_forward_length", "intermediate",
                                      md.get(f"{arch}.expert_feed_forward_length", MISSING)),
        "num_hidden_layers": meta_int(md, f"{arch}.block_count", "layers"),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rope_theta": _f32(meta_float(md, f"{arch}.rope.freq_base", 10000.0, positive=True)),
        "rms_norm_eps": _f32(meta_float(md, f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
        "max_position_embeddings": meta_int(md, f"{arch}.context_length", "positions", 2048),
        "tie_word_embeddings": "output.weight" not in t,
        "torch_dtype": "float32",
        "use_cache": True,
    }
    for key, name in (("bos_token_id", "bos"), ("eos_token_id", "eos"), ("pad_token_id", "padding")):
        if f"tokenizer.ggml.{name}_token_id" in md:
            cfg[key] = meta_index(md, f"tokenizer.ggml.{name}_token_id")
    if experts:
        cfg.update(_moe_config(md, arch, model_type, experts))
    if not model_type.startswith("qwen2"):  # Qwen2 always has q/k/v biases; the others have a flag
        cfg["attention_bias"] = "blk.0.attn_q.bias" in t
        cfg["mlp_bias"] = "blk.0.ffn_up.bias" in t
    scaling = meta_str(md, f"{arch}.rope.scaling.type")
    if scaling in ("linear", "yarn"):
        factor = meta_float(md, f"{arch}.rope.scaling.factor", MISSING, positive=True)
        cfg["rope_scaling"] = {"rope_type": scaling, "factor": _f32(factor)}
        if scaling == "yarn":
            cfg["rope_scaling"]["original_max_position_embeddings"] = meta_int(
                md, f"{arch}.rope.scaling.original_context_length", "positions")
    elif scaling not in (None, "none"):
        raise UnsupportedArchitectureError(f"GGUF rope scaling {scaling!r} in {g.path} is not supported")
    cfg.update(families.config(g, arch, cfg))
    check_tensors(g, cfg, arch, families.shapes(arch, cfg))
    return cfg


def _attention(g: GGUFFile, arch: str, hidden: int) -> tuple[int, int, int]:
    """(query heads, KV heads, head size): KV heads dividing the query heads, an even head size."""
    keys = (f"{arch}.attention.head_count", f"{arch}.attention.head_count_kv", f"{arch}.attention.key_length")
    heads = meta_int(g.metadata, keys[0], "heads")
    kv_heads = meta_int(g.metadata, keys[1], "heads", heads)
    head_dim = meta_int(g.metadata, keys[2], "head_dim", hidden // heads)
    limits.check_heads(heads, kv_heads, head_dim, keys, f"GGUF file {g.path}")
    return heads, kv_heads, head_dim


def _moe_config(md: dict, arch: str, model_type: str, experts: int) -> dict:
    used = meta_int(md, f"{arch}.expert_used_count", "experts")
    if used > experts:
        raise ModelLoadError(f"metadata {arch}.expert_used_count = {used} is more than "
                             f"{arch}.expert_count = {experts}")
    if model_type in ("mixtral", "gpt_oss"):
        return {"num_local_experts": experts, "num_experts_per_tok": used}
    cfg = {"num_experts": experts, "num_experts_per_tok": used, "decoder_sparse_step": 1, "mlp_only_layers": [],
           "moe_intermediate_size": meta_int(md, f"{arch}.expert_feed_forward_length", "intermediate"),
           # llama.cpp renormalises Qwen3-MoE's top-k weights and not Qwen2-MoE's, unless the file says
           "norm_topk_prob": meta_bool(md, f"{arch}.expert_weights_norm", model_type == "qwen3_moe")}
    if model_type == "qwen2_moe":
        cfg["shared_expert_intermediate_size"] = meta_int(md, f"{arch}.expert_shared_feed_forward_length",
                                                          "intermediate")
    return cfg


def _state_dict(g: GGUFFile, cfg: dict, progress: bool) -> dict[str, torch.Tensor]:
    permuted = cfg["model_type"] in ("llama", "mistral", "mixtral")
    mixtral = cfg["model_type"] == "mixtral"
    heads = {"attn_q": cfg["num_attention_heads"], "attn_k": cfg["num_key_value_heads"]}
    out = {}
    total = sum(int(np.prod(i.shape)) * 4 for i in g.tensors.values())
    with tqdm(total=total, unit="B", unit_scale=True, desc=f"dequantizing {g.path.name}",
              disable=not progress, leave=False) as bar:
        arch = g.metadata["general.architecture"]
        for name, info in g.tensors.items():
            if name in families.CONSUMED:
                continue
            target = hf_name(name, mixtral, arch)
            if target is None:
                raise UnsupportedArchitectureError(f"GGUF tensor {name!r} in {g.path} has no Hugging Face counterpart")
            w = dequantize_tensor(g, name)
            m = _LAYER_RE.fullmatch(name)
            if permuted and m and m.group(2) in heads:
                w = unpermute_rope(w, heads[m.group(2)])
            out.update(hf_tensors(name, w, mixtral, arch))
            bar.update(w.numel() * 4)
    return out


def _tokenizer_files(g: GGUFFile, cfg: dict, folder: Path) -> None:
    md = g.metadata
    build_tokenizer(md).save(str(folder / "tokenizer.json"))
    tok_cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **special_tokens(md),
        "add_bos_token": meta_bool(md, "tokenizer.ggml.add_bos_token", meta_str(md, "tokenizer.ggml.model") == "llama"),
        "add_eos_token": meta_bool(md, "tokenizer.ggml.add_eos_token", False),
        "model_max_length": cfg["max_position_embeddings"],
        "clean_up_tokenization_spaces": False,
    }
    if "tokenizer.chat_template" in md:
        tok_cfg["chat_template"] = meta_str(md, "tokenizer.chat_template")
    _write_json(folder / "tokenizer_config.json", tok_cfg)
    gen = {k: cfg[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in cfg}
    _write_json(folder / "generation_config.json", gen)


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def converted_dir(gguf_path: Path) -> Path:
    """Where `ensure_converted` puts (or finds) the folder for this file; raises if it is missing."""
    try:
        resolved = Path(gguf_path).resolve(strict=True)
        st = resolved.stat()
    except OSError as e:
        raise ModelLoadError(f"GGUF file {gguf_path} cannot be read: {e.strerror or e}") from e
    key = f"{resolved}|{st.st_size}|{st.st_mtime_ns}|{_FORMAT_VERSION}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return model_cache_dir() / "converted" / f"{resolved.stem}-{digest}"


def ensure_converted(gguf_path: str | Path, progress: bool = True, weights: bool = False) -> Path:
    """Return a Hugging Face-format folder for `gguf_path`, converting it on first use. weights: also
    write the dequantized float32 weights into it (`model.safetensors`), for a reader other than
    Ridgeline's loader; without them the folder reads its weights from the file (source.py)."""
    final = converted_dir(Path(gguf_path))
    if (final / "config.json").is_file():
        if weights and not (final / "model.safetensors").is_file():
            _write_weights(gguf_path, final, progress)
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    g = read_gguf(gguf_path)
    # os.mkdir (unlike mkdtemp's 0700) honours the umask, so a shared cache stays readable.
    tmp = final.parent / f".{final.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    tmp.mkdir()
    try:
        try:
            cfg = hf_config(g)
            for name, info in g.tensors.items():  # every type named now, not when the model is built
                check_type(info.qtype, name)
            _tokenizer_files(g, cfg, tmp)
            if weights:
                _save_state(g, cfg, tmp / "model.safetensors", progress)
        except ModelLoadError as e:  # metadata and tensor errors name the key or tensor; add the file
            raise in_file(e, g.path) from None
        write_source(tmp, Path(gguf_path))
        _write_json(tmp / "config.json", cfg)
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / "config.json").is_file():  # another process did not win the race
                raise
    finally:
        g.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _save_state(g: GGUFFile, cfg: dict, path: Path, progress: bool) -> None:
    state = _state_dict(g, cfg, progress)
    save_file(state, str(path), metadata={"format": "pt"})
    del state
    os.chmod(path, path.parent.stat().st_mode & 0o666)


def _write_weights(gguf_path: str | Path, folder: Path, progress: bool) -> None:
    """Add the float32 weights to an existing folder, written beside it and renamed into place."""
    g = read_gguf(gguf_path)
    tmp = folder / f".model.{os.getpid()}.{uuid.uuid4().hex[:8]}.safetensors.tmp"
    try:
        try:
            _save_state(g, json.loads((folder / "config.json").read_text(encoding="utf-8")), tmp, progress)
        except ModelLoadError as e:
            raise in_file(e, g.path) from None
        os.replace(tmp, folder / "model.safetensors")
    finally:
        g.close()
        tmp.unlink(missing_ok=True)
