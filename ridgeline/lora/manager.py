"""The adapters an engine holds, and each step's per-row additions (the runner's `deltas` seam).

A step with adapter rows gets a delta(linear, x, y): for every adapter among its rows, y[rows] gains
B (A x[rows]) on the rows of each piece that adapter has on that Linear, grouped by adapter (shrink then
expand, as Punica's SGMV groups them). On a CPU with the packed kernels both matmuls are
kernels/gemm_packed.c's fp32 kernel, whose rows never depend on the other rows of the call: a row's result
is the same alone, beside other adapters' rows, or among any number of its own adapter's. Elsewhere (CUDA)
they are torch matmuls. Such a step runs its layers as modules (the C decoder stack has no LoRA descriptor
yet); a step without adapter rows runs as it always has."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from ridgeline.errors import InvalidRequestError
from ridgeline.kernels import cpu_gemm
from ridgeline.lora.adapter import Piece, map_adapter
from ridgeline.lora.peft_files import read_peft
from ridgeline.lora.request import LoRARequest


@dataclass
class _Packed:
    row: int
    rows: int
    shrink: object  # x [M, in] -> [M, r] fp32
    expand: object  # [M, r] -> [M, rows] fp32


def _matmul(w: torch.Tensor, device: torch.device):
    """x -> x @ w^T in fp32: the packed CPU kernel where it runs (rows independent of the batch), else torch."""
    if device.type == "cpu" and cpu_gemm.available(torch.float32):
        return cpu_gemm.PackedWeight(w.float().contiguous())
    w = w.float().to(device)
    return lambda x: x.float() @ w.T


class LoRAManager:
    def __init__(self, model: nn.Module, max_rank: int, device: torch.device):
        if getattr(model.model, "tp", None) is not None:
            raise InvalidRequestError("LoRA adapters do not run with tensor parallelism yet", "enable_lora")
        if getattr(model.model, "stage", None) is not None:
            raise InvalidRequestError("LoRA adapters do not run with pipeline parallelism yet", "enable_lora")
        self.model, self.max_rank, self.device = model, max_rank, device
        self.paths: dict[str, str] = {}  # name -> the folder it was read from
        self.layers: dict[str, dict[str, list[_Packed]]] = {}  # Linear prefix -> adapter name -> its pieces
        self.bytes: dict[str, int] = {}  # name -> bytes of its A and B (fp32)

    def knows(self, name: str) -> bool:
        return name in self.paths

    def register(self, req: LoRARequest) -> str:
        """Read, check and pack the adapter (once per name); returns its name. The same name again must name
        the same folder."""
        if req.name in self.paths:
            if self.paths[req.name] != req.path:
                raise InvalidRequestError(f"LoRA adapter {req.name!r} is already loaded from {self.paths[req.name]}",
                                          "lora_request")
            return req.name
        pieces = map_adapter(read_peft(req.name, req.path, self.max_rank), self.model, self.max_rank)
        self._pack(req.name, pieces)
        self.paths[req.name] = req.path
        return req.name

    def _pack(self, name: str, pieces: dict[str, list[Piece]]) -> None:
        total = 0
        for prefix, ps in pieces.items():
            packed = [_Packed(p.row, p.rows, _matmul(p.A, self.device), _matmul(p.B, self.device)) for p in ps]
            self.layers.setdefault(prefix, {})[name] = packed
            total += sum(4 * (p.A.numel() + p.B.numel()) for p in ps)
        self.bytes[name] = total

    def for_step(self, seqs) -> _StepDelta | None:
        """The step's delta, or None when no row runs under an adapter."""
        if not any(s.adapter for s in seqs):
            return None
        n = np.fromiter((s.num_new for s in seqs), np.int64, len(seqs))
        ends = np.cumsum(n)
        rows: dict[str, list[np.ndarray]] = {}
        for s, e, k in zip(seqs, ends, n):
            if s.adapter:
                rows.setdefault(s.adapter, []).append(np.arange(e - k, e))
        T = int(ends[-1])
        groups = []
        for name, parts in rows.items():
            idx = np.concatenate(parts)
            sel = slice(0, T) if len(idx) == T else torch.from_numpy(idx).to(self.device)
            groups.append((name, sel))
        return _StepDelta(self.layers, groups)


class _StepDelta:
    """delta(linear, x, y) for one step: y [T, N] plus each adapter row's B (A x)."""

    def __init__(self, layers: dict[str, dict[str, list[_Packed]]], groups: list[tuple[str, object]]):
        self.layers, self.groups = layers, groups

    def __call__(self, linear: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        mine = self.layers.get(linear.prefix)
        if not mine:
            return y
        for name, sel in self.groups:
            pieces = mine.get(name)
            if not pieces:
                continue
            xa = x[sel]
            for p in pieces:
                d = p.expand(p.shrink(xa)).to(y.dtype)
                y[sel, p.row:p.row + p.rows] += d
        return y
