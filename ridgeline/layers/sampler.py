"""Batched sampler, run once per step: structured-output masks, logit bias, penalties, min_tokens bans, temperature, top-k / top-p /
min-p, exponential-race sampling (argmax(p / q), q ~ Exp(1); no multinomial) and logprobs of the
raw logits.

Random rows first race over their top-`num_candidates` tokens (or their top_k). More work is done
only for rows whose kept set reaches past the candidates: a top_p nucleus retries with a wider
top-k, then with the whole sorted vocabulary; without top_p, an exact head/tail split (the head
wins with probability mass(head) / mass(kept), else the race runs over the rest of the
vocabulary). Every choice a row makes depends only on its own logits and parameters, so a seeded
row draws the same noise whatever batch it sits in.
"""
from __future__ import annotations

from array import array
from dataclasses import dataclass

import numpy as np
import torch

from ridgeline.sampling_params import SamplingParams

NUM_CANDIDATES = 256
WIDE_CANDIDATES = 4096


@dataclass
class SamplerOutput:
    token_ids: torch.Tensor  # [B] int64
    logprobs: torch.Tensor | None  # [B] float32, sampled token; nan on rows that did not ask
    top_logprobs: torch.Tensor | None  # [B, K] float32, K = max requested; nan on rows that did not ask
    top_ids: torch.Tensor | None  # [B, K] int64; -1 on rows that did not ask


@dataclass
class SamplingMetadata:
    greedy_rows: torch.Tensor  # [G] int64
    random_rows: torch.Tensor  # [R] int64
    temperature: torch.Tensor  # [R] float32
    top_k: torch.Tensor  # [R] int64, 0 = off
    top_p: torch.Tensor  # [R] float32, 1 = off
    min_p: torch.Tensor  # [R] float32, 0 = off
    generators: list[torch.Generator | None]  # [R]
    bias: tuple[torch.Tensor, torch.Tensor] | None  # logit_bias: flat index [N] (row * V + token id), bias [N]
    repetition: tuple[torch.Tensor, torch.Tensor] | None  # flat index [N] of prompt + output tokens, penalty [N]
    presence_frequency: tuple[torch.Tensor, ...] | None  # flat index [M] of output tokens, presence [M], frequency [M]
    bans: tuple[torch.Tensor, torch.Tensor] | None  # rows [N], ids [N]: set to -inf
    logprob_rows: torch.Tensor | None  # [Lr] int64 rows that asked for logprobs; None if none did
    num_top_logprobs: int  # K
    # structured outputs: rows [M] int64, their allowed-token bitmasks [M, ceil(V / 32)] int32 (bit t % 32 of
    # word t // 32: token t allowed); every other token of those rows is set to -inf first
    allowed: tuple[torch.Tensor, torch.Tensor] | None = None

    @classmethod
    def build(cls, params: list[SamplingParams], prompt_ids: list[list[int]], output_ids: list[list[int]],
              generators: list[torch.Generator | None], eos_ids: list[int], vocab_size: int,
              device: torch.device, allowed: list[bytes | None] | None = None) -> SamplingMetadata:
        """allowed: per row, its structured-output bitmask (Constraint.allowed_mask) or None."""
        def ints(xs):
            return torch.tensor(xs, dtype=torch.long, device=device)

        def floats(xs):
            return torch.tensor(xs, dtype=torch.float32, device=device)

        rnd = [i for i, p in enumerate(params) if not p.greedy]
        rep = [i for i, p in enumerate(params) if p.repetition_penalty != 1.0]
        pf = [i for i, p in enumerate(params) if p.presence_penalty or p.frequency_penalty]
        lp = [i for i, p in enumerate(params) if p.logprobs is not None]
        lb = [i for i, p in enumerate(params) if p.logit_bias]
        ban_rows, ban_ids = [], []
        for i, p in enumerate(params):
            if len(output_ids[i]) < p.min_tokens:
                ids = {t for t in (*(() if p.ignore_eos else eos_ids), *p.stop_token_ids) if 0 <= t < vocab_size}
                ban_rows += [i] * len(ids)
                ban_ids += ids
        repetition = presence_frequency = bias = None
        if lb:
            bias = _bias_index(lb, [params[i].logit_bias_columns for i in lb], vocab_size, device)
        if rep:
            idx, owner = _flat_index(rep, [prompt_ids[i] + output_ids[i] for i in rep], vocab_size, device)
            repetition = idx, floats([params[i].repetition_penalty for i in rep])[owner]
        if pf:
            idx, owner = _flat_index(pf, [output_ids[i] for i in pf], vocab_size, device)
            presence_frequency = (idx, floats([params[i].presence_penalty for i in pf])[owner],
                                  floats([params[i].frequency_penalty for i in pf])[owner])
        return cls(
            greedy_rows=ints([i for i, p in enumerate(params) if p.greedy]),
            random_rows=ints(rnd),
            temperature=floats([params[i].temperature for i in rnd]),
            top_k=ints([params[i].top_k for i in rnd]),
            top_p=floats([params[i].top_p for i in rnd]),
            min_p=floats([params[i].min_p for i in rnd]),
            generators=[generators[i] for i in rnd],
            bias=bias,
            repetition=repetition,
            presence_frequency=presence_frequency,
            bans=(ints(ban_rows), ints(ban_ids)) if ban_rows else None,
            logprob_rows=ints(lp) if lp else None,
            num_top_logprobs=max((params[i].logprobs for i in lp), default=0),
            allowed=_allowed(allowed, vocab_size, device) if allowed and any(a is not None for a in allowed) else None,
        )

    @property
    def fast_greedy(self) -> bool:
        return (len(self.random_rows) == 0 and self.repetition is None and self.presence_frequency is None
                and self.bans is None and self.bias is None and self.allowed is None)


