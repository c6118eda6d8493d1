"""Stacked expert tensors (GPT-OSS's checkpoints) as each expert's own projections, so they take the
path separately stored experts take (quantization per expert, expert placement, tensor-parallel slicing).

A layer stores, for its E experts (transformers' GptOssExperts layout, x @ W):
    mlp.experts.gate_up_proj        [E, hidden, 2 I]  columns interleaved: 2j is gate j, 2j + 1 is up j
    mlp.experts.gate_up_proj_bias   [E, 2 I]          interleaved the same way
    mlp.experts.down_proj           [E, I, hidden]
    mlp.experts.down_proj_bias      [E, hidden]
and each becomes experts.{e}.{gate,up,down}_proj.{weight,bias} in the [out, in] layout of a Linear.
An MXFP4 checkpoint's weights (weights/mxfp4_checkpoint.py MxBlocks) are stored [E, out, in] already, gate
and up interleaved row by row; their blocks are cut, never decoded.
"""
from __future__ import annotations

from collections.abc import Iterable

import torch

from ridgeline.errors import ModelLoadError
from ridgeline.weights.mxfp4_checkpoint import MxBlocks

STACKED = ("gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias")


def split_stacked_experts(stream: Iterable, num_experts: int) -> Iterable:
    for name, tensor in stream:
        head, _, last = name.rpartition(".")
        if not head.endswith(".experts") or last not in STACKED:
            yield name, tensor
            continue
        blocks = isinstance(tensor, MxBlocks)
        if not (blocks or isinstance(tensor, torch.Tensor)) or tensor.dim() != (2 if last.endswith("_bias") else 3) \
                or tensor.shape[0] != num_experts or (blocks and last.endswith("_bias")):
            shape = tuple(tensor.shape) if hasattr(tensor, "shape") else type(tensor).__name__
            raise ModelLoadError(f"weight {name}: shape {shape}, expected {num_experts} stacked experts "
                                 f"({'[E, width]' if last.endswith('_bias') else '[E, in, out]'})")
        width = tensor.shape[1] if blocks else tensor.shape[-1]
        if last.startswith("gate_up") and width % 2:
            raise ModelLoadError(f"weight {name}: {width} gate/up columns is not an even number")
        for e in range(num_experts):
            t = tensor[e]
            if blocks:  # [out, in] blocks: gate_up's rows interleaved
                if last == "gate_up_proj":
                    yield f"{head}.{e}.gate_proj.weight", t[0::2].contiguous()
                    yield f"{head}.{e}.up_proj.weight", t[1::2].contiguous()
                else:
                    yield f"{head}.{e}.down_proj.weight", t.contiguous()
            elif last == "gate_up_proj":  # [hidden, 2I] -> gate [I, hidden], up [I, hidden]
                yield f"{head}.{e}.gate_proj.weight", t[:, 0::2].t().contiguous()
                yield f"{head}.{e}.up_proj.weight", t[:, 1::2].t().contiguous()
            elif last == "gate_up_proj_bias":
                yield f"{head}.{e}.gate_proj.bias", t[0::2].contiguous()
                yield f"{head}.{e}.up_proj.bias", t[1::2].contiguous()
            elif last == "down_proj":  # [I, hidden] -> [hidden, I]
                yield f"{head}.{e}.down_proj.weight", t.t().contiguous()
            else:
                yield f"{head}.{e}.down_proj.bias", t.contiguous()
