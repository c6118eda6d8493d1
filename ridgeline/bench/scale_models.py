"""The size ladder's models (`ridgeline bench scale`): random-weight checkpoints of published dense shapes at
full width and each model's own vocabulary, written tensor by tensor as bf16 safetensors shards, so an 8B
model never sits in memory whole. The tokenizer is a real one (the default model's, 49,152 tokens, unless
given): the embedding and LM head keep the model's vocabulary, the ids past the tokenizer's are never
produced (llama.cpp's converter names them [PAD...]), so the head costs what the real model's costs."""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

SHARD_BYTES = 1 << 30  # tensors per safetensors shard, at most about this many bytes


@dataclass(frozen=True)
class Shape:
    architecture: str
    model_type: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    tied: bool
    rope_theta: float
    qkv_bias: bool = False
    head_size: int = 0  # 0: hidden // heads
    gemma3: bool = False  # Gemma 3's layer: q/k norms, sandwich norms, norms stored as w in (1 + w)

    @property
    def head_dim(self) -> int:
        return self.head_size or self.hidden // self.heads

    def tensors(self) -> list[tuple[str, tuple[int, ...]]]:
        """(name, shape) of every tensor, in checkpoint order."""
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        out = [("model.embed_tokens.weight", (self.vocab, h))]
        for i in range(self.layers):
            p = f"model.layers.{i}."
            out += [(p + "input_layernorm.weight", (h,)), (p + "post_attention_layernorm.weight", (h,)),
                    (p + "self_attn.q_proj.weight", (q, h)), (p + "self_attn.k_proj.weight", (kv, h)),
                    (p + "self_attn.v_proj.weight", (kv, h)), (p + "self_attn.o_proj.weight", (h, q)),
                    (p + "mlp.gate_proj.weight", (self.ffn, h)), (p + "mlp.up_proj.weight", (self.ffn, h)),
                    (p + "mlp.down_proj.weight", (h, self.ffn))]
            if self.qkv_bias:
                out += [(p + "self_attn.q_proj.bias", (h,)), (p + "self_attn.k_proj.bias", (kv,)),
                        (p + "self_attn.v_proj.bias", (kv,))]
            if self.gemma3:
                out += [(p + "pre_feedforward_layernorm.weight", (h,)), (p + "post_feedforward_layernorm.weight", (h,)),
                        (p + "self_attn.q_norm.weight", (self.head_dim,)),
                        (p + "self_attn.k_norm.weight", (self.head_dim,))]
        out.append(("model.norm.weight", (h,)))
        if not self.tied:
            out.append(("lm_head.weight", (self.vocab, h)))
        return out

    @property
    def params(self) -> int:
        n = 0
        for _, shape in self.tensors():
            size = 1
            for d in shape:
                size *= d
            n += size
        return n

    def config(self) -> dict:
        if self.gemma3:  # Gemma 3 text: five local layers (512-token window, base 10k) to a global one
            return {"architectures": [self.architecture], "model_type": self.model_type, "hidden_size": self.hidden,
                    "num_hidden_layers": self.layers, "num_attention_heads": self.heads,
                    "num_key_value_heads": self.kv_heads, "head_dim": self.head_dim, "intermediate_size": self.ffn,
                    "vocab_size": self.vocab, "tie_word_embeddings": self.tied, "rope_theta": self.rope_theta,
                    "rope_local_base_freq": 10000.0, "sliding_window": 512, "query_pre_attn_scalar": self.head_dim,
                    "layer_types": ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
                                    for i in range(self.layers)],
                    "rms_norm_eps": 1e-6, "max_position_embeddings": 32768,
                    "hidden_activation": "gelu_pytorch_tanh", "torch_dtype": "bfloat16", "bos_token_id": 1,
                    "eos_token_id": 2, "pad_token_id": 0, "initializer_range": 0.02}
        return {"architectures": [self.architecture], "model_type": self.model_type, "hidden_size": self.hidden,
                "num_hidden_layers": self.layers, "num_attention_heads": self.heads,
                "num_key_value_heads": self.kv_heads, "intermediate_size": self.ffn, "vocab_size": self.vocab,
                "tie_word_embeddings": self.tied, "rope_theta": self.rope_theta, "rms_norm_eps": 1e-5,
                "max_position_embeddings": 8192, "hidden_act": "silu", "torch_dtype": "bfloat16",
                "bos_token_id": 1, "eos_token_id": 2, "initializer_range": 0.02}


