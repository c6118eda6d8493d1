"""`ridgeline train-draft`'s work (speculative/cli.py has its flags): each --data source's samples (cached in
--data-cache as they are gathered), the head trained on them, its copy pointer, the saved folder."""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

import torch

from ridgeline.errors import InvalidRequestError
from ridgeline.speculative.train_data import Sample


def _gather(eng, args: argparse.Namespace) -> list:
    """The samples of every --data source, each up to --tokens tokens."""
    samples = []
    for src in args.data:
        key = {"source": src, "seed": args.seed, "dtype": args.dtype}
        if src == "replies" or src.startswith("tasks:"):
            key.update(max_reply_tokens=args.max_reply_tokens, temperature=args.temperature)
        cache = None
        if args.data_cache is not None:
            name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
            cache = _Cache(args.data_cache / f"{src.partition(':')[0]}-{name}.pt", key)
        samples += _source_samples(eng, args, src, cache)
    return samples


class _Cache:
    """One source's samples on disk, in the order the source yields them (saved once SAVE_EVERY new
    samples or a quarter more than the last save hold, so a stopped run keeps most of what it
    gathered and rewriting the file costs a bounded share of the run). Every source yields the same
    samples in the same order for a seed, so a later run asking for more tokens continues where this
    one stopped."""
    SAVE_EVERY = 16

    def __init__(self, path: Path, key: dict):
        self.path, self.key = path, key
        self.samples = [Sample(t, h) for t, h in torch.load(path, weights_only=True)["samples"]] if path.is_file() else []
        self.saved = len(self.samples)

    def add(self, sample: Sample) -> None:
        self.samples.append(sample)
        if len(self.samples) - self.saved >= max(self.SAVE_EVERY, self.saved // 4):
            self.save()

    def save(self) -> None:
        self.saved = len(self.samples)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        torch.save({"key": self.key, "samples": [(s.tokens, s.hidden) for s in self.samples]}, tmp)
        tmp.replace(self.path)


def _take(samples, num_tokens: int) -> list:
    out, done = [], 0
    for s in samples:
        if done >= num_tokens:
            break
        out.append(s)
        done += len(s.tokens)
    return out


def _source_samples(eng, args: argparse.Namespace, src: str, cache: _Cache | None) -> list:
    from ridgeline.speculative.train_data import doc_task_prompts, self_distill
    from ridgeline.speculative.train_text import paragraphs, resolve_text, source_sequences, teacher_forced
    have = _take(cache.samples, args.tokens) if cache else []
    have_tokens = sum(len(s.tokens) for s in have)
    if have_tokens >= args.tokens:
        return have
    if src == "replies":
        new = self_distill(eng, args.tokens - have_tokens, args.seed, args.max_reply_tokens, args.temperature,
                           batch=64, progress=not args.quiet, start=len(have))
    elif src.startswith("tasks:"):
        prompts = doc_task_prompts(paragraphs(resolve_text(src.partition(":")[2])), args.seed)
        new = self_distill(eng, args.tokens - have_tokens, args.seed, args.max_reply_tokens, args.temperature,
                           batch=64, progress=not args.quiet, start=len(have), prompts=prompts, desc=src)
    else:
        seqs = source_sequences(eng.tokenizer, src, args.seed, min(512, eng.max_model_len))
        new = teacher_forced(eng, seqs[len(have):], args.tokens - have_tokens, src, progress=not args.quiet)
    out = list(have)
    for s in new:
        out.append(s)
        if cache is not None and len(out) > len(cache.samples):
            cache.add(s)
    if cache is not None and cache.saved < len(cache.samples):
        cache.save()
    return out


def run(args: argparse.Namespace) -> int:
    """The command: gather the data, train the head (and its copy pointer), save it."""
    from ridgeline.engine.run import start_engine
    from ridgeline.speculative.eagle_io import head_config_for, head_rows, load_head, save_head, target_fingerprint
    from ridgeline.speculative.eagle_pointer import train_pointer
    from ridgeline.speculative.train_data import frequent_tokens
    from ridgeline.speculative.train_head import train_head
    from ridgeline.utils.device import pick_dtype
    if args.from_head is not None and args.copy_pointer == 0:
        raise InvalidRequestError("--from-head trains only a copy pointer: give --copy-pointer D > 0", "copy_pointer")
    t0 = time.perf_counter()
    eng = start_engine(args.model, dtype=args.dtype, progress=not args.quiet, kv_cache_memory="512MiB")
    print(eng.info.summary(), file=sys.stderr)
    lm = eng.runner.model
    if args.from_head is not None:  # refused here, before any data is gathered, if trained for another model
        head, vocab_ids, old = load_head(args.from_head, lm)
        training = old["training"]
    args.data = args.data or ["replies"]
    samples = _gather(eng, args)
    t_data = time.perf_counter() - t0
    bf16 = pick_dtype("auto", torch.device("cpu")).dtype == torch.bfloat16
    if args.from_head is None:
        vocab_ids = frequent_tokens(samples, args.draft_vocab, lm.cfg.vocab_size, tuple(sorted(eng.eos_ids)))
    rows = head_rows(lm, vocab_ids if vocab_ids is not None else torch.arange(lm.cfg.vocab_size))
    if args.from_head is None:
        head, stats = train_head(_embed_fn(lm), rows, samples, head_config_for(lm), args.epochs,
                                 args.seed, lr=args.lr, batch_tokens=args.batch_tokens, ce_weight=args.ce_weight,
                                 feature_weight=args.feature_weight, unroll=args.unroll, bf16=bf16,
                                 progress=not args.quiet)
        training = {"command": f"ridgeline train-draft {args.model} --out DIR {_data_flags(args)}--tokens {args.tokens} "
                               f"--seed {args.seed} --epochs {args.epochs:g} --draft-vocab {args.draft_vocab} "
                               f"--max-reply-tokens {args.max_reply_tokens} --temperature {args.temperature:g} "
                               f"--lr {args.lr:g} --batch-tokens {args.batch_tokens} --unroll {args.unroll} "
                               f"--ce-weight {args.ce_weight:g} --feature-weight {args.feature_weight:g} "
                               f"--copy-pointer 0 --dtype {args.dtype}",
                    "matmuls": "bf16 autocast" if bf16 else "fp32",
                    "top1_by_draft_position": [round(a, 4) for a in stats["top1_by_position"]],
                    "samples": len(samples), "tokens": int(sum(len(s.tokens) for s in samples)),
                    "data_seconds": round(t_data), "train_seconds": round(time.perf_counter() - t0 - t_data),
                    "final_loss": round(stats["loss"], 4), "final_top1_agreement": round(stats["top1"], 4),
                    "steps": stats["steps"]}
    if args.copy_pointer:
        t1 = time.perf_counter()
        head = _with_pointer(head, args.copy_pointer, args.pointer_match)
        pstats = train_pointer(head.pointer, head, _embed_fn(lm), rows, vocab_ids,
                               lambda h: _target_argmax(lm, h), lm.cfg.vocab_size, samples, args.pointer_epochs,
                               args.seed,
                               batch_tokens=args.batch_tokens, progress=not args.quiet)
        stage = "" if args.from_head is None else "--from-head HEAD_DIR "
        training["pointer"] = {
            "command": f"ridgeline train-draft {args.model} --out DIR {stage}{_data_flags(args)}--tokens {args.tokens} "
                       f"--seed {args.seed} --max-reply-tokens {args.max_reply_tokens} --temperature "
                       f"{args.temperature:g} --batch-tokens {args.batch_tokens} --copy-pointer {args.copy_pointer} "
                       f"--pointer-epochs {args.pointer_epochs:g} --pointer-match {args.pointer_match} "
                       f"--dtype {args.dtype}",
            "samples": len(samples), "tokens": int(sum(len(s.tokens) for s in samples)),
            "data_seconds": round(t_data), "train_seconds": round(time.perf_counter() - t1),
            "steps": pstats["steps"], "final_loss": round(pstats["loss"], 4),
            "label_at_least_head_top": round(pstats["top1"], 4)}
    save_head(args.out, head, target_fingerprint(lm), vocab_ids, training, getattr(torch, args.save_dtype))
    n = sum(p.numel() for p in head.parameters())
    line = (f"wrote {args.out}: {n / 1e6:.2f}M parameters, draft vocabulary "
            f"{lm.cfg.vocab_size if vocab_ids is None else len(vocab_ids)}; head: {training['tokens']} tokens of data, "
            f"top-1 agreement with the target on it {training['final_top1_agreement']:.2f}")
    if args.copy_pointer:
        ptr = training["pointer"]
        line += (f"; copy pointer (width {args.copy_pointer}, exact matches up to {args.pointer_match}): "
                 f"{ptr['tokens']} tokens, the target's token at least as "
                 f"likely as the head's own top one at {ptr['label_at_least_head_top']:.2f} of positions")
    print(line)
    return 0


def _data_flags(args: argparse.Namespace) -> str:
    return "".join(f"--data {d} " for d in args.data)


def _with_pointer(head, dim: int, match: int = 0):
    """The head with a fresh copy pointer of width dim, reading exact matches up to `match` tokens (its
    other weights kept)."""
    from dataclasses import replace

    from ridgeline.speculative.eagle_head import EagleHead
    out = EagleHead(replace(head.cfg, pointer_dim=dim, pointer_match=match))
    state = {k: v for k, v in head.state_dict().items() if not k.startswith("pointer.")}
    missing = out.load_state_dict(state, strict=False).missing_keys
    assert all(k.startswith("pointer.") for k in missing), missing
    return out.eval()


def _embed_fn(lm):
    """ids (CPU) -> the target's embeddings, on the CPU: the head trains there whatever the target's
    device."""
    dev = lm.model.embed_tokens.weight.device
    return lambda ids: lm.model.embed(ids.to(dev)).cpu()


def _target_argmax(lm, hidden: torch.Tensor) -> torch.Tensor:
    """The target's next token from its final hidden states [T, H] (its own LM head, whole vocabulary),
    on the CPU."""
    dev = lm.model.embed_tokens.weight.device
    return torch.cat([lm.compute_logits(hidden[i:i + 256].to(dev, lm.model.act_dtype)).argmax(-1).cpu()
                      for i in range(0, hidden.shape[0], 256)])
