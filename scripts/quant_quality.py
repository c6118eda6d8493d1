"""Quick quality check of weight quantization until the evaluation command exists: teacher-forced
perplexity on the shipped corpus passages (ridgeline/bench/corpus.py, windows of --window tokens),
and, against the first setting, greedy top-1 agreement and mean KL divergence of next-token
distributions, one full forward per window (no sampling, no KV reuse).

python3 scripts/quant_quality.py [--dtype bfloat16] [--settings none,int8,int4,int4:sym,int4:head4]
A setting is a quantization, optionally :sym (symmetric), :g64 (group size) and :head4 (a 4-bit
LM head via a layer_formats rule instead of the int8 head int4 keeps).
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
    args = ap.parse_args()
    base = None
    for setting in args.settings.split(","):
        llm = LLM(args.model, dtype=args.dtype, kv_cache_memory="256MiB", progress=False, **engine_options(setting))
        ids = llm.tokenizer.encode(" ".join(text for _, text in PASSAGES))
        W = args.window
        windows = [ids[i:i + W] for i in range(0, len(ids) - W + 1, W)][:args.windows]
        logits = [window_logits(llm, w) for w in windows]
        base = base or logits
        nll = agree = kl = rows = 0.0
        for w, lo, ref in zip(windows, logits, base):
            lp = torch.log_softmax(lo, -1)
            nll -= float(lp[:-1].gather(1, torch.tensor(w[1:])[:, None]).sum())
            agree += float((lo.argmax(-1) == ref.argmax(-1)).sum())
            lr = torch.log_softmax(ref, -1)
            kl += float((lr.exp() * (lr - lp)).sum())
            rows += len(w)
        ppl = float(torch.tensor(nll / (rows - len(windows))).exp())
        print(f"{setting:<12} perplexity {ppl:8.3f}  top-1 agreement {agree / rows:.3f}  KL {kl / rows:.4f}  "
              f"weights {llm.info.weight_bytes / 1e6:.1f} MB ({llm.info.weight_formats})", flush=True)
        del llm


if __name__ == "__main__":
    main()
