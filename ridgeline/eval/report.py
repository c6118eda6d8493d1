"""The printed results table, the sweep's ranking and the JSON payload of `ridgeline eval`."""
from __future__ import annotations

from ridgeline.eval.harness import Result


def _pct(value: float, ref: float) -> str:
    return f"{100 * (value / ref - 1):+.2f}%"


def table(ref: Result, results: list[Result]) -> str:
    head = (f"{'setting':<34}{'weights MB':>11}{'perplexity':>12}{'vs ref':>9}{'top-1 agree':>13}{'mean KL':>10}"
            f"{'tokens to diverge':>19}{'identical':>11}")
    lines = [head, "-" * len(head)]
    for r in [ref, *results]:
        agree = "-" if r.agreement is None else f"{r.agreement:.4f}"
        kl = "-" if r.kl is None else f"{r.kl:.5f}"
        div = f"{r.mean_divergence:.1f} / {r.gen_tokens}" if r.divergence else "-"
        same = f"{r.identical:.0%}" if r.divergence else "-"
        lines.append(f"{r.name:<34}{r.weight_bytes / 1e6:>11.1f}{r.perplexity:>12.3f}"
                     f"{'' if r is ref else _pct(r.perplexity, ref.perplexity):>9}{agree:>13}{kl:>10}{div:>19}"
                     f"{same:>11}")
    return "\n".join(lines)


def position_lines(results: list[Result]) -> list[str]:
    """Top-1 agreement by window position (positions 0-127, 128-1023, ...): does error compound with depth?"""
    lines = []
    for r in results:
        if r.agreement_by_position:
            spans = ", ".join(f"{span} {a:.4f}" for span, a in r.agreement_by_position.items())
            lines.append(f"top-1 agreement by position  {r.name}: {spans}")
    return lines


def memory_lines(results: list[Result], window: int) -> list[str]:
    """The KV memory a request holds under each eviction setting, against the window's whole context."""
    lines = []
    for r in results:
        if r.kv_tokens is not None:
            held = min(r.kv_tokens, window)
            lines.append(f"KV per request  {r.name}: at most {held} of {window} tokens "
                         f"({1 - held / window:.0%} saved)")
    return lines


def ranking_lines(ranked: list[Result], ref: Result) -> list[str]:
    lines = ["sensitivity ranking (each component quantized alone; most sensitive first):"]
    for i, r in enumerate(ranked, 1):
        lines.append(f"  {i}. {r.component or r.name:<28} mean KL {r.kl:.5f}, perplexity "
                     f"{_pct(r.perplexity, ref.perplexity)}, top-1 agreement {r.agreement:.4f}  ({r.name})")
    return lines
