"""Sampling for one step: every row that needs a token, then the verification of proposals.

A sequence with k proposed tokens p1..pk has k+1 logit rows: row 0 predicts the token after its
last known one, row j the token after p_j. Each row is sampled as if every proposal before it had
been accepted (penalties see them), then p_{j+1} is kept while it equals what row j sampled; the
first mismatch keeps the sampled token instead and ends the sequence's tokens for this step. With a
deterministic proposer, "sample the target, keep the proposal if they agree" is exact rejection
sampling (P(keep p) = q(p); otherwise the target's own sample, drawn from q), so greedy output is
token-for-token the plain engine's and sampled output has the target's distribution.
"""
from __future__ import annotations

import torch

from ridgeline.step_plan import SampledSeq, ScheduledSeq
from ridgeline.layers.sampler import Sampler, SamplingMetadata


class StepSampler:
    def __init__(self, device: torch.device, eos_ids: list[int]):
        self.device = device
        self.eos_ids = eos_ids
        self.sampler = Sampler()
        self.generators: dict[str, torch.Generator] = {}  # seeded requests: one generator, drawn in row order

    def forget(self, req_ids: list[str]) -> None:
        for rid in req_ids:
            self.generators.pop(rid, None)

    def _generator(self, s: ScheduledSeq) -> torch.Generator | None:
        if s.seed is None or s.params.greedy:
            return None
        g = self.generators.get(s.req_id)
        if g is None:
            g = self.generators[s.req_id] = torch.Generator(self.device).manual_seed(s.seed)
        return g

    def __call__(self, seqs: list[ScheduledSeq], logits: torch.Tensor) -> list[SampledSeq]:
        """seqs: the sampling ones, in order; logits [sum(num_spec + 1), V] float32, their rows in order."""
        params, prompts, outputs, gens = [], [], [], []
        for s in seqs:
            g = self._generator(s)
            proposals = s.token_ids[len(s.token_ids) - s.num_spec:] if s.num_spec else []
            for j in range(s.num_spec + 1):
                params.append(s.params)
                gens.append(g)
                if s.history is not None:
                    prompts.append(s.history[:s.num_prompt_tokens])
                    outputs.append(s.history[s.num_prompt_tokens:] + proposals[:j])
                else:
                    prompts.append([])
                    outputs.append([])
        meta = SamplingMetadata.build(params, prompts, outputs, gens, self.eos_ids, logits.shape[-1], self.device)
        out = self.sampler(logits, meta)
        tokens = out.token_ids.tolist()
        lps = tops = None
        if out.logprobs is not None:
            lps = out.logprobs.tolist()
            tops = list(zip(out.top_ids.tolist(), out.top_logprobs.tolist()))
        results, row = [], 0
        for s in seqs:
            proposals = s.token_ids[len(s.token_ids) - s.num_spec:] if s.num_spec else []
            kept = 1
            while kept <= s.num_spec and tokens[row + kept - 1] == proposals[kept - 1]:
                kept += 1
            r = SampledSeq(s.req_id, tokens[row:row + kept], kept - 1, s.num_spec)
            if s.params.logprobs is not None and lps is not None:
                k = s.params.logprobs
                r.logprobs = [(lps[i], list(zip(tops[i][0][:k], tops[i][1][:k]))) for i in range(row, row + kept)]
            results.append(r)
            row += s.num_spec + 1
        return results
