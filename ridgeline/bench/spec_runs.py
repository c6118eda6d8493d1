"""Timed runs for `ridgeline bench spec`: one batch of greedy requests through an engine step by step,
with speculation set to one setting (k pinned, the controller, or off), and the arithmetic that
sets the measurement beside the model E / (1 + c k)."""
from __future__ import annotations

import itertools
import statistics
import time
from dataclasses import dataclass, field

from ridgeline.sampling_params import SamplingParams
from ridgeline.engine.spec_stats import SpecStats

_ids = itertools.count()


@dataclass(frozen=True)
class Setting:
    method: str
    k: int  # 0: speculation off
    controller: bool = False

    @property
    def label(self) -> str:
        if self.k == 0:
            return "off"
        return f"{self.method} ctrl<={self.k}" if self.controller else f"{self.method} k={self.k}"


@dataclass
class Run:
    tokens: int  # output tokens of the batch
    elapsed: float  # the whole run, prefill included
    decode_tokens: int  # tokens emitted by steps after every request had its first token
    decode_time: float
    decode_steps: int
    spec: SpecStats
    outputs: list[list[int]] = field(repr=False, default_factory=list)

    @property
    def tok_s(self) -> float:
        return self.tokens / self.elapsed

    @property
    def decode_tok_s(self) -> float:
        return self.decode_tokens / self.decode_time if self.decode_time else float("nan")

    @property
    def step_time(self) -> float:
        return self.decode_time / self.decode_steps if self.decode_steps else float("nan")


def timed_run(eng, prompts: list[list[int]], setting: Setting, output_len: int, ignore_eos: bool,
              temperature: float = 0.0) -> Run:
    """Run the batch once; the prefix cache is emptied first, so every setting prefills the same.
    temperature > 0: requests sample, unseeded (the goodput controller drafts for no seeded sampling
    request: its draws would depend on the step timings); outputs then differ by setting. A prompt with
    a `structured` attribute (bench/structured_workload.py) is constrained to it; one with a `max_tokens`
    other than None stops there instead of at output_len."""
    if eng.spec is not None:  # an engine without a proposer runs speculation off only
        eng.spec.configure(setting.k, setting.controller)
        eng.spec.stats = SpecStats()
    elif setting.k:
        raise ValueError("this engine has no proposer")
    eng.kv.reset_prefix_cache()
    reqs = []
    for p in prompts:
        rid = f"bench-spec-{next(_ids)}"
        eng.add_request(rid, p, SamplingParams(temperature=temperature, max_tokens=getattr(p, "max_tokens", None)
                                               or output_len, ignore_eos=ignore_eos,
                                               structured=getattr(p, "structured", None)))
        reqs.append(eng.requests[rid])
    started, dec_tokens, dec_time, dec_steps = False, 0, 0.0, 0
    t0 = time.perf_counter()
    while eng.has_unfinished():
        before = sum(r.num_output_tokens for r in reqs) if started else 0
        ts = time.perf_counter()
        eng.step(emit_unfinished=False)
        te = time.perf_counter()
        if started:
            dec_tokens += sum(r.num_output_tokens for r in reqs) - before
            dec_time += te - ts
            dec_steps += 1
        else:
            started = all(r.num_output_tokens > 0 or r.status.finished for r in reqs)
    elapsed = time.perf_counter() - t0
    outs = [list(r.output_token_ids) for r in reqs]
    return Run(sum(map(len, outs)), elapsed, dec_tokens, dec_time, dec_steps,
               eng.spec.stats if eng.spec is not None else SpecStats(), outs)


def timed_runs(eng, prompts: list[list[int]], batch: int, setting: Setting, output_len: int,
               ignore_eos: bool, temperature: float = 0.0) -> Run:
    """The prompts `batch` at a time, one batch after another, summed into one Run."""
    parts = [timed_run(eng, prompts[i:i + batch], setting, output_len, ignore_eos, temperature)
             for i in range(0, len(prompts), batch)]
    spec = SpecStats()
    for r in parts:
        spec.add(r.spec)
    return Run(sum(r.tokens for r in parts), sum(r.elapsed for r in parts), sum(r.decode_tokens for r in parts),
               sum(r.decode_time for r in parts), sum(r.decode_steps for r in parts), spec,
               [o for r in parts for o in r.outputs])


def repeated_runs(eng, prompts: list[list[int]], batch: int, settings: list[Setting], repeats: int, output_len: int,
                  ignore_eos: bool, temperature: float = 0.0) -> dict[Setting, list[Run]]:
    """Every setting `repeats` times over the prompts (timed_runs), the order rotated each repeat so
    that no setting always runs first (the machine's speed drifts within an invocation)."""
    runs: dict[Setting, list[Run]] = {s: [] for s in settings}
    for rep in range(repeats):
        for s in settings[rep % len(settings):] + settings[:rep % len(settings)]:
            runs[s].append(timed_runs(eng, prompts, batch, s, output_len, ignore_eos, temperature))
    return runs


def expected_tokens(alpha: float, k: float) -> float:
    """E = (1 - a^(k+1)) / (1 - a): tokens per verification with k drafts each accepted with probability a."""
    return k + 1 if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


def summarize(setting: Setting, runs: list[Run], plain: list[Run], greedy: bool = True) -> dict:
    """Medians over repeats, the speed-up against the plain runs of the same repeats, and the model.
    same_output: greedy outputs equal the plain runs' (None where requests sample)."""
    med = statistics.median
    row = {"setting": setting.label, "method": setting.method, "k": setting.k, "controller": setting.controller,
           "tok_s": med(r.tok_s for r in runs), "decode_tok_s": med(r.decode_tok_s for r in runs),
           "all_decode_tok_s": [r.decode_tok_s for r in runs],
           "speedup": med(r.decode_tok_s / p.decode_tok_s for r, p in zip(runs, plain)),
           "same_output": all(r.outputs == p.outputs for r, p in zip(runs, plain)) if greedy else None}
    spec = SpecStats()
    for r in runs:
        spec.add(r.spec)
    if setting.k and spec.steps:
        alpha = spec.acceptance_rate
        k_mean = spec.proposed / spec.steps  # drafts per verification (ngram may find fewer than k)
        step_ratio = med(r.step_time / p.step_time for r, p in zip(runs, plain))
        c = (step_ratio - 1) / k_mean
        E = expected_tokens(alpha, k_mean)
        row.update(acceptance=alpha, mean_accepted_length=spec.tokens_per_step, drafted=spec.proposed // len(runs),
                   accepted=spec.accepted // len(runs), draft_ms=1000 * spec.draft_time / len(runs),
                   acceptance_by_position=spec.acceptance_by_position, k_mean=k_mean, c=c, E=E,
                   model_speedup=E / (1 + c * k_mean))
    return row
