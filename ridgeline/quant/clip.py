"""Clipped int4 grids: each group's range shrunk by the ratio (of RATIOS) that minimizes the group's
share of the layer's output error on the calibration data (AWQ's clipping search),

    err(n, g, r) = dw H_gg dw^T,   dw = w[n, g] - Q_r(w[n, g]),   H_gg the group's diagonal block of X^T X

A smaller range rounds the many small weights more finely at the price of clamping the few largest;
the Hessian block says which matters more for this layer's inputs. The cross-group terms of H are
left out (as AWQ's search leaves them out: each group is scored on its own slice of the input), so
groups are chosen independently and the search is one batched pass per ratio. Ratio 1 (the plain
grid) is on the list, so no group does worse than round-to-nearest by this measure.
"""
from __future__ import annotations

import torch

from ridgeline.formats import grid

RATIOS = tuple(1 - i / 40 for i in range(21))  # 1, 0.975, ..., 0.5


def fit_clipped(W: torch.Tensor, H: torch.Tensor, group: int, symmetric: bool,
                ratios: tuple[float, ...] = RATIOS) -> grid.GroupGrid:
    """W [N, K] float, H [K, K] -> the grid of each group at its best ratio."""
    N, K = W.shape
    grid.check_group(K, group)
    G = K // group
    w = W.float().reshape(N, G, group)
    idx = torch.arange(G)
    Hb = H.float().reshape(G, group, G, group)[idx, :, idx, :]  # [G, group, group] diagonal blocks
    best = torch.full((N, G), float("inf"))
    scale = torch.zeros(N, G, dtype=torch.float16)
    zero = torch.zeros(N, G, dtype=torch.int32)
    for r in ratios:
        s, z = grid.fit(w, symmetric, r)
        dw = (w - grid.GroupGrid(s, z, symmetric).round_blocks(w)).transpose(0, 1)  # [G, N, group]
        err = (torch.bmm(dw, Hb) * dw).sum(-1).t()
        better = err < best
        best = torch.where(better, err, best)
        scale, zero = torch.where(better, s, scale), torch.where(better, z, zero)
    return grid.GroupGrid(scale, zero, symmetric)
