"""Quality measures of one model against a reference model on the same token windows.

    perplexity   exp(mean negative log-likelihood) of each window's tokens given the tokens before
                 them in the window (its first token is context only)
    agreement    teacher-forced top-1 agreement: the fraction of positions where both models' most
                 likely next token is the same, both reading the same text; also by position in the
                 window (POSITION_SPANS), to show whether error compounds with depth
    KL           mean over positions of KL(P_ref || P) of the next-token distributions, in nats
    divergence   greedy generation from the same prompts: tokens generated before the first token
                 that differs from the reference's
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

CHUNK = 64  # rows per fp64 softmax in compare()
# positions in a window (the query's index: the row that predicts token p + 1), as [start, end)
POSITION_SPANS = ((0, 128), (128, 1024), (1024, 2048), (2048, None))


@dataclass
class Totals:
    """Sums over windows; the measures are ratios of them."""
    nll: float = 0.0  # summed negative log-likelihood of the scored tokens
    scored: int = 0  # tokens scored for perplexity
    agree: int = 0  # positions whose top-1 equals the reference's
    kl: float = 0.0  # summed KL(P_ref || P)
    positions: int = 0  # positions compared with the reference
    spans: list[list[int]] = field(default_factory=lambda: [[0, 0] for _ in POSITION_SPANS])  # [agree, positions]

    def add_logprobs(self, logprobs: list[float]) -> None:
        self.nll -= math.fsum(logprobs)
        self.scored += len(logprobs)

    def add_comparison(self, ref_logits: torch.Tensor, logits: torch.Tensor) -> None:
        agree, kl = compare(ref_logits, logits)
        self._add_spans((ref_logits.argmax(-1) == logits.argmax(-1)).tolist())
        self.agree += agree
        self.kl += kl
        self.positions += ref_logits.shape[0]

    def add_agreement(self, ref_top1: list[int], top1: list[int]) -> None:
        """Top-1 tokens of the reference and of the model at the same positions (no distributions: no KL)."""
        if len(ref_top1) != len(top1):
            raise ValueError(f"{len(top1)} positions vs the reference's {len(ref_top1)}")
        matches = [a == b for a, b in zip(ref_top1, top1)]
        self._add_spans(matches)
        self.agree += sum(matches)
        self.positions += len(top1)

    def _add_spans(self, matches: list[bool]) -> None:
        """matches[p]: whether the top-1 after window position p agrees (every window starts at 0)."""
        for (lo, hi), span in zip(POSITION_SPANS, self.spans):
            part = matches[lo:hi]
            span[0] += sum(part)
            span[1] += len(part)

    @property
    def agreement_by_position(self) -> dict[str, float]:
        """Top-1 agreement per span of window positions that has any, e.g. {"0-128": 0.99, "1024-2048": 0.98}."""
        return {f"{lo}+" if hi is None else f"{lo}-{hi}": agree / n
                for (lo, hi), (agree, n) in zip(POSITION_SPANS, self.spans) if n}

    @property
    def perplexity(self) -> float:
        return math.exp(self.nll / self.scored) if self.scored else float("nan")

    @property
    def agreement(self) -> float:
        return self.agree / self.positions if self.positions else float("nan")

    @property
    def mean_kl(self) -> float:
        return self.kl / self.positions if self.positions else float("nan")


def compare(ref_logits: torch.Tensor, logits: torch.Tensor) -> tuple[int, float]:
    """[T, V] logits of the reference and of the model at the same positions -> (positions whose
    top-1 agrees, summed KL(P_ref || P) in nats), in fp64 so the sum does not depend on T."""
    if ref_logits.shape != logits.shape:
        raise ValueError(f"logits {tuple(logits.shape)} vs reference {tuple(ref_logits.shape)}")
    agree = int((ref_logits.argmax(-1) == logits.argmax(-1)).sum())
    kl = 0.0
    for r, q in zip(ref_logits.split(CHUNK), logits.split(CHUNK)):  # bounded fp64 temporaries
        lr, lq = torch.log_softmax(r.double(), -1), torch.log_softmax(q.double(), -1)
        kl += float((lr.exp() * (lr - lq)).sum())
    return agree, max(kl, 0.0)


def tokens_before_divergence(ref: list[int], out: list[int]) -> int:
    """Length of the common prefix of two generations."""
    n = 0
    for a, b in zip(ref, out):
        if a != b:
            break
        n += 1
    return n
