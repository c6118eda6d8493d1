"""`ridgeline advise --validate`: the advisor's predictions for this machine next to the engine's measurements.

Predictions use only the local measured profile (memory read bandwidth, GEMM rate for the engine's dtype,
host cost of one torch call) and counts taken from the engine (torch calls per step, counted, not timed).
No constant is fitted to the timings. Model: step = max(bytes / BW, FLOPs / F) + calls x cost per call.
"""
from __future__ import annotations

import os
import time

from ridgeline.advisor.errors import AdvisorError
from ridgeline.advisor.roofline import Platform, crossover_len, decode_step, prefill, ridge_batch

PROMPT = 32  # tokens per request in the decode sweep
PREFILL = 256  # tokens of the single prompt timed for prefill
PREFIX_LEN, PREFIX_SHARE = 512, 0.75  # prefix-caching check: prompt tokens, fraction already cached
CROSSOVER_LENGTHS = (1024, 2048, 4096, 8192, 16384)  # prompt lengths profiled for the attention crossover


def _count_calls(fn) -> int:
    """Python-level torch calls (functions and tensor methods) made by fn: the host dispatches to pay for."""
    from torch.overrides import TorchFunctionMode

    class Count(TorchFunctionMode):
        n = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            Count.n += 1
            return func(*args, **(kwargs or {}))

    with Count():
        fn()
    return Count.n


def _prompts(batch: int, length: int, salt: int, vocab: int = 40100) -> list[list[int]]:
    """Deterministic distinct token ids in [100, vocab)."""
    return [[(1000 + 7919 * (salt * 131 + i) + 31 * j) % (vocab - 100) + 100 for j in range(length)]
            for i in range(batch)]


def _decode(eng, batch: int, steps: int, salt: int, clock) -> tuple[float, int, int]:
    """Returns (seconds per decode step, calls in one decode step, context at the timed steps' middle)."""
    from ridgeline.sampling_params import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=steps + 3, ignore_eos=True)
    ids = [f"v{salt}-{i}" for i in range(batch)]
    for rid, prompt in zip(ids, _prompts(batch, PROMPT, salt)):
        eng.add_request(rid, prompt, params)
    try:
        reqs = [eng.requests[r] for r in ids]
        while min(r.num_output_tokens for r in reqs) < 1:  # prefill (possibly chunked)
            eng.step(emit_unfinished=False)
        eng.step(emit_unfinished=False)  # one warm decode step
        calls = _count_calls(lambda: eng.step(emit_unfinished=False))
        t = clock()
        for _ in range(steps):
            eng.step(emit_unfinished=False)
        dt = (clock() - t) / steps
    finally:
        for rid in ids:
            eng.abort_request(rid)
    return dt, calls, PROMPT + 3 + steps // 2


def _prefill(eng, clock, reps: int = 3) -> tuple[float, int]:
    from ridgeline.sampling_params import SamplingParams

    best, calls = float("inf"), 0
    for i in range(reps + 1):
        eng.add_request(f"p{i}", _prompts(1, PREFILL, 1000 + i)[0], SamplingParams(temperature=0, max_tokens=1))
        t = clock()
        if i == reps:
            calls = _count_calls(lambda: eng.step(emit_unfinished=False))
        else:
            eng.step(emit_unfinished=False)
        if i and i < reps:
            best = min(best, clock() - t)
        eng.abort_request(f"p{i}")
    return best, calls


