"""`ridgeline train-draft MODEL --out DIR --tokens N --seed S`: train an EAGLE-style draft head for
MODEL on its own sampled replies (spec/train_data.py), on this machine's CPU, and save it as a folder
for `--speculative-method eagle --draft-model DIR`."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from ridgeline.cli_parser import non_negative_int, positive_int


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "train-draft", help="train an EAGLE-style draft head for a model on its own sampled replies",
        description=__doc__ + "\nPrompts: the shipped public-domain seeds (every template x topic in "
                              "ridgeline/spec/prompts/), shuffled by --seed.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", metavar="MODEL", help="HF folder, .gguf file, hub id or built-in alias")
    p.add_argument("--out", type=Path, required=True, metavar="DIR",
                   help="folder to write the head to (required, no default)")
    p.add_argument("--tokens", type=positive_int, default=300_000, metavar="N",
                   help="tokens of self-distillation data (prompt + reply), default 300000")
    p.add_argument("--seed", type=int, default=0, metavar="S", help="prompt order, sampling and initialisation")
    p.add_argument("--epochs", type=float, default=2.0, metavar="E", help="passes over the data (default 2)")
    p.add_argument("--draft-vocab", type=non_negative_int, default=8192, metavar="K",
                   help="draft over the K most frequent tokens of the data (FR-Spec); 0: the whole vocabulary "
                        "(default 8192)")
    p.add_argument("--max-reply-tokens", type=positive_int, default=256, metavar="N",
                   help="longest reply sampled per prompt (default 256)")
    p.add_argument("--temperature", type=float, default=0.8, metavar="T", help="sampling temperature (default 0.8)")
    p.add_argument("--lr", type=float, default=1e-3, metavar="LR", help="peak learning rate (default 1e-3)")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                   help="the target's dtype while generating the data (default: auto)")
    p.add_argument("--save-dtype", default="bfloat16", choices=["bfloat16", "float32"],
                   help="dtype of the saved weights (default bfloat16)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_train_draft)


def cmd_train_draft(args: argparse.Namespace) -> int:
    from ridgeline.entrypoints.llm import LLM
    from ridgeline.spec.eagle_io import head_config_for, head_rows, save_head, target_fingerprint
    from ridgeline.spec.train_data import frequent_tokens, self_distill
    from ridgeline.spec.train_head import train_head
    t0 = time.perf_counter()
    llm = LLM(args.model, dtype=args.dtype, progress=not args.quiet, kv_cache_memory="256MiB")
    print(llm.info.summary(), file=sys.stderr)
    eng, lm = llm.engine, llm.engine.runner.model
    samples = list(self_distill(llm, args.tokens, args.seed, args.max_reply_tokens, args.temperature,
                                progress=not args.quiet))
    t_data = time.perf_counter() - t0
    vocab_ids = frequent_tokens(samples, args.draft_vocab, lm.cfg.vocab_size, tuple(sorted(eng.eos_ids)))
    rows = head_rows(lm, vocab_ids if vocab_ids is not None else torch.arange(lm.cfg.vocab_size))
    head, stats = train_head(lambda ids: lm.model.embed(ids), rows, samples, head_config_for(lm), args.epochs,
                             args.seed, lr=args.lr, progress=not args.quiet)
    training = {"command": f"ridgeline train-draft {args.model} --out DIR --tokens {args.tokens} --seed {args.seed} "
                           f"--epochs {args.epochs:g} --draft-vocab {args.draft_vocab} --max-reply-tokens "
                           f"{args.max_reply_tokens} --temperature {args.temperature:g} --lr {args.lr:g} "
                           f"--dtype {args.dtype}",
                "samples": len(samples), "tokens": int(sum(len(s.tokens) for s in samples)),
                "data_seconds": round(t_data), "train_seconds": round(time.perf_counter() - t0 - t_data),
                "final_loss": round(stats["loss"], 4), "final_top1_agreement": round(stats["top1"], 4),
                "steps": stats["steps"]}
    save_head(args.out, head, target_fingerprint(lm), vocab_ids, training, getattr(torch, args.save_dtype))
    n = sum(p.numel() for p in head.parameters())
    print(f"wrote {args.out}: {n / 1e6:.2f}M parameters, draft vocabulary "
          f"{lm.cfg.vocab_size if vocab_ids is None else len(vocab_ids)}, {training['tokens']} tokens of data, "
          f"top-1 agreement with the target on it {stats['top1']:.2f}")
    return 0
