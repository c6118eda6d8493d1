"""Figure for `ridgeline bench quant --plot`: the ladder as a Pareto plot. x: batch-1 decode speed-up
over the reference, y: mean KL against it (lower is better, log scale; the reference sits on the floor),
point area proportional to the weight bytes; the non-dominated rungs joined by a line."""
from __future__ import annotations

KL_FLOOR = 1e-6  # where a rung with no measurable KL (the reference) is drawn on the log axis


def pareto(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats in both speed (higher) and KL (lower), by speed."""
    keep = [i for i, (s, k) in enumerate(points)
            if not any((s2 >= s and k2 <= k) and (s2, k2) != (s, k) for s2, k2 in points)]
    return sorted(keep, key=lambda i: points[i][0])


def plot_pareto(rows: list[dict], path: str, title: str = "") -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base = rows[0]["decode_b1_tok_s"]
    pts = [(r["decode_b1_tok_s"] / base, max(r["kl"] or 0.0, KL_FLOOR)) for r in rows]
    biggest = max(r["weight_bytes"] for r in rows)
    fig, ax = plt.subplots(figsize=(6.4, 4.6))
    for r, (s, k) in zip(rows, pts):
        ax.scatter([s], [k], s=600 * r["weight_bytes"] / biggest, alpha=0.6)
        ax.annotate(f"{r['name']}\n{r['weight_bytes'] / 1e6:.0f} MB", (s, k), fontsize=8,
                    textcoords="offset points", xytext=(8, 4))
    front = pareto(pts)
    ax.plot([pts[i][0] for i in front], [pts[i][1] for i in front], "--", color="grey", linewidth=1)
    ax.set_yscale("log")
    ax.set_xlabel(f"batch-1 decode speed vs {rows[0]['name']} (x)")
    ax.set_ylabel("mean KL vs the reference (nats, lower is better)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
