"""`ridgeline bench random-model`: write a randomly initialised HF folder with a published model's
layer structure and its widths divided down, for benchmarks on machines without the real weights.

The expert count, top-k, renormalisation, layer kinds and head grouping stay those of the model
named by --like; hidden, head and MLP widths are divided by --divide, the layer count is --layers,
and the tokenizer is byte-level (vocabulary 384), so the LM head is small and the experts dominate,
unless --tokenizer names a folder whose tokenizer files (and vocabulary size) to use instead (a
tokenizer llama.cpp's converter recognises, to run the folder there too). Built with transformers
(a benchmark dependency), saved as safetensors with a chat template. gpt-oss-20b is written as
OpenAI's checkpoints are, without building the model: bf16 tensors and the experts as MXFP4 blocks
(random codes, exponents around 2^-7), so full widths fit in memory.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ridgeline.cli_parser import positive_int

PRESETS = {  # published configs (config.json of each model)
    "qwen3-30b-a3b": ("Qwen3MoeConfig", dict(hidden_size=2048, num_attention_heads=32, num_key_value_heads=4,
                                            head_dim=128, intermediate_size=6144, moe_intermediate_size=768,
                                            num_experts=128, num_experts_per_tok=8, norm_topk_prob=True,
                                            num_hidden_layers=48, rope_theta=1e6, rms_norm_eps=1e-6)),
    "mixtral-8x7b": ("MixtralConfig", dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8,
                                           head_dim=128, intermediate_size=14336, num_local_experts=8,
                                           num_experts_per_tok=2, num_hidden_layers=32, rope_theta=1e6,
                                           rms_norm_eps=1e-5)),
    "qwen1.5-moe-a2.7b": ("Qwen2MoeConfig", dict(hidden_size=2048, num_attention_heads=16, num_key_value_heads=16,
                                                 intermediate_size=5632, moe_intermediate_size=1408,
                                                 shared_expert_intermediate_size=5632, num_experts=60,
                                                 num_experts_per_tok=4, norm_topk_prob=False, num_hidden_layers=24,
                                                 rope_theta=1e6, rms_norm_eps=1e-6)),
    "gpt-oss-20b": ("GptOssConfig", dict(hidden_size=2880, num_attention_heads=64, num_key_value_heads=8,
                                         head_dim=64, intermediate_size=2880, num_local_experts=32,
                                         num_experts_per_tok=4, num_hidden_layers=24, sliding_window=128,
                                         rms_norm_eps=1e-5)),
}
KEEP_HEAD_DIM = {"gpt-oss-20b"}  # heads x head_dim is not the hidden size: the head size stays, heads scale
WIDTHS = ("hidden_size", "intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size")
CHAT = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def scaled_config(like: str, divide: int, layers: int) -> tuple[str, dict]:
    cls, cfg = PRESETS[like]
    cfg = dict(cfg, num_hidden_layers=layers, vocab_size=384, max_position_embeddings=4096,
               tie_word_embeddings=False, initializer_range=0.02)
    for key in WIDTHS:
        if key in cfg:
            cfg[key] = max(16, cfg[key] // divide)
            if like in KEEP_HEAD_DIM:  # MXFP4 blocks of 32 along every input width
                cfg[key] = max(64, cfg[key] // 64 * 64)
    group = cfg["num_attention_heads"] // cfg["num_key_value_heads"]
    cfg["num_key_value_heads"] = max(1, cfg["num_key_value_heads"] // divide)
    cfg["num_attention_heads"] = cfg["num_key_value_heads"] * group if divide > 1 else cfg["num_attention_heads"]
    if like not in KEEP_HEAD_DIM:
        cfg["head_dim"] = cfg["hidden_size"] // cfg["num_attention_heads"]
    return cls, cfg


def _tokenizer(out: Path, source: str | None) -> int:
    """Writes the tokenizer files; returns the vocabulary size."""
    if source is not None:
        import shutil
        from tokenizers import Tokenizer
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(Path(source) / name, out / name)
        return Tokenizer.from_file(str(out / "tokenizer.json")).get_vocab_size()
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel
    vocab = {ch: i for i, ch in enumerate(sorted(ByteLevel.alphabet()))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "chat_template": CHAT, "add_bos_token": False}))
    return 384


def _mxfp4_checkpoint(out: Path, cls: str, cfg: dict, seed: int) -> int:
    """gpt-oss as its released checkpoints are: bf16 tensors, the experts' weights as MXFP4 blocks."""
    import torch
    import transformers
    from safetensors.torch import save_file
    config = getattr(transformers, cls)(**cfg, bos_token_id=257, eos_token_id=258)
    config.architectures = ["GptOssForCausalLM"]
    config.quantization_config = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    config.save_pretrained(out)
    g = torch.Generator().manual_seed(seed)
    h, hd, E, inter = cfg["hidden_size"], cfg["head_dim"], cfg["num_local_experts"], cfg["intermediate_size"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd

    def dense(*shape, std=0.02):
        return (torch.randn(*shape, generator=g) * std).to(torch.bfloat16)

    t = {"model.embed_tokens.weight": dense(cfg["vocab_size"], h), "lm_head.weight": dense(cfg["vocab_size"], h),
         "model.norm.weight": torch.ones(h, dtype=torch.bfloat16)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t |= {p + "input_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
              p + "post_attention_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
              p + "self_attn.sinks": dense(cfg["num_attention_heads"], std=1.0)}
        for name, rows, cols in (("q_proj", q, h), ("k_proj", kv, h), ("v_proj", kv, h), ("o_proj", h, q)):
            t[p + f"self_attn.{name}.weight"], t[p + f"self_attn.{name}.bias"] = dense(rows, cols), dense(rows)
        t[p + "mlp.router.weight"], t[p + "mlp.router.bias"] = dense(E, h), dense(E)
        for name, rows, cols in (("gate_up_proj", 2 * inter, h), ("down_proj", h, inter)):
            t[p + f"mlp.experts.{name}_blocks"] = torch.randint(0, 256, (E, rows, cols // 32, 16), generator=g,
                                                                dtype=torch.uint8)
            t[p + f"mlp.experts.{name}_scales"] = torch.randint(117, 123, (E, rows, cols // 32), generator=g,
                                                                dtype=torch.uint8)
            t[p + f"mlp.experts.{name}_bias"] = dense(E, rows)
    save_file(t, str(out / "model.safetensors"), metadata={"format": "pt"})
    return sum(v.numel() * (2 if k.endswith("_blocks") else 1) for k, v in t.items())


def cmd_random_model(args: argparse.Namespace) -> int:
    import torch
    import transformers
    cls, cfg = scaled_config(args.like, args.divide, args.layers)
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    cfg["vocab_size"] = _tokenizer(out, getattr(args, "tokenizer", None))
    torch.manual_seed(args.seed)
    if cls == "GptOssConfig":
        params = _mxfp4_checkpoint(out, cls, cfg, args.seed)
        print(f"wrote {out}: {cls} like {args.like} (MXFP4 experts), widths / {args.divide}, {args.layers} layers, "
              f"{params / 1e6:.1f} M params", file=sys.stderr)
        return 0
    config = getattr(transformers, cls)(**cfg, bos_token_id=257, eos_token_id=258)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(out)
    params = sum(p.numel() for p in model.parameters())
    print(f"wrote {out}: {cls} like {args.like}, widths / {args.divide}, {args.layers} layers, "
          f"{params / 1e6:.1f} M params", file=sys.stderr)
    return 0


def add_random_model_parser(bsub) -> argparse.ArgumentParser:
    p = bsub.add_parser("random-model", help="write a random-weight model with a published model's structure, "
                                             "widths divided down",
                        description=__doc__.split("\n\n")[0])
    p.add_argument("output", help="folder to write (HF layout)")
    p.add_argument("--like", default="qwen3-30b-a3b", choices=sorted(PRESETS), help="whose structure")
    p.add_argument("--divide", type=positive_int, default=8, help="divide hidden, head and MLP widths by this")
    p.add_argument("--layers", type=positive_int, default=12, help="decoder layers")
    p.add_argument("--seed", type=int, default=0, help="torch seed of the random weights")
    p.add_argument("--tokenizer", metavar="FOLDER", default=None,
                   help="copy tokenizer.json and tokenizer_config.json from this folder (its vocabulary size); "
                        "default: a byte-level one of 384 tokens")
    p.set_defaults(func=cmd_random_model)
    return p
