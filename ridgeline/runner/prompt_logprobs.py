"""Prompt logprobs: the log-probability of each prompt token given the tokens before it (and the
top-N alternatives), for requests that ask (echo + logprobs, perplexity). Their rows are the
prompt rows of the step, so logits are computed for those rows only."""
from __future__ import annotations

import torch

from ridgeline.step_plan import PromptLogprobs, ScheduledSeq


def score_prompts(model, seqs: list[ScheduledSeq], hidden: torch.Tensor) -> dict[str, PromptLogprobs]:
    """hidden [T, H]: the step's final hidden rows, seqs in the step's row order."""
    rows, targets, spans, row = [], [], [], 0
    for s in seqs:
        if s.score_prompt:
            # row i (position start + i) predicts the token at start + i + 1, while that is a prompt token
            nxt = s.token_ids[1:] + ([s.next_token] if s.next_token is not None else [])
            nxt = nxt[:max(0, s.num_prompt_tokens - 1 - s.start)]
            spans.append((s, len(targets), len(nxt)))
            rows.extend(range(row, row + len(nxt)))
            targets.extend(nxt)
        row += s.num_new
    out: dict[str, PromptLogprobs] = {}
    if not targets:
        return out
    lsm = torch.log_softmax(model.compute_logits(hidden[torch.tensor(rows, device=hidden.device)]), -1)
    tgt = torch.tensor(targets, device=lsm.device)
    chosen = lsm.gather(1, tgt[:, None])[:, 0].tolist()
    k = max(s.params.prompt_logprobs for s, _, _ in spans)
    top_lp, top_ids = (lsm.topk(k, -1) if k else (lsm[:, :0], lsm[:, :0].long()))
    top_lp, top_ids = top_lp.tolist(), top_ids.tolist()
    for s, a, n in spans:
        kk = s.params.prompt_logprobs
        out[s.req_id] = PromptLogprobs(s.start, targets[a:a + n], chosen[a:a + n],
                                       [list(zip(top_ids[i][:kk], top_lp[i][:kk])) for i in range(a, a + n)])
    return out
