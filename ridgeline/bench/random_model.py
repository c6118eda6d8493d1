"""`ridgeline bench random-model`: write a randomly initialised HF folder with a published model's
layer structure and its widths divided down, for benchmarks on machines without the real weights.

The expert count, top-k, renormalisation, layer kinds and head grouping stay those of the model
named by --like; hidden, head and MLP widths are divided by --divide, the layer count is --layers,
and the tokenizer is byte-level (vocabulary 384), so the LM head is small and the experts dominate.
Built with transformers (a benchmark dependency), saved as safetensors with a chat template.
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
}
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
    group = cfg["num_attention_heads"] // cfg["num_key_value_heads"]
    cfg["num_key_value_heads"] = max(1, cfg["num_key_value_heads"] // divide)
    cfg["num_attention_heads"] = cfg["num_key_value_heads"] * group if divide > 1 else cfg["num_attention_heads"]
    cfg["head_dim"] = cfg["hidden_size"] // cfg["num_attention_heads"]
    return cls, cfg


def _tokenizer(out: Path) -> None:
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


def cmd_random_model(args: argparse.Namespace) -> int:
    import torch
    import transformers
    cls, cfg = scaled_config(args.like, args.divide, args.layers)
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)
    config = getattr(transformers, cls)(**cfg, bos_token_id=257, eos_token_id=258)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(out)
    _tokenizer(out)
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
    p.set_defaults(func=cmd_random_model)
    return p
