"""Figure for `ridgeline bench spec --plot`: speed-up vs batch size, one line per proposer setting,
one panel per workload, with the break-even line and the 3% floor the controller must keep."""
from __future__ import annotations


def plot_speedup(rows: list[dict], path: str, title: str = "") -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    fig, axes = plt.subplots(1, len(workloads), figsize=(5.5 * len(workloads), 4.2), squeeze=False)
    for ax, w in zip(axes[0], workloads):
        mine = [r for r in rows if r["workload"] == w and r["k"] > 0]
        for label in dict.fromkeys(r["setting"] for r in mine):
            pts = sorted((r["batch"], r["speedup"]) for r in mine if r["setting"] == label)
            style = "-o" if "ctrl" in label else "--."
            ax.plot([b for b, _ in pts], [s for _, s in pts], style, label=label)
        ax.axhline(1.0, color="grey", linewidth=1)
        ax.axhline(0.97, color="C3", linewidth=0.8, linestyle=":", label="0.97x")
        ax.set_xscale("log", base=2)
        batches = sorted({r["batch"] for r in mine})
        ax.set_xticks(batches, [str(b) for b in batches])
        ax.set_xlabel("batch size (requests)")
        ax.set_ylabel("decode tok/s vs no speculation")
        ax.set_title(w, fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
