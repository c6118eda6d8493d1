"""Latency-distribution figure for `ridgeline bench serve --plot`: CDFs of TTFT, TPOT and e2e latency, and a
histogram of inter-token latencies, with p50/p99 marks and the SLOs given."""
from __future__ import annotations

from ridgeline.bench.loadgen import RequestResult, percentile


def _cdf(ax, values_ms: list[float], title: str, slo_ms: float | None = None) -> None:
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("ms")
    ax.grid(True, alpha=0.3)
    if not values_ms:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        return
    xs = sorted(values_ms)
    n = len(xs)
    ax.step(xs, [(i + 1) / n for i in range(n)], where="post", color="C0")
    ax.set_ylim(0, 1.02)
    ax.set_ylabel("fraction of requests")
    for p, style in ((50, "--"), (99, ":")):
        v = percentile(xs, p)
        ax.axvline(v, color="C1", linestyle=style, linewidth=1, label=f"p{p} {v:.1f} ms")
    if slo_ms is not None:
        if slo_ms <= xs[-1] * 1.5:
            ax.axvline(slo_ms, color="C3", linewidth=1.5, label=f"SLO {slo_ms:g} ms")
        else:  # far right of the data: name it rather than squash the curve
            ax.plot([], [], color="C3", linewidth=1.5, label=f"SLO {slo_ms:g} ms (off the axis)")
    ax.legend(fontsize=8, loc="lower right")


def plot_latency(results: list[RequestResult], path: str, title: str = "", slo: dict | None = None) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    slo = slo or {}
    ms = lambda v: None if v is None else v * 1000  # noqa: E731
    ok = [r for r in results if r.ok]
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    _cdf(axes[0][0], [r.ttft * 1000 for r in ok], "Time to first token", ms(slo.get("ttft")))
    _cdf(axes[0][1], [r.tpot * 1000 for r in ok if r.tpot is not None], "Time per output token (after the first)",
         ms(slo.get("tpot")))
    itl = [x * 1000 for r in ok for x in r.itl]
    ax = axes[1][0]
    ax.set_title("Inter-token latency (all streamed chunks)", fontsize=10)
    ax.set_xlabel("ms")
    ax.set_ylabel("chunks (log)")
    ax.grid(True, alpha=0.3)
    if itl:
        ax.hist(itl, bins=min(80, max(10, len(itl) // 20)), color="C0")
        ax.set_yscale("log")  # stalls (a prefill between decode steps) are rare but long: keep them visible
        for p, style in ((50, "--"), (99, ":")):
            v = percentile(itl, p)
            ax.axvline(v, color="C1", linestyle=style, linewidth=1, label=f"p{p} {v:.1f} ms")
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    _cdf(axes[1][1], [r.e2e * 1000 for r in ok], "End-to-end latency", ms(slo.get("e2e")))
    failed = len(results) - len(ok)
    fig.suptitle(f"{title}\n{len(ok)} requests" + (f", {failed} failed" if failed else ""), fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
