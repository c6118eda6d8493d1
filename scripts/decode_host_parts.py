"""Where a batch-1 greedy decode step's wall time goes, part by part, on the default model: each part
(the engine step, the decoder stack's C call, the LM head's C call, preparing the inputs, sampling,
the embedding lookup, scheduling, ...) is wrapped with a timer, one request decodes --tokens greedy
tokens after a short prompt, and the mean microseconds per step of each part are printed, with the
host work (the step minus the C stack and the head's kernel) on the last line. Parts a build does
not have are left out, so two builds can be compared by running this script from each checkout.

    python3 scripts/decode_host_parts.py [--quantization gguf] [--tokens 512]
"""
from __future__ import annotations

import argparse
import collections
import functools
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ridgeline import LLM, SamplingParams  # noqa: E402
from ridgeline.engine import llm_engine, scheduler, step_clock  # noqa: E402
from ridgeline.kernels import cpu_quant, cpu_stack  # noqa: E402
from ridgeline.models import llama  # noqa: E402
from ridgeline.runner import model_runner, step_sampler  # noqa: E402

ACC: dict[str, float] = collections.defaultdict(float)


def wrap(owner, name: str, part: str) -> None:
    f = getattr(owner, name, None)
    if f is None:
        return

    @functools.wraps(f)
    def timed(*a, **k):
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            ACC[part] += time.perf_counter() - t
    setattr(owner, name, timed)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quantization", default="gguf")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--tokens", type=int, default=512)
    args = ap.parse_args()
    llm = LLM("smollm2-135m", dtype=args.dtype, quantization=args.quantization)
    wrap(llm_engine.LLMEngine, "step", "step")
    wrap(cpu_stack, "run", "decoder stack (C)")
    wrap(cpu_stack, "linear_argmax", "head kernel")  # with the argmax, where the build fuses them
    for cls in vars(cpu_quant).values():
        if isinstance(cls, type) and "_gemm" in vars(cls):
            wrap(cls, "_gemm", "head kernel")  # the quantized head's kernel on the logits path
    wrap(llama.LlamaForCausalLM, "compute_logits", "logits path (head + Python)")
    wrap(llama.Model, "embed", "embedding lookup")
    wrap(model_runner.ModelRunner, "_prepare", "preparing the inputs")
    wrap(step_sampler.StepSampler, "__call__", "sampling")
    wrap(scheduler.Scheduler, "schedule", "scheduling")
    wrap(llm_engine.LLMEngine, "_append", "appending and detokenizing")
    wrap(step_clock.StepClock, "begin", "step clock (start of step)")
    sp = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True)
    llm.generate(["Hello there, tell me a story."], sp, use_tqdm=False)  # warm-up
    ACC.clear()
    t = time.perf_counter()
    llm.generate(["Write a long essay about the history of the city of Rome."], sp, use_tqdm=False)
    per = {k: v / args.tokens * 1e6 for k, v in ACC.items()}
    print(f"{args.quantization}: {args.tokens / (time.perf_counter() - t):.1f} tok/s")
    for k, v in sorted(per.items(), key=lambda kv: -kv[1]):
        print(f"  {k:32s} {v:8.1f} us")
    host = per["step"] - per.get("decoder stack (C)", 0) - per.get("head kernel", 0)
    print(f"  {'host work (step - stack - head)':32s} {host:8.1f} us")


if __name__ == "__main__":
    main()
