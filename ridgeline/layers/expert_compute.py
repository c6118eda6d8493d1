"""A rank's share of one sparse layer, in the pieces expert parallelism exchanges tokens between:
route (router, softmax, top-k, weights), experts (rows already grouped by expert: only this rank's
experts have rows), combine (weighted rows summed into their tokens, in row order) and the shared
expert. Two implementations with one contract: the C kernels of moe.c (fp32 with the fused
kernels: the same code the single-process layer runs, so rows come out bitwise the same) and torch
(any dtype). Shapes: x [T, H]; idx, w [T, k]; rows [R, H]; off [E + 1] int64 (expert e owns rows
off[e]:off[e + 1])."""
from __future__ import annotations

import torch

from ridgeline.kernels import cpu_moe


class CExperts:
    def __init__(self, desc: torch.Tensor, layer: int):
        self.desc, self.layer = desc, layer

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if not x.shape[0]:
            k = int(self.desc[1])
            return torch.empty(0, k, dtype=torch.int64), torch.empty(0, k)
        return cpu_moe.route(self.desc, x.contiguous(), self.layer)

    def experts(self, off: torch.Tensor, xs: torch.Tensor) -> torch.Tensor:
        return cpu_moe.experts(self.desc, off, xs.contiguous()) if xs.shape[0] else torch.empty_like(xs)

    def combine(self, tok: torch.Tensor, wt: torch.Tensor, ys: torch.Tensor, T: int) -> torch.Tensor:
        return cpu_moe.combine(tok.contiguous(), wt.contiguous(), ys.contiguous(), T)

    def shared(self, x: torch.Tensor, out: torch.Tensor) -> None:
        if int(self.desc[4]) and x.shape[0]:
            cpu_moe.shared(self.desc, x.contiguous(), out)


class TorchExperts:
    def __init__(self, moe):
        self.moe = moe  # layers.moe.SparseMoE

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        probs = torch.softmax(self.moe.gate(x).float(), dim=-1)
        w, idx = torch.topk(probs, self.moe.top_k, dim=-1)  # largest first; ties as transformers
        if self.moe.norm_topk:
            w = w / w.sum(dim=-1, keepdim=True)
        return idx, w

    def experts(self, off: torch.Tensor, xs: torch.Tensor) -> torch.Tensor:
        ys = torch.empty_like(xs)
        bounds = off.tolist()
        for e, expert in self.moe.expert_items():
            a, b = bounds[e], bounds[e + 1]
            if b > a:
                ys[a:b] = expert(xs[a:b])
        return ys

    def combine(self, tok: torch.Tensor, wt: torch.Tensor, ys: torch.Tensor, T: int) -> torch.Tensor:
        out = torch.zeros(T, ys.shape[1], dtype=ys.dtype)
        return out.index_add_(0, tok, ys * wt.to(ys.dtype)[:, None])

    def shared(self, x: torch.Tensor, out: torch.Tensor) -> None:
        m = self.moe
        if m.shared_expert is not None and x.shape[0]:
            out.add_(torch.sigmoid(m.shared_expert_gate(x)) * m.shared_expert(x))
