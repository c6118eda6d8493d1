"""Rejection sampling of drafts with their distribution q (ridgeline/speculative/rejection.py) on hand-built
p and q, and the sampler's kept probabilities (the p verification uses) against its own draws."""
from __future__ import annotations

import pytest
import torch

from ridgeline.layers.sampler import Sampler, SamplingMetadata
from ridgeline.layers.sampler_probs import kept_probs
from ridgeline.sampling_params import SamplingParams
from ridgeline.runner.draft import Draft
from ridgeline.runner.rejection import rejection_verify
from stats_helpers import chi2_pvalue

CPU = torch.device("cpu")


def probs(*xs) -> torch.Tensor:
    t = torch.tensor(xs, dtype=torch.float32)
    return t / t.sum()


def verify(p_rows, proposal, q_rows, u, sparse=False):
    p = torch.stack(p_rows)
    q = torch.stack(q_rows)
    if sparse:  # the same q, as (ids, probs) over its support
        m = int((q > 0).sum(-1).max())
        qp, ids = q.topk(m, -1)
        draft = Draft(proposal, qp, ids)
    else:
        draft = Draft(proposal, q)
    acc, final = rejection_verify(p, [0], [proposal], [draft], torch.tensor([u]), [None])
    return acc[0], final[0]


@pytest.mark.parametrize("sparse", [False, True])
def test_accepts_with_probability_p_over_q(sparse):
    p = [probs(3, 7, 0, 0), probs(0, 0, 1, 0)]
    q = [probs(6, 4, 0, 0)]
    # p(0)/q(0) = 0.5: accepted iff u < 0.5; all accepted -> the bonus comes from the last row
    assert verify(p, [0], q, [0.49], sparse) == (1, 2)
    acc, final = verify(p, [0], q, [0.51], sparse)
    assert acc == 0 and final == 1  # residual max(p - q, 0) = (0, .3, 0, 0): token 1 for sure
    # p(1)/q(1) > 1: always accepted
    assert verify(p, [1], q, [0.999], sparse) == (1, 2)


@pytest.mark.parametrize("sparse", [False, True])
def test_a_token_outside_the_targets_support_is_rejected_and_resampled_from_the_residual(sparse):
    p = [probs(0, 1, 1, 0), probs(1, 1, 1, 1)]
    q = [probs(5, 5, 0, 0)]
    for u in (0.0, 0.5):
        acc, final = verify(p, [0], q, [u], sparse)
        assert acc == 0 and final == 2  # max(p - q, 0) = (0, 0, .5, 0)


def test_a_proposal_the_draft_gave_no_mass_is_rejected():
    p = [probs(1, 1), probs(1, 1)]
    q = [probs(0, 1)]
    acc, _ = verify(p, [0], q, [0.0])
    assert acc == 0


def test_several_sequences_of_different_lengths_in_one_call():
    V = 5
    eye = torch.eye(V)
    # seq 0: 2 proposals, both certain; seq 1: 1 proposal the target never makes
    p = torch.stack([eye[1], eye[2], eye[4], eye[0], eye[3]])
    drafts = [Draft([1, 2], torch.stack([eye[1], eye[2]])), Draft([2], probs(1, 1, 1, 1, 1)[None])]
    acc, final = rejection_verify(p, [0, 3], [[1, 2], [2]], drafts, torch.full((2, 2), 0.3), [None, None])
    assert acc == [2, 0] and final == [4, 0]


def test_emitted_tokens_follow_p_for_a_bad_draft():
    """Many draws with random u: the first emitted token ~ p_0, the second (given an accepted first) ~ p_1."""
    torch.manual_seed(0)
    V, N = 6, 20000
    p0, p1, p2 = probs(5, 3, 1, 1, 0, 0), probs(1, 2, 3, 4, 5, 6), probs(1, 1, 1, 1, 1, 1)
    q0, q1 = probs(0, 1, 1, 1, 4, 3), probs(6, 1, 1, 1, 1, 1)  # mass where p has none, little where it has much
    p = torch.stack([p0, p1, p2] * N)
    x0 = torch.multinomial(q0, N, replacement=True)
    x1 = torch.multinomial(q1, N, replacement=True)
    drafts = [Draft([int(a), int(b)], torch.stack([q0, q1])) for a, b in zip(x0, x1)]
    acc, final = rejection_verify(p, list(range(0, 3 * N, 3)), [d.token_ids for d in drafts], drafts,
                                  torch.rand(N, 2), [None] * N)
    first = torch.tensor([d.token_ids[0] if a > 0 else f for d, a, f in zip(drafts, acc, final)])
    assert chi2_pvalue(torch.bincount(first, minlength=V), p0) > 1e-3
    second = torch.tensor([d.token_ids[1] if a > 1 else f for d, a, f in zip(drafts, acc, final) if a >= 1])
    assert chi2_pvalue(torch.bincount(second, minlength=V), p1) > 1e-3
    assert 0 < sum(acc) < 2 * N


ROWS = [SamplingParams(temperature=0.7), SamplingParams(temperature=1.3, top_k=5),
        SamplingParams(temperature=1.0, top_p=0.6), SamplingParams(temperature=0.9, top_k=8, top_p=0.7, min_p=0.1),
        SamplingParams(temperature=1.0, min_p=0.2, repetition_penalty=1.5, presence_penalty=0.5,
                       frequency_penalty=0.7)]


@pytest.mark.parametrize("row", ROWS, ids=range(len(ROWS)))
def test_kept_probs_are_what_the_sampler_draws_from(row):
    V, N = 40, 6000
    torch.manual_seed(1)
    logits = torch.randn(V) * 2
    history = [3, 3, 7, 1]

    def meta(n):
        return SamplingMetadata.build([row] * n, [history[:2]] * n, [history[2:]] * n, [None] * n, [0], V, CPU)

    p = kept_probs(logits[None].clone(), meta(1))[0]
    assert abs(float(p.sum()) - 1) < 1e-5
    if row.top_k:
        assert int((p > 0).sum()) <= row.top_k
    draws = Sampler()(logits.expand(N, V).clone(), meta(N)).token_ids
    counts = torch.bincount(draws, minlength=V)
    assert bool((counts[p == 0] == 0).all())
    assert chi2_pvalue(counts, p) > 1e-3