SHAPES = {  # published configs (config.json of each model), random weights
    "llama-3.2-1b": Shape("LlamaForCausalLM", "llama", 2048, 16, 32, 8, 8192, 128256, True, 500000.0),
    "qwen2.5-3b": Shape("Qwen2ForCausalLM", "qwen2", 2048, 36, 16, 2, 11008, 151936, True, 1e6, qkv_bias=True),
    "llama-3.1-8b": Shape("LlamaForCausalLM", "llama", 4096, 32, 32, 8, 14336, 128256, False, 500000.0),
    "gemma-3-270m": Shape("Gemma3ForCausalLM", "gemma3_text", 640, 18, 4, 1, 2048, 262144, True, 1e6, head_size=256,
                          gemma3=True),
    "tiny": Shape("LlamaForCausalLM", "llama", 256, 2, 4, 2, 512, 49152, True, 10000.0),  # the ladder's own test
}


def write_checkpoint(shape: Shape, out: Path, tokenizer: Path, seed: int = 0) -> Path:
    """The HF folder of `shape` with random bf16 weights (norms 1) and tokenizer's files, written into a
    temporary sibling and renamed into place; an existing complete folder is reused."""
    import torch
    from safetensors.torch import save_file

    if (out / "model.safetensors.index.json").is_file():
        return out
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    gen = torch.Generator().manual_seed(seed)
    shard: dict = {}
    shard_bytes, files, index = 0, [], {}

    def flush():
        nonlocal shard, shard_bytes
        if shard:
            name = f"model-{len(files) + 1:05d}.safetensors"
            save_file(shard, str(tmp / name), metadata={"format": "pt"})
            files.append(name)
            index.update({k: name for k in shard})
            shard, shard_bytes = {}, 0

    for name, dims in shape.tensors():
        if name.endswith("norm.weight"):  # a scale of 1: Gemma stores w of (1 + w)
            t = (torch.zeros if shape.gemma3 else torch.ones)(dims, dtype=torch.bfloat16)
        else:
            t = (torch.randn(dims, generator=gen) * 0.02).to(torch.bfloat16)
        if shard_bytes + t.numel() * 2 > SHARD_BYTES:
            flush()
        shard[name] = t
        shard_bytes += t.numel() * 2
    flush()
    (tmp / "config.json").write_text(json.dumps(shape.config(), indent=1))
    (tmp / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    shutil.copy(tokenizer / "tokenizer_config.json", tmp / "tokenizer_config.json")
    _write_tokenizer(tokenizer / "tokenizer.json", tmp / "tokenizer.json", shape.vocab if shape.gemma3 else 0)
    (tmp / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": shape.params * 2}, "weight_map": index}, indent=1))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def _write_tokenizer(src: Path, dst: Path, pad_to: int) -> None:
    """The tokenizer, with added tokens `<unusedN>` up to pad_to ids when given: Gemma's converter keeps only the
    embedding rows its tokenizer names, so the padding keeps the model's whole vocabulary (and its LM head's cost)."""
    if not pad_to:
        shutil.copy(src, dst)
        return
    tok = json.loads(src.read_text())
    n = max([*tok["model"]["vocab"].values(), *(a["id"] for a in tok["added_tokens"])]) + 1
    tok["added_tokens"] += [{"id": i, "content": f"<unused{i - n}>", "single_word": False, "lstrip": False,
                             "rstrip": False, "normalized": False, "special": True} for i in range(n, pad_to)]
    dst.write_text(json.dumps(tok))


OWN_TOKENIZER_CLASS = {"qwen2"}  # transformers' per-type tokenizer classes that ignore tokenizer.json's pre-tokenizer


def converter_view(folder: Path, shape: Shape, work: Path) -> Path:
    """The folder llama.cpp's converter reads: `folder` itself, or for a model type whose tokenizer class
    transformers builds from its own code (Qwen2's: its own pre-tokenizer over our tokenizer's vocabulary, which
    the converter then cannot name), a view of links to its files whose config names the Llama type, so the
    tokenizer loads as tokenizer.json says. The converter picks its model class by `architectures`, unchanged."""
    if shape.model_type not in OWN_TOKENIZER_CLASS:
        return folder
    view = work / f"{folder.name}.converter-view"
    view.mkdir(exist_ok=True)
    for f in folder.iterdir():
        link = view / f.name
        if f.name != "config.json" and not link.exists():
            link.symlink_to(f.resolve())
    cfg = json.loads((folder / "config.json").read_text())
    (view / "config.json").write_text(json.dumps({**cfg, "model_type": "llama"}, indent=1))
    return view


def default_tokenizer() -> Path:
    """The default model's tokenizer files (its converted folder)."""
    from ridgeline.gguf.convert import ensure_converted
    from ridgeline.weights.pull import resolve_alias
    return ensure_converted(resolve_alias("smollm2-135m"), progress=False)
