"""What a sparse model's experts did during a timed run: per-expert load (the counts expert
placement will balance), its imbalance, experts read per layer step and the bytes that means.

Bytes of experts touched = sum over sparse-layer calls of (experts that had a token) x (bytes of
one expert as stored). Over the run's elapsed time that is the bandwidth the experts alone drew;
the dense parts (attention, router, embeddings, LM head) come on top, once per step. Per engine step
(one call of every sparse layer) the same figures read as: the expert bytes a step must touch, the
mean wall time of a step, and their ratio beside this machine's measured memory-read peak (the
advisor's cached profile, when `ridgeline advise --hardware local` has measured it): how far the experts'
reads are from the bandwidth floor.
"""
from __future__ import annotations

from ridgeline.distributed.expert_load import sparse_layers, summarize


def reset(model) -> None:
    for m in sparse_layers(model):
        m.reset_stats()


def collect(model, elapsed: float) -> dict | None:
    """Per-expert load and expert bytes of everything since `reset`; None for a dense model."""
    layers = sparse_layers(model)
    if not layers:
        return None
    loads = {m.index: m.load_counts.tolist() for m in layers}
    touched = sum(m.touched[0] for m in layers)
    calls = sum(m.touched[1] for m in layers)
    per_expert = layers[0].expert_bytes()
    summary = summarize(layers)
    ep = {k: summary[k] for k in ("ranks", "rank_pairs", "rank_imbalance")} if "ranks" in summary else None
    steps = calls // len(layers)  # every forward calls each sparse layer once
    return {"experts": layers[0].num_experts, "top_k": layers[0].top_k, "sparse_layers": len(layers),
            "steps": steps, "expert_bytes_per_step": touched * per_expert / steps if steps else 0.0,
            "step_ms": elapsed / steps * 1e3 if steps else 0.0, **_peak(),
            "expert_bytes": per_expert, "layer_calls": calls, "routed_pairs": summary["pairs"],
            "experts_touched_per_call": touched / calls if calls else 0.0,
            "expert_bytes_touched": touched * per_expert,
            "expert_gb_per_s": touched * per_expert / elapsed / 1e9 if elapsed > 0 else 0.0,
            "imbalance_max_over_mean": summary["expert_imbalance"], "expert_parallel": ep,
            "load_counts": loads}


def lines(stats: dict) -> list[str]:
    per_call = stats["experts_touched_per_call"]
    imb = stats["imbalance_max_over_mean"]
    first = next(iter(stats["load_counts"].values()))
    return [
        f"MoE: {stats['experts']} experts, top-{stats['top_k']}, {stats['sparse_layers']} sparse layers, "
        f"{stats['expert_bytes'] / 2**20:.2f} MiB an expert",
        f"  experts read per layer step: {per_call:.1f} of {stats['experts']} "
        f"({per_call * stats['expert_bytes'] / 2**20:.1f} MiB); {stats['expert_bytes_touched'] / 1e9:.2f} GB of "
        f"experts over the run = {stats['expert_gb_per_s']:.2f} GB/s from the experts alone",
        _step_line(stats),
        f"  per-expert load, max / mean per layer: min {imb['min']:.2f}, mean {imb['mean']:.2f}, max {imb['max']:.2f}",
        f"  layer {next(iter(stats['load_counts']))} load counts: {' '.join(map(str, first))}",
    ] + _rank_lines(stats.get("expert_parallel"))


def _step_line(stats: dict) -> str:
    mib, ms = stats["expert_bytes_per_step"] / 2**20, stats["step_ms"]
    line = (f"  per engine step ({stats['steps']} steps): {mib:.1f} MiB of experts touched in {ms:.2f} ms = "
            f"{stats['expert_gb_per_s']:.2f} GB/s achieved")
    peak = stats.get("peak_gb_per_s")
    if peak:
        floor = mib * 2**20 / (peak * 1e9) * 1e3
        threads = f" on {stats['peak_threads']} threads" if stats.get("peak_threads") else ""
        line += (f"; the machine's measured read peak{threads} {peak:.1f} GB/s would read them in {floor:.2f} ms "
                 f"({stats['expert_gb_per_s'] / peak:.0%} of it achieved)")
    else:
        line += (" (no measured read peak for this thread count: `ridgeline advise --hardware local` measures "
                 "and caches it)")
    return line


def _peak() -> dict:
    """The cached profile's read peak for this process's thread count (under parallelism, rank 0's):
    {"peak_gb_per_s", "peak_threads"}, None values when nothing is cached."""
    try:
        from ridgeline.advisor.local_profile import cached_profile
        profile = cached_profile()
    except Exception:  # the advisor is optional here: no peak, no comparison
        profile = None
    if not profile or not profile.get("bandwidth"):
        return {"peak_gb_per_s": None, "peak_threads": None}
    return {"peak_gb_per_s": profile["bandwidth"] / 1e9, "peak_threads": profile.get("threads")}


def _rank_lines(ep: dict | None) -> list[str]:
    if not ep:
        return []
    imb = ep["rank_imbalance"]
    return [f"  expert parallel over {ep['ranks']} ranks: pairs per rank {' '.join(map(str, ep['rank_pairs']))}; "
            f"busiest rank / mean per layer: min {imb['min']:.2f}, mean {imb['mean']:.2f}, max {imb['max']:.2f}"]
