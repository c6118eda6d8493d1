"""Per-expert load of a model's sparse layers, as the bench and /metrics report it: (token, slot)
pairs each expert received (SparseMoE's counters: under expert parallelism the whole group's load,
on every rank), the imbalance max / mean per layer, and under expert parallelism the pairs each
rank ran (its contiguous block of experts) with their imbalance: the busiest rank sets the pace."""
from __future__ import annotations


def sparse_layers(model) -> list:
    from ridgeline.layers.moe import SparseMoE
    return [m for m in model.modules() if isinstance(m, SparseMoE)]


def imbalance(counts: list[int]) -> float | None:
    """max / mean, None where nothing was routed."""
    total = sum(counts)
    return max(counts) * len(counts) / total if total else None


def summarize(layers: list) -> dict:
    """{"pairs", "expert_imbalance": {min, mean, max} over layers, and with expert parallelism
    "ranks", "rank_pairs" [N] summed over layers, "rank_imbalance" {min, mean, max}}."""
    loads = [m.load_counts.tolist() for m in layers]
    out = {"pairs": sum(map(sum, loads)), "expert_imbalance": _spread(imbalance(c) for c in loads)}
    ep = layers[0].ep if layers else None
    if ep is not None:
        n, blocks = ep.placement.world, ep.placement.blocks
        ranks = [[sum(c[a:b]) for a, b in blocks] for c in loads]
        out.update(ranks=n, rank_pairs=[sum(col) for col in zip(*ranks)],
                   rank_imbalance=_spread(imbalance(r) for r in ranks))
    return out


def _spread(values) -> dict:
    vals = [v for v in values if v is not None]
    if not vals:
        return {"min": 0.0, "mean": 0.0, "max": 0.0}
    return {"min": min(vals), "mean": sum(vals) / len(vals), "max": max(vals)}


def metric_families(model):
    """Prometheus families (prometheus_client) for /metrics; nothing for a dense model. Read at scrape
    time from counters the step thread adds to: a scrape may see a step half counted."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    layers = sparse_layers(model)
    if not layers:
        return
    s = summarize(layers)
    yield CounterMetricFamily("ridgeline_moe_routed_pairs", "(token, expert) pairs routed in all sparse layers",
                              value=s["pairs"])
    fam = CounterMetricFamily("ridgeline_moe_expert_routed_pairs", "(token, expert) pairs routed to each expert of "
                              "each sparse layer (the tokens it ran)", labels=["layer", "expert"])
    for m in layers:
        for e, n in enumerate(m.load_counts.tolist()):
            fam.add_metric([str(m.index), str(e)], n)
    yield fam
    fam = GaugeMetricFamily("ridgeline_moe_expert_load_imbalance", "Busiest expert's load over the mean load of "
                            "its layer (max / mean), over the sparse layers", labels=["stat"])
    for stat, v in s["expert_imbalance"].items():
        fam.add_metric([stat], v)
    yield fam
    if "ranks" in s:
        fam = CounterMetricFamily("ridgeline_moe_rank_routed_pairs", "(token, expert) pairs each expert-parallel "
                                  "rank's experts ran, all sparse layers", labels=["rank"])
        for r, v in enumerate(s["rank_pairs"]):
            fam.add_metric([str(r)], v)
        yield fam
        fam = GaugeMetricFamily("ridgeline_moe_rank_load_imbalance", "Busiest expert-parallel rank's pairs over "
                                "the mean per rank (max / mean), over the sparse layers", labels=["stat"])
        for stat, v in s["rank_imbalance"].items():
            fam.add_metric([stat], v)
        yield fam
