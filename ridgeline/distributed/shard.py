"""A rank's slice of each checkpoint tensor, cut as it is read (one tensor at a time, so no rank ever
holds the whole model), and the per-rank architecture its modules are built with.

Column-parallel (output rows split): q, k, v (whole heads of the rank's GQA groups) and the attention
sinks (one per query head), gate and up (MLP width), the vocabulary (embedding and LM head rows, zero-padded to the chunk). Row-parallel
(input columns split): o (the rank's query heads) and down (MLP width); their partial sums are
all-reduced in the stack's hooks, so a row-parallel bias is loaded on rank 0 only (added once).
GGUF blocks split as blocks: rows freely, columns only at block boundaries.
"""
from __future__ import annotations

import re
from dataclasses import replace

import torch

from ridgeline.distributed.layout import RankShard
from ridgeline.errors import InvalidRequestError, ModelLoadError
from ridgeline.gguf.blocks import GGUFBlocks

_COLUMN = {"qkv_proj", "gate_up_proj"}  # output rows split
_ROW = {"o_proj", "down_proj"}  # input columns split
_VOCAB = {"model.embed_tokens.weight", "lm_head.weight"}
_EXPERT = re.compile(r"\.mlp\.experts\.\d+\.")


def local_arch(arch, s: RankShard):
    """The ArchConfig a rank's modules are built from: its heads, widths and vocabulary chunk."""
    moe = arch.moe
    if moe is not None:
        moe = replace(moe, intermediate_size=_n(s.expert_inter) or moe.intermediate_size,
                      shared_intermediate_size=_n(s.shared_inter))
    return replace(arch, num_heads=s.num_heads, num_kv_heads=s.num_kv_heads,
                   intermediate_size=_n(s.inter) or arch.intermediate_size, vocab_size=s.vocab_chunk, moe=moe)


def check_groups(shards: list[RankShard], head_dim: int, group: int) -> None:
    """Quantized formats group the input columns of o and down: each rank's slice must start on a group
    boundary, so a rank quantizes whole groups of the unsplit layout."""
    for s in shards:
        for what, start in (("o_proj", s.heads[0] * head_dim), ("down_proj", s.inter[0]),
                            ("expert down_proj", s.expert_inter[0]), ("shared expert down_proj", s.shared_inter[0])):
            if start % group:
                raise InvalidRequestError(
                    f"tensor-parallel rank {s.rank}'s {what} columns start at {start}, inside a quantization group "
                    f"of {group}; use a smaller --quant-group-size or another tensor_parallel_size",
                    "tensor_parallel_size")


def _n(r: tuple[int, int]) -> int:
    return r[1] - r[0]


class Slicer:
    """slice(target parameter, fused shard index, tensor) -> this rank's part of it."""

    def __init__(self, s: RankShard, head_dim: int):
        self.s, self.d = s, head_dim

    def _width(self, target: str) -> tuple[int, int]:
        if _EXPERT.search(target):
            return self.s.expert_inter
        if ".shared_expert." in target:
            return self.s.shared_inter
        return self.s.inter

    def __call__(self, target: str, shard: int | None, tensor):
        if not isinstance(tensor, (torch.Tensor, GGUFBlocks)):  # an MXFP4 checkpoint's blocks
            raise ModelLoadError(f"{target}: {type(tensor).__name__} cannot be split across tensor-parallel ranks "
                                 "yet; use tensor_parallel_size 1 (or expert parallelism)")
        if target in _VOCAB:
            a, b = self.s.vocab
            return _pad_rows(_rows(tensor, a, b), self.s.vocab_chunk)
        owner, _, param = target.rpartition(".")
        if param == "sinks":  # one per query head (GPT-OSS): the rank's heads
            return _rows(tensor, *self.s.heads)
        kind = owner.rpartition(".")[2]
        if kind not in _COLUMN and kind not in _ROW:
            return tensor  # norms, routers, gates: replicated
        if param not in ("weight", "bias"):
            raise ModelLoadError(f"{target}: this checkpoint's layout ({param}) cannot be split across "
                                 "tensor-parallel ranks yet; dequantize it or use tensor_parallel_size 1")
        if kind == "qkv_proj":
            a, b = self.s.heads if shard == 0 else self.s.kv_heads
            return _rows(tensor, a * self.d, b * self.d)
        if kind == "gate_up_proj":
            return _rows(tensor, *self._width(target))
        if param == "bias":  # row-parallel: summed over ranks, so added on one
            return tensor if self.s.rank == 0 else torch.zeros_like(tensor)
        a, b = (self.s.heads[0] * self.d, self.s.heads[1] * self.d) if kind == "o_proj" else self._width(target)
        return _columns(tensor, a, b, target)


def _rows(t, a: int, b: int):
    if isinstance(t, GGUFBlocks):
        return GGUFBlocks(t.qtype, (b - a, t.shape[1]), t.raw[a:b].contiguous(), t.name)
    return t.narrow(0, a, b - a).contiguous()


def _pad_rows(t, n: int):
    have = t.shape[0]
    if have == n:
        return t
    if isinstance(t, GGUFBlocks):  # all-zero blocks decode to zeros (their scales are zero)
        raw = torch.cat([t.raw, t.raw.new_zeros(n - have, t.raw.shape[1])])
        return GGUFBlocks(t.qtype, (n, t.shape[1]), raw, t.name)
    return torch.cat([t, t.new_zeros(n - have, *t.shape[1:])])


def _columns(t, a: int, b: int, target: str):
    if not isinstance(t, GGUFBlocks):
        return t.narrow(1, a, b - a).contiguous()
    from gguf import GGML_QUANT_SIZES
    block, size = GGML_QUANT_SIZES[t.qtype]
    if a % block or b % block:
        raise ModelLoadError(f"{target}: a tensor-parallel shard's columns [{a}, {b}) do not fall on the "
                             f"{block}-column blocks of its GGUF type; use --quantization none or another size")
    return GGUFBlocks(t.qtype, (t.shape[0], b - a), t.raw[:, a // block * size:b // block * size].contiguous(),
                      t.name)
