"""MXFP4 checkpoints (`quantization_config.quant_method: "mxfp4"`, GPT-OSS's released weights): the experts
are stored as OCP MXFP4 blocks and load as stored into the `mxfp4` weight format (kernels/gemm_fp4.c),
never through floats; every other tensor is an ordinary float one.

A quantized tensor X is two checkpoint tensors:
    X_blocks  uint8 [..., N, K / 32, 16]  two E2M1 codes a byte, element 2j in the low nibble, 2j + 1 high
    X_scales  uint8 [..., N, K / 32]      one E8M0 exponent e a block: the block's values are 2^(e - 127) * code
(E2M1 codes are formats/fpq.py's: sign << 3 | index into 0, 0.5, 1, 1.5, 2, 3, 4, 6.) They become one
`MxBlocks` under the name X, which models/expert_split.py cuts into each expert's projections. An
exponent of 255 (E8M0's NaN) is refused; 0 (2^-127) reads as zero in the kernel, as every E8M0 there does.
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from ridgeline.errors import ModelLoadError
from ridgeline.formats import fpq

SUFFIXES = ("_blocks", "_scales")
FORMAT = "mxfp4-kept"  # the weight format the blocks load into (layers/fp_formats.py)


@dataclass(frozen=True)
class MxBlocks:
    """MXFP4 blocks as a checkpoint stores them: blocks [..., N, K / 32, 16], scales [..., N, K / 32] uint8."""
    blocks: torch.Tensor
    scales: torch.Tensor
    name: str = ""

    @property
    def shape(self) -> tuple[int, ...]:
        return (*self.scales.shape[:-1], self.scales.shape[-1] * fpq.MX_BLOCK)

    def dim(self) -> int:
        return len(self.shape)

    def __getitem__(self, i) -> MxBlocks:
        """One leading index (an expert) or a slice of rows of a 2-D tensor (rows 0::2: the gate rows)."""
        return MxBlocks(self.blocks[i], self.scales[i], self.name)

    def rows(self, start: int, n: int) -> MxBlocks:
        return MxBlocks(self.blocks[start:start + n], self.scales[start:start + n], self.name)

    def contiguous(self) -> MxBlocks:
        return MxBlocks(self.blocks.contiguous(), self.scales.contiguous(), self.name)

    def block_tensor(self) -> fpq.BlockTensor:
        """[N, K] as the mxfp4 format's BlockTensor: one code a byte."""
        N, K = self.shape
        b = self.blocks.reshape(N, K // 2)
        codes = torch.stack([b & 0x0F, b >> 4], dim=-1).reshape(N, K)
        return fpq.BlockTensor("mxfp4", codes.contiguous(), self.scales.reshape(N, K // fpq.MX_BLOCK).contiguous())

    def dequantize(self) -> torch.Tensor:
        return self.block_tensor().dequantize()


def _quant_config(folder: Path) -> dict | None:
    try:
        cfg = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    q = cfg.get("quantization_config") if isinstance(cfg, dict) else None
    return q if isinstance(q, dict) else None


def is_mxfp4_checkpoint(folder: Path | None) -> bool:
    q = _quant_config(folder) if folder is not None else None
    return q is not None and str(q.get("quant_method", "")).lower() == "mxfp4"


def checkpoint_rules(folder: Path | None) -> tuple[tuple[str, str], ...]:
    """The layer_formats rules that keep an MXFP4 checkpoint's blocks: its experts (GPT-OSS quantizes only
    those); () for any other folder."""
    return (("*.mlp.experts.*", FORMAT),) if is_mxfp4_checkpoint(folder) else ()


def tensors(stream: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, object]]:
    """The checkpoint's tensors with each X_blocks / X_scales pair as one MxBlocks named X (in whichever
    order the files hold them); ModelLoadError for a half pair or pairs whose shapes disagree."""
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for name, t in stream:
        suffix = next((s for s in SUFFIXES if name.endswith(s)), None)
        if suffix is None:
            yield name, t
            continue
        base = name[:-len(suffix)]
        got = pending.setdefault(base, {})
        got[suffix] = t
        if len(got) < 2:
            continue
        pair = pending.pop(base)
        yield base, _pair(base, pair["_blocks"], pair["_scales"])
    if pending:
        base, got = next(iter(pending.items()))
        missing = next(s for s in SUFFIXES if s not in got)
        raise ModelLoadError(f"MXFP4 checkpoint: {base}{missing} is missing beside {base}{next(iter(got))}")


def _pair(base: str, blocks: torch.Tensor, scales: torch.Tensor) -> MxBlocks:
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8 or blocks.dim() < 3 \
            or blocks.shape[-1] != fpq.MX_BLOCK // 2 or tuple(blocks.shape[:-1]) != tuple(scales.shape):
        raise ModelLoadError(f"MXFP4 checkpoint: {base}_blocks {tuple(blocks.shape)} {blocks.dtype} and {base}_scales "
                             f"{tuple(scales.shape)} {scales.dtype} are not [..., N, K/32, 16] and [..., N, K/32] uint8")
    if bool((scales == 255).any()):
        raise ModelLoadError(f"MXFP4 checkpoint: {base}_scales holds 255, E8M0's NaN")
    return MxBlocks(blocks, scales, base)