def _time_to_first_token(eng, rid: str, prompt: list[int], clock) -> tuple[float, int]:
    """Seconds from admission to the first sampled token of one request alone; its cached prompt tokens."""
    from ridgeline.sampling_params import SamplingParams

    eng.add_request(rid, prompt, SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
    req = eng.requests[rid]
    t = clock()
    while req.num_output_tokens < 1:
        eng.step(emit_unfinished=False)
    dt, cached = clock() - t, req.num_cached_tokens
    eng.abort_request(rid)
    return dt, cached


def prefix_gain(eng, clock, length: int = PREFIX_LEN, share: float = PREFIX_SHARE,
                reps: int = 3) -> tuple[float, float, int]:
    """Prefill of a `length`-token prompt with nothing cached vs with its first share*length tokens
    cached by an earlier request (same prefix, different tail). Best of reps: (cold s, warm s, cached)."""
    v = min(40100, eng.arch.vocab_size)
    shared = _prompts(1, int(length * share), 7000, v)[0]
    cold = warm = float("inf")
    cached = 0
    for i in range(reps + 1):
        t_cold, _ = _time_to_first_token(eng, f"pc-cold{i}", _prompts(1, length, 7100 + i, v)[0], clock)
        tail = length - len(shared)
        _time_to_first_token(eng, f"pc-seed{i}", shared + _prompts(1, tail, 7200 + i, v)[0], clock)
        t_warm, cached = _time_to_first_token(eng, f"pc-warm{i}", shared + _prompts(1, tail, 7300 + i, v)[0], clock)
        if i:  # the first round warms up
            cold, warm = min(cold, t_cold), min(warm, t_warm)
    return cold, warm, cached


def _saturation_batch(batches: list[int], times: list[float]) -> float:
    """t(1) x the best tokens/s of the sweep: the batch at which a step that still cost t(1) would reach
    the throughput plateau. On an ideal roofline max(t0, s B) this is exactly the ridge t0 / s."""
    return times[0] * max(b / t for b, t in zip(batches, times))


def _quant_rows(args, eng, pl: Platform, clock) -> list[tuple]:
    """int8 and int4 engines' batch-1 decode speed-up over `eng`'s, predicted and measured."""
    from ridgeline.advisor.validate_quant import quant_rows
    from ridgeline.engine.run import start_engine

    base_step, base_calls, ctx = _decode(eng, 1, args.steps, 899, clock)
    return quant_rows(lambda q: start_engine("smollm2-135m", dtype=args.dtype, kv_cache_memory=args.kv_cache_memory,
                                             quantization=q), pl, base_step, base_calls, ctx, args.steps, clock, _decode)


def crossover_row(eng, spec, info) -> tuple:
    """n* = 4P/a (attention FLOPs overtake the linears') against the prompt length where one layer's
    attention time overtakes its matmuls' in the engine's kernels (measure/attn_profile.py, CPU time on
    one thread, the engine's prefill chunks). Measured below predicted: attention runs below the
    matmul rate (the ratio is its share of that rate)."""
    import torch

    from ridgeline.measure.attn_profile import LayerShape, crossover_from_profile

    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        got = crossover_from_profile(LayerShape.of(eng.arch), list(CROSSOVER_LENGTHS),
                                     eng.config.scheduler.max_num_batched_tokens, info.dtype, info.kv_dtype)
    finally:
        torch.set_num_threads(prev)
    return ("attention crossover n* = 4P/a (tokens)", crossover_len(spec), got or float("inf"),
            "attention time = matmul time, one layer profiled" if got else
            f"attention below the matmuls up to {CROSSOVER_LENGTHS[-1]} tokens")


def run_validate(args) -> int:
    from ridgeline.advisor.local_profile import local_hardware
    from ridgeline.advisor.model_config import spec_from_arch

    from ridgeline.config import parse_bytes
    from ridgeline.engine.run import start_engine

    try:
        batches = sorted({int(b) for b in args.batches.split(",") if b.strip()})
    except ValueError:
        batches = []
    if not batches or batches[0] < 1 or len(batches) < 3:
        raise AdvisorError("--batches needs at least three positive batch sizes, e.g. 1,16,32,64", "batches")
    parse_bytes(args.kv_cache_memory)  # a bad size fails now, not after the machine profile
    if args.cpu_time and args.threads != 1:
        raise AdvisorError("--cpu-time needs --threads 1 (the CPU time of several threads adds their waits up)")
    if args.threads:
        import torch
        torch.set_num_threads(args.threads)
    clock = time.process_time if args.cpu_time else time.perf_counter
    hw = local_hardware(refresh=args.reprofile, clock="cpu" if args.cpu_time else "wall")
    eng = start_engine("smollm2-135m", dtype=args.dtype, kv_cache_memory=args.kv_cache_memory,
                       max_num_seqs=max(256, batches[-1]), quantization="none")  # the file's blocks dequantized
    info = eng.info
    name = {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16"}
    wp, kp = name[str(info.dtype)], name[str(info.kv_dtype)]
    spec = spec_from_arch(eng.arch, "smollm2-135m")
    pl = Platform(spec, hw, wp, kp)
    print(info.summary())
    print(f"machine    load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (other processes share them)")
    print(f"profile    {hw.name}: read {hw.bandwidth / 1e9:.1f} GB/s, {wp} GEMM {hw.flops.get(wp, 0) / 1e9:.0f} "
          f"GFLOP/s, host {hw.op_overhead * 1e6:.2f} us per torch call ({hw.source})")
    rows = []
    pre_s, pre_calls = _prefill(eng, clock)
    pre_pred = prefill(pl.with_(ops_per_step=pre_calls), PREFILL)
    rows.append((f"prefill tok/s ({PREFILL}-token prompt)", PREFILL / pre_pred.total, PREFILL / pre_s,
                 f"{pre_pred.bound}-bound, {pre_calls} calls"))
    measured, predicted, notes = [], [], []
    for b in batches:
        dt, calls, ctx = _decode(eng, b, args.steps, b, clock)
        t = decode_step(pl.with_(ops_per_step=calls), b, ctx)
        measured.append(dt)
        predicted.append(t.total)
        notes.append(f"batch {b:>3}: predicted {t.total * 1e3:7.1f} ms/step (memory {t.memory * 1e3:.1f}, compute "
                     f"{t.compute * 1e3:.1f}, host {calls} calls {t.overhead * 1e3:.1f}) measured {dt * 1e3:7.1f} ms "
                     f"-> {b / t.total:6.1f} vs {b / dt:6.1f} tok/s")
    for b in (1, 32):
        if b in batches:
            i = batches.index(b)
            rows.append((f"batch-{b} decode tok/s", b / predicted[i], b / measured[i], ""))
    if eng.config.cache.enable_prefix_caching:
        cold, warm, cached = prefix_gain(eng, clock)
        new = PREFIX_LEN - cached
        ppl = pl.with_(ops_per_step=pre_calls)
        gain_pred = prefill(ppl, PREFIX_LEN).total / prefill(ppl, new, cached).total
        rows.append((f"prefix-cache prefill gain ({cached}/{PREFIX_LEN} cached)", gain_pred, cold / warm,
                     f"prefill {PREFIX_LEN} tokens vs {new} after {cached} cached (x)"))
    kv_pred = info.kv_bytes / (spec.kv_elems_per_token * info.kv_dtype.itemsize)
    rows.append(("KV capacity (tokens)", kv_pred, info.kv_capacity_tokens, "kv_cache_memory / KV bytes per token"))
    rows.append(("ridge batch: t(1) x best tok/s of sweep", _saturation_batch(batches, predicted),
                 _saturation_batch(batches, measured), "same estimator on both curves"))
    rows += _quant_rows(args, eng, pl, clock)
    rows.append(crossover_row(eng, spec, info))
    analytic = ridge_batch(pl, PROMPT + 3 + args.steps // 2)
    print("\n".join(["", "decode sweep (greedy, ignore_eos):"] + ["  " + n for n in notes]))
    print(f"\n{'':<40}{'predicted':>12}{'measured':>12}{'error':>9}")
    for label, p, m, how in rows:
        err = (p - m) / m if m and m != float("inf") and p != float("inf") else float("nan")
        print(f"{label:<40}{p:>12,.1f}{m:>12,.1f}{err:>+9.0%}   {how}")
    print(f"roofline ridge batch (compute = memory at the peak GEMM rate, no host cost): "
          f"{analytic:.0f}" if analytic else "roofline ridge batch: none at this context")
    print(f"error = (predicted - measured) / measured; {'CPU' if args.cpu_time else 'wall'} time. On shared CPUs "
          "timings drift run to run: --reprofile re-measures the profile; --threads 1 --cpu-time removes "
          "most of the other processes' effect.")
    return 0
