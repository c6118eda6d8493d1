"""Weight formats of folders already quantized to int4 (GPTQ, AWQ): the checkpoint's grid runs in the
engine's int4 kernel as it is, without a float round-trip (checkpoint.py unpacks the hub layouts).

    gptq[-sym][-g64|-g128], awq[-sym][-g64|-g128]

The Linear holds q [N, K], d and (asymmetric) m per group, and for GPTQ each shard's g_idx, until
finish() packs them as int4's kernel wants (Int4's PackedInt4: the same kernel, code and C stack case).

Act-order (GPTQ desc_act): g_idx puts input column k in group g_idx[k], not k // G. finish() sorts the
columns by group (a stable permutation P, the same for every shard of a fused projection, else a
load error) so groups are contiguous again, and apply() multiplies x[:, P] by the sorted weight:
y = x W^T = x[:, P] W[:, P]^T. The permutation cannot move into the op before (an RMSNorm feeds
several projections and the residual stream; attention's output feeds o_proj), so such a layer runs
on the module path and the C decoder stack names it at start-up; without act-order P is the identity
and the layer is int4's in every respect.
"""
from __future__ import annotations

import torch
from torch import nn

from ridgeline.errors import ModelLoadError
from ridgeline.layers.weight_formats import load_rows, register_weight_format
from ridgeline.formats import rtn
from ridgeline.layers.int_formats import Int4
from ridgeline.formats.options import INT4_GROUP_SIZES, format_name


class PreQuantized(Int4):
    method = "?"

    def create(self, layer: nn.Module) -> None:
        self.check_shape(layer)
        N, K, G = layer.out_features, layer.in_features, self.group
        layer.qweight = nn.Parameter(torch.empty(N, K, dtype=torch.uint8), requires_grad=False)
        layer.scales = nn.Parameter(torch.empty(N, K // G, dtype=torch.float16), requires_grad=False)
        layer.qzeros = None if self.symmetric else nn.Parameter(torch.empty(N, K // G, dtype=torch.float16),
                                                                requires_grad=False)
        layer.g_idx = None
        if self.method == "gptq":  # one row per shard of a fused projection
            layer.g_idx = nn.Parameter(torch.empty(len(layer.shard_sizes or [0]), K, dtype=torch.int32),
                                       requires_grad=False)
        layer.weight = None
        layer.packed = layer.quant = layer.perm = None

    def load(self, layer: nn.Module, param: str, tensor: torch.Tensor, shard: int | None) -> None:
        if param == "g_idx":
            load_rows(layer.g_idx.data[shard or 0], tensor, None, f"g_idx of {layer.prefix}")
        else:
            load_rows(getattr(layer, param).data, tensor, layer.shard_rows(shard), f"{param} of {layer.prefix}")

    def finish(self, layer: nn.Module) -> None:
        if layer.qweight is None:
            return
        q = layer.qweight.data
        layer.perm = None if layer.g_idx is None else self._permutation(layer)
        if layer.perm is not None:
            q = q[:, layer.perm].contiguous()
        t = rtn.Int4Tensor(q, layer.scales.data, None if self.symmetric else layer.qzeros.data, self.group)
        self.place(layer, t, q)
        layer.qweight = layer.scales = layer.qzeros = layer.g_idx = None

    def _permutation(self, layer: nn.Module) -> torch.Tensor | None:
        """The input columns sorted by group (None when already in order)."""
        g = layer.g_idx.data
        if bool((g != g[0]).any()):
            raise ModelLoadError(f"{layer.prefix}: the fused projections' g_idx differ (act-order permutations "
                                 "must agree across q/k/v and gate/up to run as one matmul)")
        g = g[0].long()
        K = g.numel()
        natural = torch.arange(K) // self.group
        if bool((g == natural).all()):
            return None
        perm = torch.argsort(g, stable=True)
        if not bool((g[perm] == natural).all()):
            raise ModelLoadError(f"{layer.prefix}: g_idx does not put exactly {self.group} input columns in each "
                                 "group")
        return perm

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        if layer.perm is not None:
            x = x.index_select(-1, layer.perm)
        return super().apply(layer, x)

    def stack_weight(self, layer: nn.Module) -> tuple[int, int, int] | str:
        if layer.perm is not None:
            return f"{self.name}: act-order (g_idx) permutes the input columns, which the module path does"
        return super().stack_weight(layer)

    def weight_bytes(self, layer: nn.Module) -> int:
        if layer.qweight is not None:  # not finished yet
            return sum(t.numel() * t.element_size() for t in (layer.qweight, layer.scales, layer.qzeros, layer.g_idx)
                       if t is not None)
        return super().weight_bytes(layer) + (0 if layer.perm is None else layer.perm.numel() * 8)


for _method in ("gptq", "awq"):
    for _group in INT4_GROUP_SIZES:
        for _sym in (False, True):
            _cls = type(f"{_method.upper()}{'Sym' if _sym else ''}G{_group}", (PreQuantized,),
                        {"method": _method, "group": _group, "symmetric": _sym})
            register_weight_format(format_name(_method, _group, _sym))(_cls)
