"""AWQ (Lin et al., 2023): scale each input channel of a linear layer up before quantizing, by
s = mean|x|^alpha of the channel's calibration activations, and divide its input by s (folded into
the op that produces the input, so the model computes the same function in full precision). Salient
channels (large |x|) then lose less to rounding. alpha is searched over a grid per group of layers
that share an input, minimizing the reconstruction error of their outputs on the calibration data,

    err(s) = sum over the layers' rows of  dW H dW^T,   dW = W - Q(W diag(s)) diag(s)^-1,   H = X^T X

which is ||X W^T - X Q^T||^2 computed from the captured H without keeping X, scored on at most
SEARCH_ROWS rows spread over the layers (rows are independent; a subset estimates the sum at a
fraction of the cost). alpha = 0 (s = 1) is on the grid, so the search never does worse than
round-to-nearest on the scored rows. s is normalized to sqrt(max * min) = 1 so the folded scales
stay near 1. The grid pass rounds on plain grids; the TOP best alphas (and alpha = 0) are then scored
again with the clipped grids the layers are finally rounded on (clip.py, AWQ's second search), and
the best of those is kept: the scale is chosen for the rounding it will get, and on the scored rows
it does no worse than clipping alone.
"""
from __future__ import annotations

import torch

from ridgeline.quant import clip, grid

ALPHAS = tuple(i / 20 for i in range(20))  # 0, 0.05, ..., 0.95
SEARCH_ROWS = 256  # output rows (evenly spaced over the group's layers) the search scores; all are quantized
TOP = 3  # alphas of the plain-grid pass scored again with clipped grids


def normalized(s: torch.Tensor) -> torch.Tensor:
    return s / (s.max() * s.min()).sqrt()


def candidates(mean_abs: torch.Tensor, weights: list[torch.Tensor], group: int, alphas: tuple[float, ...],
               duo: bool = False) -> list[tuple[float, torch.Tensor]]:
    """(alpha, s) for each alpha: s = x^alpha; duo adds s = x^alpha / w^(1 - alpha), w each input
    channel's mean weight magnitude relative to its group's largest."""
    x = mean_abs.float().clamp(min=1e-5)
    out = [(alpha, normalized(x.pow(alpha))) for alpha in alphas]
    if duo:
        W = torch.cat([w.float() for w in weights]).abs()
        N, K = W.shape
        g = W.reshape(N, K // group, group)
        w = (g / (g.amax(-1, keepdim=True) + 1e-6)).reshape(N, K).mean(0)
        out += [(alpha, normalized((x.pow(alpha) / (w.pow(1 - alpha) + 1e-4)).clamp(min=1e-4))) for alpha in alphas]
    return out


def scaled_gram(H: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """X^T X of the scaled layers' input x / s, computed as InputStats.scaled computes it (float64)."""
    sd = s.double()
    return H.double() / (sd[:, None] * sd[None, :])


def rounded(W: torch.Tensor, s: torch.Tensor, group: int, symmetric: bool,
            g: grid.GroupGrid | None = None) -> torch.Tensor:
    """The values W diag(s) rounds to (on grid g of W diag(s), else its plain grid), divided by s: what
    the layer computes with the scale folded into its input's producer."""
    Ws = W.float() * s[None, :]
    g = g or grid.fit_groups(Ws, group, symmetric)
    return g.dequantize(g.quantize(Ws, group), group) / s[None, :]


def clipped_grid(W: torch.Tensor, H: torch.Tensor, s: torch.Tensor, group: int, symmetric: bool) -> grid.GroupGrid:
    """The clipped grid of W diag(s) for the input x / s (H = X^T X of x): the grid it is finally rounded on."""
    return clip.fit_clipped(W.float() * s[None, :], scaled_gram(H, s), group, symmetric)


def output_error(weights: list[torch.Tensor], H: torch.Tensor, s: torch.Tensor, group: int,
                 symmetric: bool, clipped: bool = False) -> float:
    """err(s) summed over the layers (each [N_i, K]) that share the input with Gram matrix H [K, K];
    clipped: each layer rounded on its clipped grid, else on the plain one."""
    total = 0.0
    for W in weights:
        g = clipped_grid(W, H, s, group, symmetric) if clipped else None
        dW = W.float() - rounded(W, s, group, symmetric, g)
        total += float(((dW @ H) * dW).sum())
    return total


def search_scale(weights: list[torch.Tensor], H: torch.Tensor, mean_abs: torch.Tensor, group: int,
                 symmetric: bool, alphas: tuple[float, ...] = ALPHAS) -> tuple[torch.Tensor, float]:
    """The per-input-channel scale [K] (float32) with the least output error, and its alpha."""
    H = H.float()
    rows = torch.cat([W.float() for W in weights])
    if rows.shape[0] > SEARCH_ROWS:  # the error is a sum over rows: a spread-out subset estimates it
        rows = rows[torch.linspace(0, rows.shape[0] - 1, SEARCH_ROWS).round().long()]
    x = mean_abs.float().clamp(min=1e-5)
    cands = [(alpha, normalized(x.pow(alpha))) for alpha in alphas]
    plain = sorted((output_error([rows], H, s, group, symmetric), i) for i, (_, s) in enumerate(cands))
    top = {i for _, i in plain[:TOP]} | {0}  # alpha = 0 always: never worse than the clipped s = 1
    best = min((output_error([rows], H, cands[i][1], group, symmetric, clipped=True), i) for i in sorted(top))
    alpha, s = cands[best[1]]
    return s, alpha
