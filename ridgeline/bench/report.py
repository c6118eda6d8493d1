"""Results and the printed tables shared by the bench subcommands."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class RunResult:
    """One timed run: `requests` requests measured (of `total_requests` in the workload)."""
    name: str
    requests: int
    prompt_tokens: int
    output_tokens: int
    elapsed: float
    total_requests: int | None = None
    note: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def output_tps(self) -> float:
        return self.output_tokens / self.elapsed if self.elapsed > 0 else float("nan")

    @property
    def total_tps(self) -> float:
        return (self.prompt_tokens + self.output_tokens) / self.elapsed if self.elapsed > 0 else float("nan")

    @property
    def subsampled(self) -> bool:
        return self.total_requests is not None and self.requests < self.total_requests

    @property
    def est_full_elapsed(self) -> float:
        """Elapsed scaled to the whole workload at the measured total tok/s (== elapsed if not subsampled)."""
        return self.elapsed * (self.total_requests / self.requests) if self.subsampled else self.elapsed

    def gflops(self, num_params: int) -> float:
        """Useful model FLOPs (2 * params per processed token; attention and padding not counted)."""
        return 2 * num_params * self.total_tps / 1e9

    def to_dict(self, num_params: int | None = None) -> dict:
        d = asdict(self)
        d.update(output_tok_per_s=self.output_tps, total_tok_per_s=self.total_tps,
                 subsampled=self.subsampled, est_full_elapsed=self.est_full_elapsed)
        if num_params:
            d["gflop_per_s"] = self.gflops(num_params)
        return d


def throughput_table(results: list[RunResult], num_params: int) -> str:
    head = (f"{'':<24}{'requests':>10}{'prompt tok':>12}{'output tok':>12}{'elapsed s':>11}"
            f"{'output tok/s':>14}{'total tok/s':>13}{'GFLOP/s':>9}")
    lines = [head, "-" * len(head)]
    for r in results:
        reqs = f"{r.requests}/{r.total_requests}" if r.subsampled else str(r.requests)
        lines.append(f"{r.name:<24}{reqs:>10}{r.prompt_tokens:>12}{r.output_tokens:>12}{r.elapsed:>11.1f}"
                     f"{r.output_tps:>14.1f}{r.total_tps:>13.1f}{r.gflops(num_params):>9.1f}")
    notes = [f"  {r.name}: {r.note}" for r in results if r.note]
    return "\n".join(lines + notes)


def ratio_lines(base: RunResult, others: list[RunResult]) -> tuple[list[str], dict]:
    lines, ratios = [], {}
    for o in others:
        out = base.output_tps / o.output_tps
        tot = base.total_tps / o.total_tps
        ratios[f"{base.name} / {o.name}"] = {"output_tok_per_s": out, "total_tok_per_s": tot}
        lines.append(f"{base.name} / {o.name}: {out:.2f}x output tok/s, {tot:.2f}x total tok/s")
    return lines, ratios
