"""Linear layer whose weight lives in a weight format (ridgeline.layers.weight_formats): the format
creates the parameters, loads checkpoint tensors (whole, or one shard of a fused projection),
repacks them after loading and applies them. The bias, when there is one, stays in the
activation dtype and is added here."""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

import torch
from torch import nn

from ridgeline.layers.forward_context import current_delta
from ridgeline.layers.kernel_plan import KernelPlan
from ridgeline.layers.weight_formats import DENSE, WeightFormat, create_weight_format, load_rows


class Linear(nn.Module):
    def __init__(self, in_features: int, out_features: int, fmt: WeightFormat, bias: bool = False,
                 act_dtype: torch.dtype = torch.float32, shard_sizes: Sequence[int] | None = None, prefix: str = ""):
        """shard_sizes: output rows of each projection fused into this one (q, k, v or gate, up)."""
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.format, self.prefix = fmt, prefix
        self.shard_sizes = tuple(shard_sizes) if shard_sizes else None
        fmt.create(self)
        self.bias = nn.Parameter(torch.zeros(out_features, dtype=act_dtype), requires_grad=False) if bias else None

    def shard_rows(self, shard: int | None) -> tuple[int, int] | None:
        """(first row, rows) of a fused projection's shard; None for the whole weight."""
        if shard is None:
            return None
        return sum(self.shard_sizes[:shard]), self.shard_sizes[shard]

    def load(self, param: str, tensor: torch.Tensor, shard: int | None = None) -> None:
        if param == "bias":
            load_rows(self.bias.data, tensor, self.shard_rows(shard), f"bias of {self.prefix}")
        else:
            self.format.load(self, param, tensor, shard)

    def finish_loading(self) -> None:
        self.format.finish(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [M, K] -> [M, N]"""
        y = self.format.apply(self, x)
        y = y if self.bias is None else y + self.bias
        delta = current_delta()  # a step's per-row additions (LoRA), after the bias as PEFT adds them
        return y if delta is None else delta(self, x, y)


def finish_loading(model: nn.Module) -> None:
    """Every Linear's post-load step (repacking for the chosen kernels)."""
    for m in model.modules():
        if isinstance(m, Linear):
            m.finish_loading()


def weight_summary(model: nn.Module) -> tuple[str, int]:
    """(each weight format with its count of Linears, bytes of Linear weights as stored: what a decode step reads)."""
    counts: Counter[str] = Counter()
    total = 0
    for m in model.modules():
        if isinstance(m, Linear):
            counts[m.format.label(m)] += 1
            total += m.format.weight_bytes(m)
    return ", ".join(f"{name} x {n}" for name, n in counts.most_common()), total


def matmul_fn(w: torch.Tensor, plan: KernelPlan, fmt: str | None = None) -> Callable[[torch.Tensor], torch.Tensor]:
    """x -> x @ w^T the way a Linear holding w computes it under `plan`: dense in w's dtype, or in
    weight format fmt (a registered name, e.g. "int8": w quantized as a checkpoint's would be)."""
    lin = Linear(w.shape[1], w.shape[0], create_weight_format(fmt or DENSE[w.dtype], plan))
    lin.weight.data = w
    lin.finish_loading()
    return lin
