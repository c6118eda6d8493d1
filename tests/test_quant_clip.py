"""AWQ's clipped grids (quant/clip.py): each group's grid is the best of the ratios by its share of the
layer's output error, so no group does worse than the plain grid by that measure; and the grouped
rounding the search uses equals the grid's quantize-then-dequantize."""
import pytest
import torch

from ridgeline.quant import clip
from ridgeline.formats import grid


def _group_errors(W, H, g, group):
    N, K = W.shape
    G = K // group
    dw = (W - g.dequantize(g.quantize(W, group), group)).reshape(N, G, group)
    idx = torch.arange(G)
    Hb = H.reshape(G, group, G, group)[idx, :, idx, :]
    return torch.einsum("ngi,gij,ngj->ng", dw, Hb, dw)


@pytest.mark.parametrize("symmetric", [True, False])
def test_clipped_grid_never_worse_per_group_and_rounding_matches(symmetric):
    gen = torch.Generator().manual_seed(7)
    W = torch.randn(48, 128, generator=gen) * 0.05
    W[:, 5] *= 8  # an outlier column: its groups gain from clipping the others' range less
    X = torch.randn(1024, 128, generator=gen) * torch.linspace(0.1, 2, 128)
    H = X.t() @ X
    g = clip.fit_clipped(W, H, 32, symmetric)
    plain = grid.fit_groups(W, 32, symmetric)
    err, base = _group_errors(W, H, g, 32), _group_errors(W, H, plain, 32)
    assert bool((err <= base * (1 + 1e-5) + 1e-12).all())
    assert float(err.sum()) < float(base.sum())  # some group clipped to its gain
    w3 = W.reshape(48, 4, 32)
    assert torch.equal(g.round_blocks(w3).reshape(48, 128), g.dequantize(g.quantize(W, 32), 32))
