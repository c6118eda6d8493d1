"""Whole-engine speed of weight formats side by side, for a loaded machine: one process, one thread, CPU
time (which other processes' load inflates far less than wall time), settings interleaved in every
round, medians over rounds. Default model, --dtype bfloat16 otherwise.

    prefill   one step of --prefill-seqs random prompts of --prefill-len tokens (max_tokens 1)
    decode    batch 1: CPU time of --decode-tokens + 1 output tokens less that of 1, per token

python3 scripts/quant_engine_pairs.py [--settings none,int8,int4,fp8,mxfp8,mxfp4,nvfp4] [--rounds 3]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from ridgeline import LLM, SamplingParams  # noqa: E402


def cpu_seconds(fn) -> float:
    t = time.process_time()
    fn()
    return time.process_time() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--settings", default="none,int8,int4,fp8,mxfp8,mxfp4,nvfp4")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prefill-seqs", type=int, default=8)
    ap.add_argument("--prefill-len", type=int, default=512)
    ap.add_argument("--decode-tokens", type=int, default=32)
    args = ap.parse_args()
    torch.set_num_threads(1)
    settings = args.settings.split(",")
    llms = {q: LLM(dtype="bfloat16", quantization=q, kv_cache_memory="256MiB", progress=False,
                   max_num_batched_tokens=args.prefill_seqs * args.prefill_len) for q in settings}
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(100, 40000, (args.prefill_len,), generator=g).tolist() for _ in range(args.prefill_seqs)]
    one = SamplingParams(max_tokens=1, ignore_eos=True)
    many = SamplingParams(max_tokens=args.decode_tokens + 1, ignore_eos=True)
    short = prompts[0][:16]
    prefill = {q: [] for q in settings}
    decode = {q: [] for q in settings}
    for r in range(args.rounds):
        order = settings[r % len(settings):] + settings[:r % len(settings)]
        for q in order:
            llm = llms[q]
            llm.generate(short, one, use_tqdm=False)  # warm
            prefill[q].append(cpu_seconds(lambda: llm.generate(prompts, one, use_tqdm=False)))
            t1 = cpu_seconds(lambda: llm.generate(short, one, use_tqdm=False))
            tn = cpu_seconds(lambda: llm.generate(short, many, use_tqdm=False))
            decode[q].append((tn - t1) / args.decode_tokens)
    base = settings[0]
    toks = args.prefill_seqs * args.prefill_len
    print(f"1 thread, CPU time, medians of {args.rounds} interleaved rounds; vs {base}")
    print("| setting | weight MB | prefill tok/CPU-s | vs | batch-1 decode tok/CPU-s | vs |")
    print("|---|---|---|---|---|---|")
    for q in settings:
        p, d = toks / statistics.median(prefill[q]), 1 / statistics.median(decode[q])
        pb, db = toks / statistics.median(prefill[base]), 1 / statistics.median(decode[base])
        mb = llms[q].info.weight_bytes / 1e6
        print(f"| {q} | {mb:.1f} | {p:.1f} | {p / pb:.2f}x | {d:.1f} | {d / db:.2f}x |")


if __name__ == "__main__":
    main()
