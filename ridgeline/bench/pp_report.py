"""The pipeline-parallel part of an offline bench run: each stage's step time, compute time, time
blocked in point-to-point calls (the bubble) and bytes sent, its resident weight and KV bytes, and the
advisor's prediction beside them: bubble (N-1) / (M+N-1) for the micro-batches the steps really had,
and the point-to-point time of the step's bytes over the link measured just before the run
(advisor/parallel_comm.py). Measured communication: the activation transfers as the receiving stages
time them (distributed/pipeline.py). Empty for an engine without pipeline stages."""
from __future__ import annotations

import weakref

from ridgeline.advisor.parallel_comm import Link, pp_step_comm
from ridgeline.distributed.stages import bubble_fraction

PROBE_FLOATS = 1 << 18
_links: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # engine -> its link, measured once


def reset(engine) -> Link | None:
    """Before the timed run: measure the link (once per engine), then zero every stage's counters; the
    link, for collect (None without pipeline stages)."""
    pp = engine.pp
    if pp is None:
        return None
    if engine not in _links:
        small, large = pp.probe((1, PROBE_FLOATS))
        # the large message's own time: its excess over the small one's, unless noise (a loaded machine)
        # leaves too little of it to trust; then its whole time (a lower bound on the bandwidth)
        moving = large - small if large - small > 0.1 * large else large
        _links[engine] = Link(small, PROBE_FLOATS * 4 / moving)
    engine.runner.reset_pipeline_stats()
    return _links[engine]


def collect(engine, link: Link | None, elapsed: float) -> dict | None:
    pp = engine.pp
    if pp is None:
        return None
    stats, info, arch = engine.runner.pipeline_stats(), engine.info.pipeline_parallel, engine.arch
    s0 = stats[0]
    steps = max(s0.steps, 1)
    rows, mb = s0.rows / steps, s0.microbatches / steps  # per step, mean
    pred_s, msgs = pp_step_comm(arch.hidden_size, pp.ctx.size, rows, round(mb), link)
    return {"size": pp.ctx.size, "steps": s0.steps, "rows_per_step": rows, "microbatches_per_step": mb,
            "step_ms": 1e3 * elapsed / steps,
            "stages": [{"stage": s.stage, "layers": list(s.layers), "step_ms": 1e3 * s.step_s / steps,
                        "compute_ms": 1e3 * s.compute_s / steps, "blocked_ms": 1e3 * (s.recv_s + s.send_s) / steps,
                        "bubble": s.bubble, "sent_bytes_per_step": s.sent_bytes / steps,
                        "weight_bytes": info.stages[s.stage][1], "kv_bytes": info.stages[s.stage][2],
                        "kv_tokens": info.stages[s.stage][3]} for s in stats],
            "comm_ms_per_step": 1e3 * sum(s.transfer_s for s in stats) / steps,
            "predicted_comm_ms_per_step": 1e3 * pred_s, "predicted_messages_per_step": msgs,
            "predicted_bubble": bubble_fraction(pp.ctx.size, max(mb, 1.0)),
            "link_latency_us": 1e6 * link.latency, "link_gbps": link.bandwidth / 1e9,
            "kv_tokens": info.tokens, "one_process_kv_tokens": info.one_process_tokens}


def lines(d: dict) -> list[str]:
    out = [f"pipeline parallel {d['size']}: {d['steps']} steps, {d['rows_per_step']:.1f} rows and "
           f"{d['microbatches_per_step']:.2f} micro-batches per step (mean), {d['step_ms']:.1f} ms per step"]
    for s in d["stages"]:
        out.append(f"  stage {s['stage']} (layers {s['layers'][0]}..{s['layers'][1] - 1}): compute "
                   f"{s['compute_ms']:.2f} ms, blocked {s['blocked_ms']:.2f} ms of {s['step_ms']:.2f} ms per step: "
                   f"bubble {s['bubble']:.0%}; sent {s['sent_bytes_per_step'] / 1e3:.1f} kB per step; weights "
                   f"{s['weight_bytes'] / 1e6:.1f} MB, KV {s['kv_bytes'] / 2**20:.0f} MiB ({s['kv_tokens']} tokens)")
    out += [f"  communication (activation transfers as the receiving stages timed them): {d['comm_ms_per_step']:.3f} "
            "ms per step; "
            f"advisor prediction {d['predicted_comm_ms_per_step']:.3f} ms ({d['predicted_messages_per_step']} "
            f"messages; link {d['link_latency_us']:.0f} us, {d['link_gbps']:.2f} GB/s measured by a ping-pong "
            "probe before the run)",
            f"  advisor bubble (N-1)/(M+N-1) at {d['microbatches_per_step']:.2f} micro-batches: "
            f"{d['predicted_bubble']:.0%} (measured: " + ", ".join(f"stage {s['stage']} {s['bubble']:.0%}"
                                                                   for s in d["stages"]) + ")",
            f"  KV capacity {d['kv_tokens']} tokens per stage budget vs {d['one_process_kv_tokens']} with every "
            "layer in one process"]
    return out
