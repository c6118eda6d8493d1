"""`--plot roofline.png`: attainable FLOP/s vs arithmetic intensity, with the workload's steps on it."""
from __future__ import annotations

from ridgeline.advisor.roofline import decode_step, prefill
from ridgeline.advisor.scenario import Scenario
from ridgeline.advisor.units import fmt_rate


def roofline_points(s: Scenario) -> dict:
    """The roof (peak F and bandwidth over the devices of a layer) and the workload's steps on it: decode at
    a few batch sizes and the workload's own, and its prefill; each at FLOP per byte moved."""
    F, BW = s.pl.rate * s.pl.tp, s.hw.bandwidth * s.pl.tp
    ctx = s.w.mean_decode_context
    steps = [(f"decode B={b}", decode_step(s.pl, b, ctx), False) for b in (1, 4, 16, 64, 256, 1024)
             if b != s.concurrency]
    steps.append((f"decode B={s.concurrency:g} (workload)", decode_step(s.pl, s.concurrency, ctx), True))
    steps.append((f"prefill {s.w.prompt_len} tokens", prefill(s.pl, s.w.prompt_len), True))
    points = [{"name": name, "ai": t.flops / t.bytes, "achieved": t.flops / max(t.memory, t.compute),
               "bound": t.bound, "workload": workload} for name, t, workload in steps]
    ais = [p["ai"] for p in points] + [F / BW]
    lo, hi = min(ais) / 4, max(ais) * 4  # the x range drawn: every point and the ridge, with a margin
    roof = [[lo, lo * BW], [F / BW, F], [hi, F]]  # min(F, AI x BW): a slope, the ridge, the flat peak
    return {"peak": F, "bandwidth": BW, "ridge_ai": F / BW, "ridge_batch": s.ridge, "points": points, "roof": roof,
            "title": f"{s.spec.name} on {s.layout.describe()} of {s.hw.name}: "
                     f"{s.hw.compute_precision(s.w.weight_precision)} {fmt_rate(F, 'FLOP/s')}"}


def plot_roofline(s: Scenario, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    r = roofline_points(s)
    F, BW, ridge_ai = r["peak"], r["bandwidth"], r["ridge_ai"]
    points = [(p["name"], p) for p in r["points"]]
    ais = [p["ai"] for _, p in points]
    lo, hi = r["roof"][0][0], r["roof"][-1][0]
    xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    fig, ax = plt.subplots(figsize=(8, 5.5))
    ax.loglog(xs, [min(F, x * BW) for x in xs], color="black", lw=2, label="roof: min(F, AI x BW)")
    ax.axvline(ridge_ai, color="gray", ls="--",
               label=f"ridge AI {ridge_ai:.0f} FLOP/B" + (f" (decode batch ~{s.ridge:.0f})" if s.ridge else ""))
    labelled: list[float] = []
    for (name, p), ai in zip(points, ais):
        achieved, workload = p["achieved"], p["workload"]
        ax.scatter([ai], [achieved], s=90 if workload else 25, zorder=3,
                   marker="*" if workload else "o", label=name if workload else None)
        if workload or all(abs(ai / x - 1) > 0.5 for x in labelled):  # keep labels from piling up on the roof
            labelled.append(ai)
            ax.annotate(name.split(" (")[0], (ai, achieved), textcoords="offset points", fontsize=8,
                        xytext=(5, -12 - 10 * (len(labelled) % 2)))
    ax.set_xlabel("arithmetic intensity (FLOP per byte moved)")
    ax.set_ylabel("attainable FLOP/s")
    ax.set_title(r["title"], fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
