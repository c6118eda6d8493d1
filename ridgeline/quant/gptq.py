"""GPTQ (Frantar et al., 2022): quantize a linear layer's weight W [N, K] column by column, each column's
rounding error spread over the columns not yet quantized through the inverse Hessian of the layer's
reconstruction loss ||X W^T - X Q^T||^2, H = 2 X^T X over the calibration inputs X [T, K].

    damping      H += damp * mean(diag H) * I (dead columns, diag 0, get 1 and a zero weight)
    inverse      the upper Cholesky factor U of H^-1: column i's error err = (w_i - q_i) / U[i, i]
                 updates the later columns by err * U[i, j]
    lazy batches columns in blocks of BLOCK; inside a block updates stay in the block, the rest of W
                 gets one matrix product per block
    groups       each group's grid (grid.fit) is fitted when the loop reaches its first column, on the
                 weights as updated so far, so later groups see the compensated values
    act-order    columns processed by decreasing diag(H); groups are G consecutive columns of that
                 order, recorded as g_idx[k] = the group of input column k (the hub's layout)
Rows are independent: q, k and v (which share an input and H) give the same result alone or stacked.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ridgeline.errors import InvalidRequestError
from ridgeline.formats import grid

BLOCK = 128  # a multiple of every group size
DAMP = 0.01


@dataclass
class Quantized:
    q: torch.Tensor  # [N, K] uint8, input columns in checkpoint order
    grid: grid.GroupGrid  # scale / zero [N, K / G] by group index
    g_idx: torch.Tensor | None  # [K] int32 group of each input column; None: k // G

    def dequantize(self, group: int) -> torch.Tensor:
        """[N, K] float32, the values the quantized layer multiplies by."""
        if self.g_idx is None:
            return self.grid.dequantize(self.q, group)
        s = self.grid.scale.float()[:, self.g_idx.long()]
        z = self.grid.zero.float()[:, self.g_idx.long()]
        return s * (self.q.float() - z)


def inverse_factor(H: torch.Tensor, damp: float = DAMP) -> torch.Tensor:
    """Upper Cholesky factor of (H + damping)^-1, in float64."""
    H = H.double().clone()
    H.diagonal().add_(damp * float(H.diagonal().mean()))
    try:
        L = torch.linalg.cholesky(H)
        return torch.linalg.cholesky(torch.cholesky_inverse(L), upper=True)
    except torch.linalg.LinAlgError:
        raise InvalidRequestError("GPTQ: the damped Hessian is not positive definite; raise the damping or give "
                                  "more calibration text", "calibration") from None


def quantize(W: torch.Tensor, H: torch.Tensor, group: int, symmetric: bool, act_order: bool = False,
             damp: float = DAMP) -> Quantized:
    """W [N, K] float, H [K, K] (any positive multiple of X^T X) -> the layer on the int4 grid."""
    N, K = W.shape
    grid.check_group(K, group)
    W = W.detach().double().clone()
    H = H.detach().double().clone()
    dead = H.diagonal() == 0
    H[dead, dead] = 1
    W[:, dead] = 0
    perm = torch.argsort(H.diagonal(), descending=True, stable=True) if act_order else None
    if perm is not None:
        W, H = W[:, perm], H[perm][:, perm]
    U = inverse_factor(H, damp)
    Q = torch.zeros(N, K, dtype=torch.uint8)
    scales = torch.zeros(N, K // group, dtype=torch.float16)
    zeros = torch.zeros(N, K // group, dtype=torch.int32)
    for b0 in range(0, K, BLOCK):
        b1 = min(b0 + BLOCK, K)
        W1, E1, U1 = W[:, b0:b1].clone(), torch.zeros(N, b1 - b0, dtype=W.dtype), U[b0:b1, b0:b1]
        for i in range(b1 - b0):
            if (b0 + i) % group == 0:
                g = (b0 + i) // group
                scales[:, g], zeros[:, g] = grid.fit(W1[:, i:i + group], symmetric)
                s, z = scales[:, g].double(), zeros[:, g].double()
            w = W1[:, i]
            q = torch.where(s == 0, z, torch.round(w / torch.where(s == 0, torch.ones_like(s), s)) + z).clamp_(0, 15)
            Q[:, b0 + i] = q.to(torch.uint8)
            err = (w - s * (q - z)) / U1[i, i]
            W1[:, i:] -= err[:, None] * U1[i, i:][None, :]
            E1[:, i] = err
        W[:, b1:] -= E1 @ U[b0:b1, b1:]
    gg = grid.GroupGrid(scales, zeros, symmetric)
    if perm is None:
        return Quantized(Q, gg, None)
    inv = torch.argsort(perm)
    g_idx = (torch.arange(K) // group).to(torch.int32)[inv]  # input column k sat at position inv[k]
    return Quantized(Q[:, inv].contiguous(), gg, g_idx)
