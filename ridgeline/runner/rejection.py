"""Rejection sampling of drafts drawn from a distribution q against the target's p (Leviathan et
al. / Chen et al.): proposal j is accepted with probability min(1, p_j(x) / q_j(x)); at the first
rejection the token is drawn from normalize(max(p_j - q_j, 0)); when all k are accepted a bonus
token is drawn from p_k. Each emitted token then follows p exactly, whatever q is: a bad draft only
lowers the acceptance. Batched over sequences; one host sync (the accepted counts)."""
from __future__ import annotations

from collections.abc import Sequence

import torch

from ridgeline.layers.sampler import race
from ridgeline.runner.draft import Draft


def rejection_verify(p: torch.Tensor, first_rows: Sequence[int], proposals: Sequence[Sequence[int]],
                     drafts: Sequence[Draft], u: torch.Tensor,
                     gens: Sequence[torch.Generator | None]) -> tuple[list[int], list[int]]:
    """p [R, V]: target probabilities; sequence i owns rows first_rows[i] .. first_rows[i] + k_i
    (k_i = len(proposals[i]) >= 1), row j predicting the token after proposal j (row 0 after the
    last known token). drafts[i] holds q for its k_i proposals. u [N, K] uniforms in [0, 1), K >= max
    k_i: u[i, j] decides proposal j. gens[i]: the generator of sequence i's final draw (None: global).
    Returns (accepted [N]: proposals kept, a prefix; final [N]: the token drawn after them)."""
    dev = p.device
    N = len(proposals)
    ks = [len(x) for x in proposals]
    K = max(ks)
    k = torch.tensor(ks, device=dev)
    valid = torch.arange(K, device=dev) < k[:, None]
    toks = torch.zeros(N, K, dtype=torch.long, device=dev)
    q_x = torch.zeros(N, K, device=dev)
    drafts = [d.on(dev) for d in drafts]
    for i, (x, d) in enumerate(zip(proposals, drafts)):
        t = torch.tensor(x, dtype=torch.long, device=dev)
        toks[i, :len(x)] = t
        q_x[i, :len(x)] = d.q_at(t)
    first = torch.tensor(first_rows, dtype=torch.long, device=dev)
    rows = first[:, None] + torch.arange(K, device=dev).clamp(max=k[:, None] - 1)
    p_x = p[rows, toks]
    # accept iff u < p / q; a token the draft could not have drawn (q 0) is rejected, which keeps
    # the emitted token's distribution p (the residual is then p itself)
    ok = (u[:, :K] * q_x < p_x) & (q_x > 0) & valid
    accepted = ok.int().cumprod(1).sum(1)
    acc = accepted.tolist()
    w = p[first + accepted].clone()  # [N, V]; all accepted: the bonus row p_k
    for i, a in enumerate(acc):
        if a < ks[i]:
            drafts[i].subtract_row(a, w[i])
    torch.clamp_(w, min=0)
    empty = w.sum(-1) <= 0  # p <= q everywhere (rounding only: such a proposal is always accepted)
    if bool(empty.any()):
        w[empty] = p[(first + accepted)[empty]]
    return acc, race(w, list(gens)).tolist()
