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
stay near 1. The scaled layers are then rounded on clipped grids (clip.py), AWQ's second search.

With duo candidates (AutoAWQ's duo scaling) the grid also holds s = mean|x|^alpha / mean|w|^(1-alpha),
w each weight relative to the largest of its quantization group, averaged over the layers' rows per
input channel: a channel whose weights are small within their groups is scaled up more. Both kinds are
scored alike and the best wins, so the plain grid's choice stays available.
"""
from __future__ import annotations

import torch

from ridgeline.formats import grid

ALPHAS = tuple(i / 20 for i in range(20))  # 0, 0.05, ..., 0.95
SEARCH_ROWS = 256  # output rows (evenly spaced over the group's layers) the search scores; all are quantized


def output_error(weights: list[torch.Tensor], H: torch.Tensor, s: torch.Tensor, group: int,
                 symmetric: bool) -> float:
    """err(s) summed over the layers (each [N_i, K]) that share the input with Gram matrix H [K, K]."""
    total = 0.0
    for W in weights:
        Ws = W.float() * s[None, :]
        g = grid.fit_groups(Ws, group, symmetric)
        dW = W.float() - g.dequantize(g.quantize(Ws, group), group) / s[None, :]
        total += float(((dW @ H) * dW).sum())
    return total


def weight_magnitude(weights: list[torch.Tensor], group: int) -> torch.Tensor:
    """[K]: each input channel's mean over the layers' rows of |w| / max |w| of w's quantization group."""
    a = torch.cat([W.float() for W in weights]).abs()
    N, K = a.shape
    a = a.reshape(N, K // group, group)
    return (a / a.amax(-1, keepdim=True).clamp(min=1e-12)).reshape(N, K).mean(0)


def best_scale(score, mean_abs: torch.Tensor, w_mag: torch.Tensor | None = None,
               alphas: tuple[float, ...] = ALPHAS, refine: float = 0.0) -> tuple[torch.Tensor, float, bool]:
    """score(s) -> error of the per-input-channel scale s [K]; -> (the best s, its alpha, whether it is a
    duo candidate). w_mag (weight_magnitude, or None for the plain grid only) adds the duo candidates;
    refine > 0 then also scores the winner's kind at its alpha -/+ refine (within [0, 1]). The plain
    alpha = 0 (s = 1) is scored first and kept on ties."""
    x = mean_abs.float().clamp(min=1e-5)
    w = None if w_mag is None else w_mag.float().clamp(min=1e-5)
    best = [float("inf"), torch.ones_like(x), 0.0, False]

    def consider(alpha: float, duo: bool) -> None:
        s = x.pow(alpha) / w.pow(1 - alpha) if duo else x.pow(alpha)
        s = s / (s.max() * s.min()).sqrt()
        err = score(s)
        if err < best[0]:
            best[:] = [err, s, alpha, duo]

    for duo in (False,) if w is None else (False, True):
        for alpha in alphas:
            consider(alpha, duo)
    if refine > 0:
        centre, duo = best[2], best[3]
        for alpha in (centre - refine, centre + refine):
            if 0 <= alpha <= 1 and not any(abs(alpha - a) < 1e-9 for a in alphas):
                consider(alpha, duo)
    return best[1], best[2], best[3]


def search_scale(weights: list[torch.Tensor], H: torch.Tensor, mean_abs: torch.Tensor, group: int,
                 symmetric: bool, alphas: tuple[float, ...] = ALPHAS,
                 w_mag: torch.Tensor | None = None, refine: float = 0.0) -> tuple[torch.Tensor, float]:
    """The per-input-channel scale [K] (float32) with the least output error, and its alpha."""
    H = H.float()
    rows = torch.cat([W.float() for W in weights])
    if rows.shape[0] > SEARCH_ROWS:  # the error is a sum over rows: a spread-out subset estimates it
        rows = rows[torch.linspace(0, rows.shape[0] - 1, SEARCH_ROWS).round().long()]
    s, alpha, _ = best_scale(lambda s: output_error([rows], H, s, group, symmetric), mean_abs, w_mag, alphas,
                              refine)
    return s, alpha