def _allowed(allowed: list[bytes | None], vocab_size: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    rows = [i for i, a in enumerate(allowed) if a is not None]
    words = (vocab_size + 31) // 32
    buf = bytearray(b"".join(allowed[i] for i in rows))
    if len(buf) != 4 * words * len(rows):
        raise ValueError(f"a structured-output mask is not {4 * words} bytes")
    bits = torch.frombuffer(buf, dtype=torch.int32).view(len(rows), words)
    return torch.tensor(rows, dtype=torch.long, device=device), bits.to(device)


def apply_allowed(logits: torch.Tensor, allowed: tuple[torch.Tensor, torch.Tensor]) -> None:
    """In place on logits [B, V]: tokens a row's bitmask forbids become -inf."""
    rows, words = allowed
    V = logits.shape[1]
    if words.device.type == "cpu":  # numpy unpacks the bits a byte at a time (x86: little-endian words)
        bits = np.unpackbits(words.numpy().view(np.uint8), axis=1, bitorder="little")[:, :V]
        ok = torch.from_numpy(np.ascontiguousarray(bits)).view(torch.bool)
    else:
        shifts = torch.arange(32, dtype=torch.int32, device=words.device)
        ok = ((words[:, :, None] >> shifts) & 1).view(len(rows), -1)[:, :V].bool()
    if len(rows) == len(logits):  # every row (rows are distinct): in place, no gather
        logits.masked_fill_(~ok, float("-inf"))
    else:
        logits[rows] = torch.where(ok, logits[rows], float("-inf"))


def _flat_index(rows: list[int], seqs: list[list[int]], vocab_size: int,
                device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions row * V + token in the flattened logits of every token of seqs[j] (row rows[j]),
    duplicates kept: [N] int64; and j for each: [N] int64. Out-of-vocabulary ids are dropped."""
    buf = array("q")
    for seq in seqs:
        buf.extend(seq)
    ids = torch.frombuffer(buf, dtype=torch.int64) if buf else torch.empty(0, dtype=torch.int64)
    owner = torch.repeat_interleave(torch.arange(len(seqs)), torch.tensor([len(seq) for seq in seqs]))
    idx = torch.tensor(rows)[owner] * vocab_size + ids
    bad = (ids < 0) | (ids >= vocab_size)
    if bool(bad.any()):
        idx, owner = idx[~bad], owner[~bad]
    return idx.to(device), owner.to(device)


def _bias_index(rows: list[int], columns: list[tuple[tuple[int, ...], tuple[float, ...]]], vocab_size: int,
                device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """logit_bias of rows[j] (token ids, biases) = columns[j] -> flat positions row * V + id [N] int64,
    biases [N] float32. Ids are unique within a row; out-of-vocabulary ids are dropped."""
    ids, values = array("q"), array("f")
    for t, b in columns:
        ids.extend(t)
        values.extend(b)
    counts = torch.tensor([len(t) for t, _ in columns])
    token = torch.frombuffer(ids, dtype=torch.int64)
    idx = torch.repeat_interleave(torch.tensor(rows) * vocab_size, counts) + token
    bias = torch.frombuffer(values, dtype=torch.float32)
    bad = token >= vocab_size
    if bool(bad.any()):
        idx, bias = idx[~bad], bias[~bad]
    return idx.to(device), bias.to(device)


def apply_penalties(logits: torch.Tensor, meta: SamplingMetadata) -> None:
    """In place on logits [B, V] (contiguous): structured-output masks (-inf stays -inf whatever
    follows: the mask wins over a bias), logit bias (added, as OpenAI defines it), then repetition,
    presence and frequency penalties, then min_tokens bans. Repeated tokens scatter equal values, so
    duplicates are harmless."""
    if meta.allowed is not None:
        apply_allowed(logits, meta.allowed)
    flat = logits.view(-1)
    if meta.bias is not None:
        idx, bias = meta.bias
        flat.index_add_(0, idx, bias)
    if meta.repetition is not None:
        idx, penalty = meta.repetition
        g = flat[idx]
        flat.scatter_(0, idx, torch.where(g > 0, g / penalty, g * penalty))
    if meta.presence_frequency is not None:
        idx, presence, frequency = meta.presence_frequency
        flat.scatter_(0, idx, flat[idx] - presence)
        flat.scatter_add_(0, idx, -frequency)  # once per occurrence: - frequency * count
    if meta.bans is not None:
        logits.index_put_(meta.bans, logits.new_tensor(float("-inf")))


def uniform_noise(rows: int, cols: int, gens: list[torch.Generator | None], device: torch.device,
             counts: list[int] | None = None) -> torch.Tensor:
    """[rows, cols] U[0, 1); row j draws its first counts[j] values from gens[j] when it has one,
    everything else comes from one batch-wide draw."""
    seeded = [(j, g) for j, g in enumerate(gens) if g is not None]
    if len(seeded) == rows:
        u = torch.full((rows, cols), 0.5, device=device)
    else:
        u = torch.empty(rows, cols, device=device).uniform_()
    for j, g in seeded:
        u[j, : cols if counts is None else counts[j]].uniform_(generator=g)
    return u


def _exponential(*args, **kwargs) -> torch.Tensor:
    """Exp(1) noise in (0, inf]: u < 1 so q > 0 and weight / q is never nan. Arguments as uniform_noise."""
    return uniform_noise(*args, **kwargs).log_().neg_()


def race(weights: torch.Tensor, gens: list[torch.Generator | None]) -> torch.Tensor:
    """weights [n, V] >= 0 (unnormalised kept probs; scratch) -> [n] int64 column ~ weights."""
    return weights.div_(_exponential(*weights.shape, gens, weights.device)).argmax(-1)


def _candidate_race(x: torch.Tensor, width: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                    min_p: torch.Tensor, total: torch.Tensor, gens: list[torch.Generator | None]):
    """Race over each row's top width[i] tokens. x [n, V] unnormalised probs (row max 1), total [n]
    its row sums. Returns token ids [n], resolved [n] (the row's kept set lies within its
    candidates, so its token is final), cand [n, K] and cand_ids [n, K], descending."""
    widths = width.tolist()
    cand, cand_ids = x.topk(max(widths), -1)
    inside = torch.arange(cand.shape[1], device=x.device) < width[:, None]
    base = torch.where(top_k > 0, (cand * inside).sum(-1), total)  # mass top_p is a fraction of
    csum = cand.cumsum(-1)
    keep = inside & (cand >= min_p[:, None]) & ((csum - cand < (top_p * base)[:, None]) | (top_p[:, None] >= 1))
    keep[:, 0] = True
    last = (width - 1)[:, None]
    resolved = ((top_k > 0) | (width >= x.shape[1]) | (cand.gather(1, last)[:, 0] < min_p)
                | ((top_p < 1) & (csum.gather(1, last)[:, 0] >= top_p * base)))
    q = _exponential(len(x), cand.shape[1], gens, x.device, widths)  # seeded rows draw width[i] values
    token_ids = cand_ids.gather(1, (cand * keep / q).argmax(-1, keepdim=True))[:, 0]
    return token_ids, resolved, cand, cand_ids


class Sampler:
    """num_candidates: tokens per row raced before any full-vocabulary work; rows whose top_p
    nucleus is wider retry with wide_candidates, then with the whole (sorted) vocabulary."""

    def __init__(self, num_candidates: int = NUM_CANDIDATES, wide_candidates: int = WIDE_CANDIDATES):
        self.num_candidates, self.wide_candidates = num_candidates, wide_candidates

    def __call__(self, logits: torch.Tensor, meta: SamplingMetadata) -> SamplerOutput:
        """logits [B, V] float32; used as scratch (overwritten in place)."""
        logits = logits.contiguous()
        lsm = None
        if meta.logprob_rows is not None:
            rows = meta.logprob_rows
            lsm = torch.log_softmax(logits if len(rows) == len(logits) else logits[rows], -1)  # [Lr, V]
        if meta.fast_greedy:
            return _with_logprobs(logits.argmax(-1), lsm, meta)
        apply_penalties(logits, meta)
        greedy, rnd = meta.greedy_rows, meta.random_rows
        if len(greedy) == len(logits):
            return _with_logprobs(logits.argmax(-1), lsm, meta)
        token_ids = torch.empty(len(logits), dtype=torch.long, device=logits.device)
        if len(greedy):
            token_ids[greedy] = logits[greedy].argmax(-1)
        token_ids[rnd] = self._sample(logits if len(rnd) == len(logits) else logits[rnd], meta)
        return _with_logprobs(token_ids, lsm, meta)

    def _sample(self, x: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
        """x [R, V] penalised logits of the random rows (scratch) -> [R] int64 token ids."""
        V = x.shape[1]
        top_k, top_p, min_p, gens = meta.top_k, meta.top_p, meta.min_p, meta.generators
        x.div_(meta.temperature[:, None])
        x.sub_(x.amax(-1, keepdim=True)).exp_()  # unnormalised probs, row max == 1
        total = x.sum(-1)
        head = min(self.num_candidates, V)
        width = torch.where(top_k > 0, top_k.clamp(max=V), head)
        token_ids, resolved, cand, cand_ids = _candidate_race(x, width, top_k, top_p, min_p, total, gens)
        unresolved = (~resolved).nonzero()[:, 0]  # no top_k; kept set reaches past the candidates
        nucleus = top_p[unresolved] < 1
        rows = unresolved[nucleus]
        for wide in (min(self.wide_candidates, V), V):
            if len(rows) == 0 or wide <= head:
                continue
            xr = x if len(rows) == len(x) else x[rows]
            ids, done, _, _ = _candidate_race(xr, torch.full_like(rows, wide), top_k[rows], top_p[rows],
                                              min_p[rows], total[rows], [gens[i] for i in rows.tolist()])
            token_ids[rows[done]] = ids[done]
            rows = rows[~done]
        r = unresolved[~nucleus]  # all candidates kept: the head wins with prob mass(head) / mass(kept)
        if len(r) == 0:
            return token_ids
        kept_mass = total[r]
        if bool((min_p[r] > 0).any()):
            xr = x[r]
            kept_mass = (xr * (xr >= min_p[r, None])).sum(-1)
        u = uniform_noise(len(r), 1, [gens[i] for i in r.tolist()], x.device)[:, 0]
        tail = r[u * kept_mass >= cand[r, :head].sum(-1)]
        if len(tail):
            w = (x if len(tail) == len(x) else x[tail]).scatter_(1, cand_ids[tail, :head], 0.0)
            if bool((min_p[tail] > 0).any()):
                w.mul_(w >= min_p[tail, None])
            token_ids[tail] = race(w, [gens[i] for i in tail.tolist()])
        return token_ids


def _with_logprobs(token_ids: torch.Tensor, lsm: torch.Tensor | None, meta: SamplingMetadata) -> SamplerOutput:
    if lsm is None:
        return SamplerOutput(token_ids, None, None, None)
    rows, B = meta.logprob_rows, len(token_ids)
    sampled = lsm.gather(1, token_ids[rows, None])[:, 0]
    top_logprobs, top_ids = lsm.topk(meta.num_top_logprobs, -1)  # [Lr, K]
    if len(rows) == B:
        return SamplerOutput(token_ids, sampled, top_logprobs, top_ids)
    logprobs = lsm.new_full((B,), float("nan"))
    logprobs[rows] = sampled
    all_top = lsm.new_full((B, top_logprobs.shape[1]), float("nan"))
    all_top[rows] = top_logprobs
    all_ids = torch.full_like(all_top, -1, dtype=torch.long)
    all_ids[rows] = top_ids
    return SamplerOutput(token_ids, logprobs, all_top, all_ids)
