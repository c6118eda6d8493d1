"""Quick quality check of weight and KV-cache quantization until the evaluation command exists:
teacher-forced perplexity on the shipped corpus passages (ridgeline/bench/corpus.py, windows of
--window tokens), and, against the first setting, greedy top-1 agreement (overall and by context
position) and mean KL divergence of next-token distributions, one full forward per window (no
sampling; every query reads its keys back from the cache, so a quantized cache is what it sees).

python3 scripts/quant_quality.py [--dtype bfloat16] [--settings none,int8,int4,int4:sym,int4:head4]
python3 scripts/quant_quality.py --settings none --kv-cache-dtypes auto,int8,int4,fp8 --window 2048 --windows 1
A setting is a quantization, optionally :sym (symmetric), :g64 (group size) and :head4 (a 4-bit
LM head via a layer_formats rule instead of the int8 head int4 keeps); each runs with each KV
cache dtype (a --kv-cache-dtype value, or K/V as int4/int8).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ridgeline import LLM, SamplingParams  # noqa: E402
from ridgeline.bench.corpus import PASSAGES  # noqa: E402
from ridgeline.layers.forward_context import forward_context  # noqa: E402
from ridgeline.step_plan import ScheduledSeq  # noqa: E402


def engine_options(setting: str) -> dict:
    quant, *mods = setting.split(":")
    kw: dict = {"quantization": quant}
    for m in mods:
        if m == "sym":
            kw["quant_symmetric"] = True
        elif m.startswith("g"):
            kw["quant_group_size"] = int(m[1:])
        elif m == "head4":
            kw["layer_formats"] = [("lm_head", "int4-sym" if "sym" in mods else "int4")]
    return kw


def window_logits(llm: LLM, ids: list[int]) -> torch.Tensor:
    runner, kv = llm.engine.runner, llm.engine.kv
    if not kv.allocate("quality", len(ids)):
        raise RuntimeError("KV cache too small for one window")
    seq = ScheduledSeq("quality", 0, ids, list(kv.tables["quality"]), True, SamplingParams(), None, ids, len(ids))
    tokens, pos, ctx, _ = runner._prepare([seq])
    try:
        with torch.inference_mode(), forward_context(ctx):
            return runner.model.compute_logits(runner.model(tokens, pos)).float()
    finally:
        kv.free("quality")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--settings", default="none,int8,int4,int4:head4,int4:sym")
    ap.add_argument("--window", type=int, default=400)
    ap.add_argument("--windows", type=int, default=12)
    ap.add_argument("--kv-cache-dtypes", default="auto")
    ap.add_argument("--buckets", default="0-128,1024-2048", help="position ranges for agreement by position")
    args = ap.parse_args()
    base = None
    for setting, kv in [(s, k) for s in args.settings.split(",") for k in args.kv_cache_dtypes.split(",")]:
        k_dtype, _, v_dtype = kv.partition("/")
        llm = LLM(args.model, dtype=args.dtype, kv_cache_memory="256MiB", progress=False,
                  kv_cache_dtype_k=k_dtype, kv_cache_dtype_v=v_dtype or k_dtype, max_model_len=args.window + 16,
                  **engine_options(setting))
        ids = llm.tokenizer.encode(" ".join(text for _, text in PASSAGES))
        W = args.window
        windows = [ids[i:i + W] for i in range(0, len(ids) - W + 1, W)][:args.windows]
        logits = [window_logits(llm, w) for w in windows]
        base = base or logits
        nll = agree = kl = rows = 0.0
        buckets = [tuple(map(int, b.split("-"))) for b in args.buckets.split(",")]
        by_pos = [[0.0, 0] for _ in buckets]
        for w, lo, ref in zip(windows, logits, base):
            lp = torch.log_softmax(lo, -1)
            nll -= float(lp[:-1].gather(1, torch.tensor(w[1:])[:, None]).sum())
            same = lo.argmax(-1) == ref.argmax(-1)
            agree += float(same.sum())
            for (a, b), acc in zip(buckets, by_pos):
                acc[0] += float(same[a:b].sum())
                acc[1] += len(same[a:b])
            lr = torch.log_softmax(ref, -1)
            kl += float((lr.exp() * (lr - lp)).sum())
            rows += len(w)
        ppl = float(torch.tensor(nll / (rows - len(windows))).exp())
        pos = "  ".join(f"{a}-{b}: {n / c:.3f}" for (a, b), (n, c) in zip(buckets, by_pos) if c)
        print(f"{setting:<12} kv {kv:<9} perplexity {ppl:8.3f}  top-1 agreement {agree / rows:.3f} ({pos})  "
              f"KL {kl / rows:.4f}  weights {llm.info.weight_bytes / 1e6:.1f} MB ({llm.info.weight_formats}), "
              f"KV {llm.info.kv_spec.describe()}", flush=True)
        del llm


if __name__ == "__main__":
    main()
