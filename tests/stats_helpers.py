"""Statistics for tests that check sampled output against a known distribution."""
from __future__ import annotations

import torch


def chi2_pvalue(counts: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0) -> float:
    """Pearson's chi-square test of counts against probs; cells expected below min_expected are pooled."""
    n = counts.sum().double()
    expected = probs.double() * n
    small = expected < min_expected
    obs = torch.cat([counts[~small].double(), counts[small].double().sum().view(1)])
    exp = torch.cat([expected[~small], expected[small].sum().view(1)])
    keep = exp > 0
    assert bool((obs[~keep] == 0).all()), "a count where the target has no mass"
    obs, exp = obs[keep], exp[keep]
    stat = ((obs - exp) ** 2 / exp).sum()
    df = len(obs) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), stat / 2))


def chi2_two_sample_pvalue(a: torch.Tensor, b: torch.Tensor) -> float:
    """Pearson's chi-square test that counts a and b (over the same cells) come from one distribution."""
    keep = (a + b) > 0
    table = torch.stack([a[keep].double(), b[keep].double()])
    expected = table.sum(1, keepdim=True) * table.sum(0, keepdim=True) / table.sum()
    stat = ((table - expected) ** 2 / expected).sum()
    df = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), stat / 2))
