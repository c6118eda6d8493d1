"""A GGUF file's tensors as they are stored, for `--quantization gguf`: quantized matrices stay blocks.

GGML lays a [N, K] matrix out row by row, each row K / block blocks, so a row of blocks is one output
channel: permuting output channels (llama.cpp's q/k rotary permutation, our interleaved rotary order)
permutes rows of bytes, and the blocks themselves are never decoded to floats on the way in.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch

# the gguf package (and the modules that use it) is imported where a GGUF file is read, so loading a
# Hugging Face folder never pays for it


@dataclass(frozen=True)
class GGUFBlocks:
    """A quantized [N, K] matrix: raw [N, K / block * type_size] uint8, row n = output channel n."""
    qtype: object  # gguf.GGMLQuantizationType
    shape: tuple[int, int]
    raw: torch.Tensor
    name: str

    @property
    def type_size(self) -> int:
        from gguf import GGML_QUANT_SIZES
        return GGML_QUANT_SIZES[self.qtype][1]

    def blocks(self) -> torch.Tensor:
        """[N * K / block, type_size] uint8: every block, row-major."""
        return self.raw.reshape(-1, self.type_size)

    def permute_rows(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> GGUFBlocks:
        """The same matrix with its rows reordered as fn reorders the rows of a [N, ...] tensor."""
        perm = fn(torch.arange(self.shape[0]).view(-1, 1)).view(-1)
        return GGUFBlocks(self.qtype, self.shape, self.raw[perm].contiguous(), self.name)

    def rows(self, start: int, n: int) -> GGUFBlocks:
        """Output channels [start, start + n): one projection of a fused one."""
        return GGUFBlocks(self.qtype, (n, self.shape[1]), self.raw[start:start + n].contiguous(), self.name)

    def dequantize(self) -> torch.Tensor:
        from ridgeline.gguf.dequant import dequantize
        return dequantize(self.raw.numpy(), self.qtype, self.shape, self.name)


def matrix(g, name: str) -> GGUFBlocks | torch.Tensor:
    """A tensor of the file: blocks for a quantized matrix, float32 for anything dense or 1-D."""
    from gguf import GGMLQuantizationType as T
    info = g.tensors[name]
    if info.qtype in (T.F32, T.F16, T.BF16) or len(info.shape) != 2:
        from ridgeline.gguf.dequant import dequantize_tensor
        return dequantize_tensor(g, name)
    raw = torch.from_numpy(np.array(g.raw(info), copy=True)).view(info.shape[0], -1)
    return GGUFBlocks(info.qtype, info.shape, raw, name)


def experts(g, name: str) -> list[GGUFBlocks | torch.Tensor]:
    """A stacked expert tensor [E, N, K] of the file, one matrix per expert: blocks for a quantized one
    (expert e's rows of blocks, never decoded), float32 for a dense one."""
    from gguf import GGMLQuantizationType as T
    info = g.tensors[name]
    if info.qtype in (T.F32, T.F16, T.BF16):
        from ridgeline.gguf.dequant import dequantize_tensor
        return list(dequantize_tensor(g, name).unbind(0))
    E, N, K = info.shape
    raw = torch.from_numpy(np.array(g.raw(info), copy=True)).view(E, N, -1)
    return [GGUFBlocks(info.qtype, (N, K), raw[e], f"{name}[{e}]") for e in range(E)]


def iter_gguf_tensors(g, cfg) -> Iterator[tuple[str, GGUFBlocks | torch.Tensor]]:
    """(HF name, tensor) for every tensor of the file, q/k rows in HF order as the converted folder has
    them (cfg: the model's ArchConfig, for the head counts); stacked experts one tensor per expert."""
    from ridgeline.gguf.convert import _LAYER_RE, ARCHITECTURES, hf_name, is_stacked_expert, unpermute_rope
    from ridgeline.gguf.families import hf_value
    arch = g.metadata["general.architecture"]
    permuted = ARCHITECTURES[arch][2]
    heads = {"attn_q": cfg.num_heads, "attn_k": cfg.num_kv_heads}
    for name in g.tensors:
        target = hf_name(name, arch=arch)
        if target is None:
            continue  # the converted folder's config already refused files with tensors it cannot place
        if is_stacked_expert(name):
            for e, t in enumerate(experts(g, name)):
                yield target.replace(".experts.0.", f".experts.{e}."), t
            continue
        t = matrix(g, name)
        if not isinstance(t, GGUFBlocks):
            t = hf_value(arch, name, t)
        m = _LAYER_RE.fullmatch(name)
        if m and m.group(2) == "ffn_gate_inp_shexp" and not isinstance(t, GGUFBlocks):  # [hidden] -> [1, hidden]
            t = t.reshape(1, -1)
        if permuted and m and m.group(2) in heads:
            n = heads[m.group(2)]
            t = t.permute_rows(lambda w: unpermute_rope(w, n)) if isinstance(t, GGUFBlocks) else unpermute_rope(t, n)
        yield target, t


def tensor_types(g) -> dict:
    """HF name -> GGML type of every weight matrix in the file (each expert of a stacked tensor)."""
    from ridgeline.gguf.convert import hf_name, is_stacked_expert
    arch = g.metadata.get("general.architecture")
    out = {}
    for n, i in g.tensors.items():
        target = hf_name(n, arch=arch)
        if target and is_stacked_expert(n) and len(i.shape) == 3:
            out.update({target.replace(".experts.0.", f".experts.{e}."): i.qtype for e in range(i.shape[0])})
        elif target and len(i.shape) == 2:
            out[target] = i.qtype
    return out
