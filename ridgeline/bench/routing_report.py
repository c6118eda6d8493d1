"""The tables and verdicts of `ridgeline bench routing`: one row per run, per-policy means, the
cache-aware vs round-robin ratios against the targets, and per-request diagnostics (which replica
each tenant's requests reached, the router's predicted cached tokens against the replica's)."""
from __future__ import annotations

import statistics
from collections import Counter

# cache-aware vs round-robin: hit rate at least x1.6, mean TTFT at least 1.5x lower, no replica above 65%
TARGETS = {"hit_rate_gain": 1.6, "ttft_speedup": 1.5, "max_share": 0.65}
METRICS = ("hit_rate", "mean_ttft_s", "p90_ttft_s", "mean_e2e_s")


def run_stats(policy: str, records: list[dict], replicas: int) -> dict:
    """One run's numbers from its per-request records (tenant, replica, predicted, cached, prompt, ttft)."""
    ok = [r for r in records if "error" not in r]
    ttfts = sorted(r["ttft"] for r in ok)
    share = Counter(r["replica"] for r in ok)
    tenants = Counter(r["tenant"] for r in ok)
    home = Counter()  # tenant -> requests on its most used replica
    for t in tenants:
        home[t] = max(Counter(r["replica"] for r in ok if r["tenant"] == t).values())
    prompt = sum(r["prompt_tokens"] for r in ok)
    return {"policy": policy, "requests": len(records), "errors": len(records) - len(ok),
            "hit_rate": sum(r["cached"] for r in ok) / prompt if prompt else 0.0,
            "mean_ttft_s": statistics.fmean(ttfts) if ttfts else float("nan"),
            "p90_ttft_s": ttfts[int(0.9 * (len(ttfts) - 1))] if ttfts else float("nan"),
            "mean_e2e_s": statistics.fmean(r["e2e"] for r in ok) if ok else float("nan"),
            "share": [share[i] / max(1, len(ok)) for i in range(replicas)],
            "home": sum(home.values()) / max(1, len(ok)),
            "mispredicted": sum(1 for r in ok if r["predicted"] != r["cached"]),
            "first_error": next((r["error"] for r in records if "error" in r), None)}


def row(r: dict) -> str:
    shares = " / ".join(f"{s:.0%}" for s in r["share"])
    return (f"| {r['policy']} | {r['hit_rate']:.1%} | {r['mean_ttft_s']:.3f} | {r['p90_ttft_s']:.3f} | "
            f"{r['mean_e2e_s']:.3f} | {shares} | {r.get('home', 0):.0%} | {r.get('mispredicted', 0)} | "
            f"{r['errors']} |")


HEADER = ["| policy | prefix hit rate | mean TTFT (s) | p90 TTFT (s) | mean e2e (s) | requests per replica "
          "| on tenant's home | cached != predicted | errors |", "|---|---|---|---|---|---|---|---|---|"]


def summarize(runs: list[dict], policies: list[str]) -> dict:
    mean = {p: {k: statistics.fmean(r[k] for r in runs if r["policy"] == p) for k in METRICS} for p in policies}
    lines = HEADER + [row(r) for r in runs]
    summary = {"by_policy": mean}
    if "round-robin" in mean and "cache-aware" in mean:
        rr, ca = mean["round-robin"], mean["cache-aware"]
        gain = summary["hit_rate_gain"] = ca["hit_rate"] / rr["hit_rate"] if rr["hit_rate"] else float("inf")
        speedup = summary["ttft_speedup"] = rr["mean_ttft_s"] / ca["mean_ttft_s"]
        busiest = summary["max_share_cache_aware"] = max(max(r["share"]) for r in runs
                                                         if r["policy"] == "cache-aware")
        met = summary["targets_met"] = {"hit_rate_gain": gain >= TARGETS["hit_rate_gain"],
                                        "ttft_speedup": speedup >= TARGETS["ttft_speedup"],
                                        "max_share": busiest <= TARGETS["max_share"]}
        verdict = lambda ok: "met" if ok else "NOT met"  # noqa: E731
        lines += [f"\ncache-aware vs round-robin (means over {len(runs) // len(policies)} interleaved repeats):",
                  f"  prefix hit rate x{gain:.2f}  (target >= x{TARGETS['hit_rate_gain']}: "
                  f"{verdict(met['hit_rate_gain'])})",
                  f"  mean TTFT {speedup:.2f}x lower  (target >= {TARGETS['ttft_speedup']}x: "
                  f"{verdict(met['ttft_speedup'])})",
                  f"  busiest replica {busiest:.0%} of the requests  (target <= {TARGETS['max_share']:.0%}: "
                  f"{verdict(met['max_share'])})"]
    return {"table": "\n".join(lines), "summary": summary}
