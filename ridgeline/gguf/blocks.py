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


def iter_gguf_tensors(g, cfg) -> Iterator[tuple[str, GGUFBlocks | torch.Tensor]]:
    """(HF name, tensor) for every tensor of the file, q/k rows in HF order as the converted folder has
    them (cfg: the model's ArchConfig, for the head counts)."""
    from ridgeline.gguf.convert import _LAYER_RE, ARCHITECTURES, hf_name, unpermute_rope
    from ridgeline.gguf.families import hf_value
    arch = g.metadata["general.architecture"]
    permuted = ARCHITECTURES[arch][2]
    heads = {"attn_q": cfg.num_heads, "attn_k": cfg.num_kv_heads}
    for name in g.tensors:
        target = hf_name(name, arch=arch)
        if target is None:
            continue  # the converted folder's config already refused files with tensors it cannot place
        t = matrix(g, name)
        if not isinstance(t, GGUFBlocks):
            t = hf_value(arch, name, t)
        m = _LAYER_RE.fullmatch(name)
        if permuted and m and m.group(2) in heads:
            n = heads[m.group(2)]
            t = t.permute_rows(lambda w: unpermute_rope(w, n)) if isinstance(t, GGUFBlocks) else unpermute_rope(t, n)
        yield target, t


def tensor_types(g) -> dict:
    """HF name -> GGML type of every weight matrix in the file."""
    from ridgeline.gguf.convert import hf_name
    arch = g.metadata.get("general.architecture")
    return {hf_name(n, arch=arch): i.qtype for n, i in g.tensors.items() if hf_name(n, arch=arch) and len(i.shape) == 2}
