"""Sampling for one step: every row that needs a token, then the verification of proposals.

A sequence with k proposed tokens x1..xk has k+1 logit rows: row 0 predicts the token after its
last known one, row j the token after x_j. Each row is processed as if every proposal before it had
been accepted (penalties and min_tokens see them). Two verifications, both exact:

- deterministic proposals (plain token ids) and greedy requests: sample every row, keep x_{j+1}
  while it equals what row j sampled; the first mismatch keeps the sampled token instead. That is
  rejection sampling with q one-hot at x (P(keep) = p(x); otherwise a draw from p without x), and
  for greedy the target's argmax chain, token for token the plain engine's output.
- a `Draft` (tokens drawn from a distribution q, with q) on a random request: the target's kept
  probabilities p per row (ridgeline/layers/sampler_probs.py), then accept with probability
  min(1, p/q), resample from max(p - q, 0) at the first rejection, a bonus token from the last row
  when all are accepted (runner/rejection.py).

A request with structured outputs comes with one allowed-token bitmask per row (masks: request id
-> k + 1 rows, row j after proposals 1..j); the sampler sets what a row forbids to -inf before
everything else (layers/sampler.py), so both verifications see the masked distribution. Logprobs
stay the model's raw ones.

A seeded request draws from its own generator, always in the same order, so its output is the same
on every run with the same speculation settings.
"""
from __future__ import annotations

import torch

from ridgeline.layers.sampler import Sampler, SamplingMetadata, uniform_noise
from ridgeline.layers.sampler_probs import kept_probs
from ridgeline.runner.draft import Draft
from ridgeline.runner.rejection import rejection_verify
from ridgeline.step_plan import SampledSeq, ScheduledSeq


def _proposals(s: ScheduledSeq) -> list[int]:
    return s.token_ids[len(s.token_ids) - s.num_spec:] if s.num_spec else []


