"""The tensor-parallel part of an offline bench run: rank 0's time inside collectives per step, each
rank's resident weight and KV bytes, and the advisor's prediction of the same communication from the
link measured just before the run (advisor/parallel_comm.py). Empty for a one-process engine."""
from __future__ import annotations

import os
import weakref

from ridgeline.advisor.parallel_comm import Link, tp_step_comm

PROBE_FLOATS = 1 << 18
_links: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # engine -> its link, measured once


def cpu_seconds(engine) -> float:
    """CPU time (user + system) of this process and of the ranks it started: what a run costs on a
    shared machine, where wall time also holds other processes' turns."""
    t = os.times()
    total = t.user + t.system
    group = engine.group  # tensor-parallel ranks or pipeline stages
    for pid in (group.workers.pids if group is not None and group.workers is not None else ()):
        try:
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            pass
    return total


def reset(engine) -> float:
    """Before the timed run: measure the link (once per engine), then zero the counters; the CPU time
    so far, for collect."""
    tp = engine.tp
    if tp is None or tp.comm is None:  # one process, or expert parallelism (its exchange is in the MoE report)
        return cpu_seconds(engine)
    if engine not in _links:
        small, large = tp.probe((1, PROBE_FLOATS))
        _links[engine] = Link.from_probe(small, large, PROBE_FLOATS, tp.ctx.size)
    tp.comm.reset()
    return cpu_seconds(engine)


def collect(engine, cpu0: float, elapsed: float, prompt_tokens: int, output_tokens: int) -> dict:
    tp = engine.tp
    cpu = cpu_seconds(engine) - cpu0
    if tp is None or tp.comm is None:
        return {"size": 1, "cpu_s": cpu, "cpu_ms_per_output_token": 1e3 * cpu / max(output_tokens, 1)}
    comm, arch, link = tp.comm, engine.arch, _links[engine]
    steps = max(comm.forwards, 1)
    tokens, sampled = (prompt_tokens + output_tokens) / steps, output_tokens / steps  # rows per step, mean
    pred, n = tp_step_comm(arch.num_layers, arch.hidden_size, arch.vocab_size, tp.ctx.size, tokens, sampled, link)
    info = engine.info.tensor_parallel
    return {"size": tp.ctx.size, "steps": comm.forwards, "comm_s": comm.seconds, "collectives": comm.calls,
            "comm_ms_per_step": 1e3 * comm.seconds / steps, "step_ms": 1e3 * elapsed / steps,
            "predicted_comm_ms_per_step": 1e3 * pred, "predicted_collectives_per_step": n,
            "rows_per_step": tokens, "link_latency_us": 1e6 * link.latency, "link_gbps": link.bandwidth / 1e9,
            "rank_weight_bytes": [w for _, w, _ in info.ranks], "rank_kv_bytes": [kv for _, _, kv in info.ranks],
            "cpu_s": cpu, "cpu_ms_per_output_token": 1e3 * cpu / max(output_tokens, 1)}


def lines(d: dict) -> list[str]:
    cpu = f"CPU time {d['cpu_s']:.1f} s over all ranks, {d['cpu_ms_per_output_token']:.1f} ms per output token"
    if d["size"] == 1:
        return [cpu]
    ranks = ", ".join(f"rank {r}: weights {w / 1e6:.1f} MB, KV {kv / 2**20:.0f} MiB"
                      for r, (w, kv) in enumerate(zip(d["rank_weight_bytes"], d["rank_kv_bytes"])))
    return [f"tensor parallel {d['size']}: {d['steps']} steps, {d['rows_per_step']:.1f} rows per step (mean)",
            f"  communication (rank 0, waits for the slower rank included): {d['comm_ms_per_step']:.2f} ms per step "
            f"of {d['step_ms']:.1f} ms ({d['comm_ms_per_step'] / d['step_ms']:.0%}), "
            f"{d['collectives'] / max(d['steps'], 1):.0f} collectives per step",
            f"  advisor prediction: {d['predicted_comm_ms_per_step']:.2f} ms per step "
            f"({d['predicted_collectives_per_step']} collectives; link {d['link_latency_us']:.0f} us, "
            f"{d['link_gbps']:.2f} GB/s measured by an all-reduce probe before the run)",
            f"  per rank: {ranks}", "  " + cpu]
