"""The engine's own prefill and decode-step cost on this machine, for `advise disagg --simulate` to
turn into efficiencies against this machine's roofline (advisor/engine_calibration.py).

One engine in this process, this process's torch threads; each repetition a fresh prompt (nothing
comes from the prefix cache): the steps until its first token (the prefill), then `steps` decode steps
of that one request (batch 1). Best wall time of the repetitions, as the local profile's rooflines are
measured (closest to what the machine can do when it is shared), and the step thread's CPU time."""
from __future__ import annotations

import time


def _precision(dtype) -> str:
    import torch
    return {torch.float32: "fp32", torch.float16: "fp16"}.get(dtype, "bf16")


def measure_engine(model: str, prompt_len: int, steps: int = 16, reps: int = 3, **engine_kwargs) -> dict:
    import torch

    from ridgeline.sampling_params import SamplingParams
    from ridgeline.config import EngineConfig
    from ridgeline.bench.disagg_goodput import _prompts
    from ridgeline.engine.llm_engine import LLMEngine

    engine = LLMEngine(EngineConfig.from_kwargs(model, progress=False, **engine_kwargs))
    try:
        P = max(1, min(prompt_len, engine.max_model_len - steps - 2))
        params = SamplingParams(temperature=0, max_tokens=steps + 1, ignore_eos=True)
        best = {"prefill": (float("inf"), 0.0), "decode": (float("inf"), 0.0)}
        for i, ids in enumerate(_prompts(reps, P, engine.arch.vocab_size)):
            engine.add_request(f"calibrate-{i}", ids, params)
            req = engine.requests[f"calibrate-{i}"]
            t, cpu = time.perf_counter(), time.thread_time()
            while req.num_output_tokens == 0:
                engine.step()
            got = (time.perf_counter() - t, time.thread_time() - cpu)
            best["prefill"] = min(best["prefill"], got)
            t, cpu = time.perf_counter(), time.thread_time()
            for _ in range(steps):
                engine.step()
            got = ((time.perf_counter() - t) / steps, (time.thread_time() - cpu) / steps)
            best["decode"] = min(best["decode"], got)
            while engine.has_unfinished():
                engine.step()
        weights = _precision(engine.info.dtype)
        kv = engine.info.kv_spec.format.name
        return {"model": model, "threads": torch.get_num_threads(), "weights": weights,
                "kv": {"f32": "fp32", "f16": "fp16"}.get(kv, kv.split("_")[0]), "reps": reps,
                "prefill": {"tokens": P, "wall_s": best["prefill"][0], "cpu_s": best["prefill"][1]},
                "decode": {"batch": 1, "context": P + steps // 2, "wall_s": best["decode"][0],
                           "cpu_s": best["decode"][1]}}
    finally:
        engine.close()


def format_engine(m: dict) -> str:
    p, d = m["prefill"], m["decode"]
    return (f"engine on this machine ({m['model']}, {m['weights']} weights, {m['threads']} threads, best of "
            f"{m['reps']}): prefill {p['tokens']} tokens {p['wall_s'] * 1e3:.1f} ms ({p['tokens'] / p['wall_s']:.0f} "
            f"tokens/s), decode step (batch {d['batch']}, context {d['context']}) {d['wall_s'] * 1e3:.2f} ms; step "
            f"thread CPU {p['cpu_s'] * 1e3:.1f} / {d['cpu_s'] * 1e3:.2f} ms"
            + (" (far below the wall times: the machine is loaded, remeasure it idle)"
               if p["cpu_s"] < 0.5 * p["wall_s"] or d["cpu_s"] < 0.5 * d["wall_s"] else ""))
