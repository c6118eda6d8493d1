"""`ridgeline advise --validate --tensor-parallel-size N`: predicted vs measured communication per step.

The prediction (advisor/parallel_comm.py) counts the collectives the engine makes and prices them with the
link's latency and bandwidth, measured by timing an all-reduce of 1 float and of 1 MiB between the ranks
(apart from the model). The measurement is rank 0's time inside collectives during real steps, which also
holds its waits for a slower rank (an uneven head split makes one rank slower): the gap says how much.
"""
from __future__ import annotations

import os
import time

from ridgeline.advisor.errors import AdvisorError
from ridgeline.advisor.parallel_comm import Link, tp_step_comm

LARGE = 1 << 18  # floats in the bandwidth probe (1 MiB)
PROMPT, PREFILL = 32, 256


def _prompts(batch: int, length: int, salt: int) -> list[list[int]]:
    return [[(1000 + 7919 * (salt * 131 + i) + 31 * j) % 40000 + 100 for j in range(length)] for i in range(batch)]


def _measure(eng, batch: int, length: int, steps: int, salt: int) -> tuple[float, float, float]:
    """(comm s per forward, calls per forward, step s) over `steps` timed steps after the prompts ran."""
    from ridgeline.sampling_params import SamplingParams
    comm = eng.tp.comm
    ids = [f"tp{salt}-{i}" for i in range(batch)]
    for rid, p in zip(ids, _prompts(batch, length, salt)):
        eng.add_request(rid, p, SamplingParams(temperature=0, max_tokens=steps + 2 if length == PROMPT else 1,
                                               ignore_eos=True))
    try:
        reqs = [eng.requests[r] for r in ids]
        if length == PROMPT:  # decode: past the prompts and one warm step first
            while min(r.num_output_tokens for r in reqs) < 2:
                eng.step(emit_unfinished=False)
        comm.reset()
        t0 = time.perf_counter()
        for _ in range(steps if length == PROMPT else 1):
            eng.step(emit_unfinished=False)
        dt = time.perf_counter() - t0
    finally:
        for rid in ids:
            eng.abort_request(rid)
    n = max(comm.forwards, 1)
    return comm.seconds / n, comm.calls / n, dt / n


def run_tp_validate(args) -> int:
    from ridgeline.engine.run import start_engine
    size = args.tensor_parallel_size
    batches = sorted({int(b) for b in args.batches.split(",") if b.strip()})
    if not batches or batches[0] < 1:
        raise AdvisorError("--batches needs positive batch sizes, e.g. 1,4,16", "batches")
    eng = start_engine("smollm2-135m", dtype=args.dtype, kv_cache_memory=args.kv_cache_memory,
                       tensor_parallel_size=size, max_num_seqs=max(256, batches[-1]), progress=False)
    try:
        arch = eng.arch
        print(eng.info.summary())
        small, large = eng.tp.probe((1, LARGE))
        link = Link.from_probe(small, large, LARGE, size)
        print(f"machine    load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (other processes share them)")
        print(f"link       gloo all-reduce between {size} ranks: {small * 1e6:.0f} us for 1 float, {large * 1e3:.2f} ms "
              f"for 1 MiB -> latency {link.latency * 1e6:.0f} us, {link.bandwidth / 1e9:.2f} GB/s per rank")
        print(f"\n{'step':<22}{'collectives':>12}{'predicted':>12}{'measured':>12}{'error':>8}{'step time':>11}"
              f"{'comm share':>12}")
        cases = [(f"prefill {PREFILL} tokens", 1, PREFILL, PREFILL, 1)]
        cases += [(f"decode batch {b}", b, PROMPT, b, b) for b in batches]
        for label, batch, length, tokens, sampled in cases:
            seconds, calls, step = _measure(eng, batch, length, args.steps, batch + length)
            pred, n = tp_step_comm(arch.num_layers, arch.hidden_size, arch.vocab_size, size, tokens, sampled, link)
            err = (pred - seconds) / seconds if seconds else float("nan")
            print(f"{label:<22}{n:>5} / {calls:<5.0f}{pred * 1e3:>10.2f}ms{seconds * 1e3:>10.2f}ms{err:>+8.0%}"
                  f"{step * 1e3:>9.1f}ms{seconds / step:>11.0%}")
        print("collectives: predicted / measured per step. measured = rank 0's time inside collectives, waits "
              "for the slower rank included; error = (predicted - measured) / measured; wall time, under "
              "whatever else runs on this machine.")
    finally:
        eng.close()
    return 0
