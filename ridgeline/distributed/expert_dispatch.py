"""Expert parallelism for one sparse layer: each rank runs only its experts; routed (token, slot)
pairs travel to the rank that owns their expert and their outputs travel back.

Two exchanges with one result (rank r's tokens x_r [T_r, H] -> the routed sum [T_r, H]):
- all-to-all (`all_to_all_single`, gloo and NCCL have it): the per-expert counts are all-gathered
  (each rank learns every split, and the layer's global load), the pairs' rows are sent to their
  owners grouped by expert, each owner regroups what it received by (expert, source rank) — with
  contiguous token slices and expert blocks that is the single-process row order — runs its
  experts, sends the rows back, and the source combines them in expert order: the same sums, in
  the same order, as one process computes.
- gather-scatter (for a backend without all-to-all): tokens, experts and weights are all-gathered,
  each rank combines its own experts' rows for every token, and a reduce-scatter sums the ranks'
  partial outputs (a different order of the sum: outputs agree to rounding).

`ExpertParallel.forward_replicated` is the entry a model with replicated attention calls (every
rank holds the same T tokens): rank r takes the r-th contiguous slice of tokens, the exchange runs
on the slices, and an all-gather puts the whole output back on every rank. A data-parallel
attention would call `forward_local` with each rank's own tokens instead.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ridgeline.distributed.expert_placement import ExpertPlacement
from ridgeline.layers.expert_sharding import ExpertExchange

ALL_TO_ALL_BACKENDS = ("gloo", "nccl", "mpi", "ucc")
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def pick_dispatch(group, dispatch: str = "auto") -> str:
    if dispatch != "auto":
        if dispatch not in ("all_to_all", "gather_scatter"):
            raise ValueError(f"unknown expert dispatch {dispatch!r}")
        return dispatch
    backend = str(dist.get_backend(group)).lower()
    return "all_to_all" if any(b in backend for b in ALL_TO_ALL_BACKENDS) else "gather_scatter"


def gather_rows(group, t: torch.Tensor, world: int) -> torch.Tensor:
    """All-gather equal-shaped tensors along dim 0 (rank order)."""
    out = t.new_empty((world * t.shape[0], *t.shape[1:]))
    _all_gather(out, t.contiguous(), group=group)
    return out


class ExpertParallel(ExpertExchange):
    def __init__(self, group, placement: ExpertPlacement, dispatch: str = "auto"):
        self.group, self.placement = group, placement
        self.dispatch = pick_dispatch(group, dispatch)
        # [E]: the rank owning each expert (contiguous blocks, uneven where the ranks do not divide E)
        self.owner_of = torch.tensor([r for r, n in enumerate(placement.sizes) for _ in range(n)], device="cpu")

    def forward_replicated(self, compute, x: torch.Tensor, load: torch.Tensor | None = None) -> torch.Tensor:
        """x [T, H], the same on every rank -> the layer's output [T, H] on every rank. Routing runs
        on all T (cheap, and the same rows as one process); the experts only on this rank's slice."""
        T, H = x.shape
        N, r = self.placement.world, self.placement.rank
        chunk = -(-T // N)
        a, b = min(r * chunk, T), min((r + 1) * chunk, T)
        idx, w = compute.route(x)
        out = self._routed(compute, x[a:b], idx[a:b], w[a:b], load)
        compute.shared(x[a:b], out)
        padded = out.new_zeros(chunk, H)
        padded[:b - a] = out
        return gather_rows(self.group, padded, N)[:T]

    def forward_local(self, compute, x: torch.Tensor, load: torch.Tensor | None = None) -> torch.Tensor:
        """x [T_r, H], this rank's own tokens -> their outputs [T_r, H]."""
        idx, w = compute.route(x)
        out = self._routed(compute, x, idx, w, load)
        compute.shared(x, out)
        return out

    def _routed(self, compute, x, idx, w, load):
        if self.dispatch == "all_to_all":
            return self._all_to_all(compute, x, idx, w, load)
        return self._gather_scatter(compute, x, idx, w, load)

    def _all_to_all(self, compute, x, idx, w, load):
        p, (T, H), k = self.placement, x.shape, idx.shape[1]
        flat = idx.flatten()
        order = torch.argsort(flat, stable=True)  # pairs by expert, tokens ascending inside one
        counts = torch.bincount(flat, minlength=p.num_experts)
        table = gather_rows(self.group, counts[None], p.world)  # [N, E]: every rank's pairs per expert
        _count(load, table.sum(0))
        send = torch.zeros(p.world, dtype=counts.dtype).index_add_(0, self.owner_of.to(counts.device), counts).tolist()
        mine = table[:, p.first:p.first + p.per_rank]  # [N, my experts]: rows each source sends each of them
        recv = mine.sum(1).tolist()
        got = x.new_empty(sum(recv), H)
        dist.all_to_all_single(got, x[order // k].contiguous(), recv, send, group=self.group)
        # received (source, expert) blocks -> (expert, source): each expert's rows in token order
        keys = (torch.arange(p.per_rank)[None, :] * p.world + torch.arange(p.world)[:, None]).flatten()
        perm = torch.argsort(torch.repeat_interleave(keys, mine.flatten()), stable=True)
        ys = compute.experts(_offsets(p, mine.sum(0)), got[perm])
        back = torch.empty_like(ys)
        back[perm] = ys
        rows = x.new_empty(T * k, H)
        dist.all_to_all_single(rows, back, send, recv, group=self.group)
        return compute.combine(order // k, w.flatten()[order], rows, T)

    def _gather_scatter(self, compute, x, idx, w, load):
        p, (T, H), k = self.placement, x.shape, idx.shape[1]
        sizes = gather_rows(self.group, torch.tensor([T]), p.world)
        Tm = int(sizes.max())
        pad_x, pad_i, pad_w = x.new_zeros(Tm, H), idx.new_full((Tm, k), -1), w.new_zeros(Tm, k)
        pad_x[:T], pad_i[:T], pad_w[:T] = x, idx, w
        xs, ids, ws = (gather_rows(self.group, t, p.world) for t in (pad_x, pad_i, pad_w))
        flat = ids.flatten()
        _count(load, torch.bincount(flat[flat >= 0], minlength=p.num_experts))
        local = ((flat >= p.first) & (flat < p.first + p.per_rank)).nonzero().flatten()
        order = local[torch.argsort(flat[local], stable=True)]
        per_expert = torch.bincount(flat[order] - p.first, minlength=p.per_rank)
        ys = compute.experts(_offsets(p, per_expert), xs[order // k])
        partial = compute.combine(order // k, ws.flatten()[order], ys, p.world * Tm)
        out = partial.new_empty(Tm, H)
        _reduce_scatter(out, partial, group=self.group)
        return out[:T]


def _offsets(p: ExpertPlacement, rows: torch.Tensor) -> torch.Tensor:
    """[E + 1] int64 row offsets where only this rank's experts have rows (rows [its experts])."""
    off = torch.zeros(p.num_experts + 1, dtype=torch.int64)
    off[p.first + 1:p.first + p.per_rank + 1] = torch.cumsum(rows, 0)
    off[p.first + p.per_rank + 1:] = off[p.first + p.per_rank]
    return off


def _count(load: torch.Tensor | None, per_expert: torch.Tensor) -> None:
    """load (SparseMoE's counters, int64 [E + 2]): pairs per expert, experts that ran, calls."""
    if load is not None:
        E = per_expert.shape[0]
        load[:E] += per_expert
        load[E] += int((per_expert > 0).sum())
        load[E + 1] += 1
