"""`--plot roofline.png`: attainable FLOP/s vs arithmetic intensity, with the workload's steps on it."""
from __future__ import annotations

from ridgeline.advisor.roofline import decode_step, prefill
from ridgeline.advisor.scenario import Scenario
from ridgeline.advisor.units import fmt_rate


def plot_roofline(s: Scenario, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    F, BW = s.pl.rate * s.pl.tp, s.hw.bandwidth * s.pl.tp
    ridge_ai = F / BW
    ctx = s.w.mean_decode_context
    points = [(f"decode B={b}", decode_step(s.pl, b, ctx)) for b in (1, 4, 16, 64, 256, 1024) if b != s.concurrency]
    points.append((f"decode B={s.concurrency:g} (workload)", decode_step(s.pl, s.concurrency, ctx)))
    points.append((f"prefill {s.w.prompt_len} tokens", prefill(s.pl, s.w.prompt_len)))
    ais = [t.flops / t.bytes for _, t in points]
    lo, hi = min(ais + [ridge_ai]) / 4, max(ais + [ridge_ai]) * 4
    xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    fig, ax = plt.subplots(figsize=(8, 5.5))
    ax.loglog(xs, [min(F, x * BW) for x in xs], color="black", lw=2, label="roof: min(F, AI x BW)")
    ax.axvline(ridge_ai, color="gray", ls="--",
               label=f"ridge AI {ridge_ai:.0f} FLOP/B" + (f" (decode batch ~{s.ridge:.0f})" if s.ridge else ""))
    labelled: list[float] = []
    for (name, t), ai in zip(points, ais):
        achieved = t.flops / max(t.memory, t.compute)
        workload = "workload" in name or name.startswith("prefill")
        ax.scatter([ai], [achieved], s=90 if workload else 25, zorder=3,
                   marker="*" if workload else "o", label=name if workload else None)
        if workload or all(abs(ai / x - 1) > 0.5 for x in labelled):  # keep labels from piling up on the roof
            labelled.append(ai)
            ax.annotate(name.split(" (")[0], (ai, achieved), textcoords="offset points", fontsize=8,
                        xytext=(5, -12 - 10 * (len(labelled) % 2)))
    ax.set_xlabel("arithmetic intensity (FLOP per byte moved)")
    ax.set_ylabel("attainable FLOP/s")
    ax.set_title(f"{s.spec.name} on {s.layout.describe()} of {s.hw.name}: "
                 f"{s.hw.compute_precision(s.w.weight_precision)} {fmt_rate(F, 'FLOP/s')}", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