class StepSampler:
    def __init__(self, device: torch.device, eos_ids: list[int]):
        self.device = device
        self.eos_ids = eos_ids
        self.sampler = Sampler()
        self.generators: dict[str, torch.Generator] = {}  # seeded requests: one generator, drawn in row order
        self.masks: dict[str, list[bytes]] = {}  # this call's structured-output rows, by request id

    def set_generator(self, request_id: str, generator: torch.Generator) -> None:
        """A seeded request's generator, continued from elsewhere (its prefill on another engine)."""
        self.generators[request_id] = generator

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

    def __call__(self, seqs: list[ScheduledSeq], logits: torch.Tensor,
                 drafts: dict[str, Draft] | None = None, masks: dict[str, list[bytes]] | None = None
                 ) -> list[SampledSeq]:
        """seqs: the sampling ones, in order; logits [sum(num_spec + 1), V] float32, their rows in order
        (scratch). drafts: request id -> the Draft its proposals were drawn from (absent: deterministic).
        masks: request id -> its rows' allowed-token bitmasks (structured outputs)."""
        drafts = drafts or {}
        self.masks = masks or {}
        by_q = [bool(s.num_spec and not s.params.greedy and s.req_id in drafts) for s in seqs]
        if not any(by_q):
            return self._match(seqs, logits)
        rows: tuple[list[int], list[int]] = ([], [])
        row = 0
        for s, q in zip(seqs, by_q):
            rows[q].extend(range(row, row + s.num_spec + 1))
            row += s.num_spec + 1
        idx = [torch.tensor(r, dtype=torch.long, device=logits.device) for r in rows]
        matched = iter(self._match([s for s, q in zip(seqs, by_q) if not q], logits[idx[0]]) if rows[0] else [])
        verified = iter(self._verify([s for s, q in zip(seqs, by_q) if q], logits[idx[1]], drafts))
        return [next(verified) if q else next(matched) for q in by_q]

    def _meta(self, seqs: list[ScheduledSeq], V: int) -> SamplingMetadata:
        """Per logit row: the request's parameters, its generator, and the history penalties see."""
        params, prompts, outputs, gens = [], [], [], []
        for s in seqs:
            g = self._generator(s)
            proposals = _proposals(s)
            for j in range(s.num_spec + 1):
                params.append(s.params)
                gens.append(g)
                if s.history is not None:
                    prompts.append(s.history[:s.num_prompt_tokens])
                    outputs.append(s.history[s.num_prompt_tokens:] + proposals[:j])
                else:
                    prompts.append([])
                    outputs.append([])
        allowed = self.row_masks(seqs, self.masks)
        return SamplingMetadata.build(params, prompts, outputs, gens, self.eos_ids, V, self.device, allowed)

    @staticmethod
    def takes_argmax(seqs: list[ScheduledSeq], masked: bool = False) -> bool:
        """Every row's token is its logits' argmax (plain greedy: no penalties, bias, bans or logprobs);
        masked: or the argmax over what its structured-output mask allows (row_masks)."""
        return all(s.params.masked_argmax if masked else s.params.plain_greedy for s in seqs)

    @staticmethod
    def row_masks(seqs: list[ScheduledSeq], masks: dict[str, list[bytes]] | None) -> list[bytes | None] | None:
        """Per logit row of seqs (num_spec + 1 each, in order): its structured-output bitmask, or None
        (unconstrained); None when no row has one."""
        if not masks and not any(s.params.structured is not None for s in seqs):
            return None
        rows: list[bytes | None] = []
        for s in seqs:
            got = (masks or {}).get(s.req_id)
            if s.params.structured is not None and (got is None or len(got) != s.num_spec + 1):
                raise RuntimeError(f"request {s.req_id} has structured outputs but no mask for each of its rows")
            rows.extend(got if got is not None else [None] * (s.num_spec + 1))
        return rows

    def _match(self, seqs: list[ScheduledSeq], logits: torch.Tensor) -> list[SampledSeq]:
        if self.takes_argmax(seqs):  # the sampler's own answer, without its metadata
            return self.matched(seqs, logits.argmax(-1).tolist())
        out = self.sampler(logits, self._meta(seqs, logits.shape[-1]))
        lps = tops = None
        if out.logprobs is not None:
            lps = out.logprobs.tolist()
            tops = list(zip(out.top_ids.tolist(), out.top_logprobs.tolist()))
        return self.matched(seqs, out.token_ids.tolist(), lps, tops)

    def matched(self, seqs: list[ScheduledSeq], tokens: list[int], lps: list | None = None,
                tops: list | None = None) -> list[SampledSeq]:
        """Deterministic proposals against the tokens chosen for each row (rows in seqs' order, num_spec + 1
        each): kept while they equal them. lps, tops: the rows' logprobs and top logprobs, if asked for."""
        results, row = [], 0
        for s in seqs:
            proposals = _proposals(s)
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

    def _verify(self, seqs: list[ScheduledSeq], logits: torch.Tensor, drafts: dict[str, Draft]) -> list[SampledSeq]:
        """Random requests with Drafts: rejection sampling against the target's kept probabilities."""
        meta = self._meta(seqs, logits.shape[-1])
        lsm = None
        if meta.logprob_rows is not None:  # logprobs are the model's, before penalties and temperature
            lsm = torch.log_softmax(logits[meta.logprob_rows], -1)
        p = kept_probs(logits, meta)
        first, row = [], 0
        for s in seqs:
            first.append(row)
            row += s.num_spec + 1
        proposals = [_proposals(s) for s in seqs]
        gens = [self._generator(s) for s in seqs]
        ks = [s.num_spec for s in seqs]
        u = uniform_noise(len(seqs), max(ks), gens, self.device, ks)
        accepted, final = rejection_verify(p, first, proposals, [drafts[s.req_id] for s in seqs], u, gens)
        lsm_row = {} if lsm is None else {r: i for i, r in enumerate(meta.logprob_rows.tolist())}
        results = []
        for s, f, x, a, t in zip(seqs, first, proposals, accepted, final):
            r = SampledSeq(s.req_id, x[:a] + [t], a, s.num_spec)
            if s.params.logprobs is not None and lsm is not None:
                r.logprobs = _logprobs(lsm, [lsm_row[f + j] for j in range(a + 1)], r.token_ids, s.params.logprobs)
            results.append(r)
        return results


def _logprobs(lsm: torch.Tensor, rows: list[int], tokens: list[int], k: int) -> list[tuple[float, list]]:
    sel = lsm[torch.tensor(rows, dtype=torch.long, device=lsm.device)]
    chosen = sel.gather(1, torch.tensor(tokens, device=lsm.device)[:, None])[:, 0].tolist()
    top_lp, top_ids = sel.topk(k, -1) if k else (sel[:, :0], sel[:, :0].long())
    return [(c, list(zip(i, v))) for c, i, v in zip(chosen, top_ids.tolist(), top_lp.tolist())]
