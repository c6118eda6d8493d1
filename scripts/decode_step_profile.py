"""Where a batch-1 decode step's time goes at depth. Default model, bf16 weights, one request with a
prompt of --prompt-len random tokens, then --steps decode steps, each timed on its own:

- the distribution of step wall times (median, mean, p90, max), and the steps above p90 apart;
- inside the C decoder stack (RIDGELINE_STACK_PROFILE=1, decoder_stack.c): wall ms per phase, each
  phase's parallel regions included (their imbalance and barrier waits too);
- outside it: the rest of the step (the runner's Python work, the lm head and sampling, the scheduler);
- the process's CPU time per step over its wall time (2.0 = both threads busy, spinning included) and
  the share of the CPUs the hypervisor took (/proc/stat steal) during the steps.

    python3 scripts/decode_step_profile.py [--prompt-len 8000] [--steps 64] [--kv-cache-dtype bfloat16]
"""
from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import sys
import time
from pathlib import Path

os.environ["RIDGELINE_STACK_PROFILE"] = "1"  # read by the C stack at its first call
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from ridgeline import LLM, SamplingParams  # noqa: E402
from ridgeline.kernels import cpu  # noqa: E402
from ridgeline.utils.steal import StealMeter  # noqa: E402

PHASES = ("norms", "qkv", "rotary+KV write", "attention", "o", "gate_up", "SiLU*up", "down", "hook")


def stack_phases() -> tuple[list[float], list[float]]:
    """wall and calling-thread CPU seconds per phase since the last call (and clears them)"""
    n = len(PHASES)
    out = (ctypes.c_double * (2 * n + 1))()
    if cpu.lib().ridgeline_stack_profile(ctypes.addressof(out)) != n:
        raise SystemExit("the C stack's phase clock is off (RIDGELINE_STACK_PROFILE=1 before its first call)")
    return list(out[:n]), list(out[n:2 * n])


def profile(llm, prompt: list[int], steps: int) -> list[dict]:
    eng = llm.engine
    eng.add_request("profile", prompt, SamplingParams(temperature=0, max_tokens=steps + 1, ignore_eos=True))
    req = eng.requests["profile"]
    while req.num_output_tokens == 0:  # prefill
        eng.step(emit_unfinished=False)
    stack_phases()
    rows = []
    while not req.status.finished:
        w, c, t = time.perf_counter(), time.process_time(), time.thread_time()
        eng.step(emit_unfinished=False)
        wall, cpu_s = stack_phases()
        rows.append({"wall": time.perf_counter() - w, "cpu": time.process_time() - c, "thread": time.thread_time() - t,
                     "phases": wall, "cpu_phases": cpu_s})
    return rows


def summary(rows: list[dict], label: str) -> None:
    walls = sorted(r["wall"] for r in rows)
    p90 = walls[int(0.9 * (len(walls) - 1))]
    ms = lambda x: f"{x * 1e3:.1f}"  # noqa: E731
    print(f"{label}: {len(rows)} steps; wall ms median {ms(statistics.median(walls))}, mean "
          f"{ms(statistics.mean(walls))}, p90 {ms(p90)}, max {ms(walls[-1])}")
    for name, sel in (("all steps", rows), ("steps <= p90", [r for r in rows if r["wall"] <= p90]),
                      ("steps > p90", [r for r in rows if r["wall"] > p90])):
        if not sel:
            continue
        n = len(sel)
        mean = lambda key: sum(r[key] for r in sel) / n  # noqa: E731
        for what, total, key in (("wall", mean("wall"), "phases"), ("step thread's CPU", mean("thread"), "cpu_phases")):
            ph = [sum(r[key][i] for r in sel) / n for i in range(len(PHASES))]
            parts = ", ".join(f"{p} {ms(t)}" for p, t in zip(PHASES, ph) if t >= 5e-5)
            print(f"  {name} ({n}), {what}: {ms(total)} = stack {ms(sum(ph))} [{parts}] + outside "
                  f"{ms(total - sum(ph))}")
        print(f"  {name} ({n}): process CPU / wall {mean('cpu') / mean('wall'):.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompt-len", type=int, default=8000)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--kv-cache-dtype", default="bfloat16")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--quantization", default="none")
    args = ap.parse_args()
    llm = LLM(dtype=args.dtype, quantization=args.quantization, kv_cache_dtype=args.kv_cache_dtype,
              max_model_len=args.prompt_len + args.steps + 64, progress=False)
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(100, 40000, (args.prompt_len,), generator=g).tolist()
    profile(llm, prompt[:64], 4)  # warm-up
    steal = StealMeter()
    rows = profile(llm, prompt, args.steps)
    stolen = steal.fraction() or 0.0
    print(f"{torch.get_num_threads()} threads, KV {args.kv_cache_dtype}, depth {args.prompt_len}; "
          f"CPU stolen by the hypervisor during the steps: {stolen:.1%}")
    summary(rows, f"decode at depth {args.prompt_len}")


if __name__ == "__main__":
    main()
