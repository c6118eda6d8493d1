"""Quantized weights on CUDA: one Triton kernel that decodes each weight tile in registers and
multiplies it on tensor cores, so a quantized layer reads its packed bytes instead of a dequantized
copy (the torch fallback writes and reads a full-precision weight every call).

y [M, N] = x [M, K] @ W^T,  W[n, k] = decode(code[n, k]) * scale[n, k // group] (+ min[n, k // group])

Element codes (`elem`): int8 (two's complement), uint4 minus an offset (8 for the symmetric grid, 0
with a minimum), fp8 E4M3 / E5M2 and fp4 E2M1, decoded exactly from their bits. 4-bit codes are
packed two per byte, the even k in the low nibble. A program reads a [BLOCK_N, BLOCK_K] weight tile
as stored (k contiguous) and its scales once per group. Scales stay in the format's own dtype (fp16
for int4 and int8-g32, fp32 per channel); the MX/NV block scales become their fp32 values once at
packing, exactly as `BlockTensor.block_scales` computes them.

The tile shape and the split of K depend on N and K only, never on M, so a row's result does not
depend on how many rows share the call (the CPU kernels' invariant, which speculative verification
relies on). Split-K partial sums go to a buffer summed in a fixed order (no atomics): run to run
the same bits. fp32 inputs multiply in fp32 (IEEE, not TF32); bf16 / fp16 inputs on tensor cores
with the decoded weight rounded to the input's dtype. Without triton (or off CUDA) `available()` is
False and the formats keep their dequantize-per-call torch path. Tests run the kernel on the CPU
under TRITON_INTERPRET=1.

Measured on an H100 (scripts/cuda_kernels_check.py, docs/performance.md): within 4e-7 of
dequantize-then-matmul for all nine formats; at 1-16 rows 3-6x faster than dequantizing per call
at 7-8B-model shapes, but 0.3-0.6x of bf16 cuBLAS (100-500 GB/s of weights read), and no faster
than dequantizing at 256 rows (BLOCK_M stays 16 for the invariant above).
"""
from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass

import torch

from ridgeline.formats import fpq, rtn
from ridgeline.utils.device import nvidia_sm80

HAS_TRITON = importlib.util.find_spec("triton") is not None  # optional: CUDA builds of torch bring it

INT8, UINT4, FP8_E4M3, FP8_E5M2, FP4_E2M1 = range(5)
BLOCK_M, BLOCK_N, BLOCK_K = 16, 64, 128
TARGET_PROGRAMS = 256  # enough programs to fill a large GPU at batch 1 (an H100 has 132 SMs)


def interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def available(w: torch.Tensor) -> bool:
    """Whether this weight's device runs the Triton kernel (an NVIDIA GPU of compute capability 8.0 or
    newer, or the CPU under the interpreter)."""
    if not HAS_TRITON:
        return False
    return nvidia_sm80(w.device) or (interpreted() and w.device.type == "cpu")


def unavailable_reason(device: torch.device) -> str | None:
    """Why quantized weights on this (non-CPU) device dequantize per call instead, or None."""
    if not HAS_TRITON:
        return "no triton installed"
    if not nvidia_sm80(device):
        return "the Triton kernel is built for NVIDIA GPUs of compute capability 8.0 or newer"
    return None


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def split_k(N: int, K: int) -> int:
    """How many K ranges each output tile is summed over: from N and K only (never M)."""
    tiles = _cdiv(N, BLOCK_N)
    most = max(1, K // (2 * BLOCK_K))  # each range keeps at least two K tiles
    return max(1, min(most, TARGET_PROGRAMS // tiles))


@dataclass
class TritonWeight:
    """A quantized [N, K] weight as the Triton kernel reads it."""
    code: torch.Tensor  # [N, K] uint8, or [N, K / 2] uint8 for 4-bit codes
    scale: torch.Tensor  # [N, K / group] float
    min: torch.Tensor | None  # [N, K / group] float (int4 with a minimum), else None
    elem: int
    offset: int  # subtracted from uint4 codes
    group: int
    N: int
    K: int

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.code, self.scale, self.min) if t is not None)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [M, K] (bf16, fp16 or fp32; already rounded as the format's activations are) -> [M, N] fp32."""
        M, K = x.shape
        if K != self.K:
            raise ValueError(f"quantized matmul: input has {K} columns, the weight {self.K}")
        if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
            x = x.float()
        x = x.contiguous()
        # one scale per row (group = K): any power of two >= K indexes it as scale group 0
        group = self.group if self.group < self.K else 1 << max(self.K, BLOCK_K - 1).bit_length()
        splits = split_k(self.N, self.K)
        k_tiles = _cdiv(_cdiv(K, splits), BLOCK_K)
        splits = _cdiv(_cdiv(K, BLOCK_K), k_tiles)
        y = torch.empty((splits, M, self.N), dtype=torch.float32, device=x.device)
        grid = (_cdiv(M, BLOCK_M), _cdiv(self.N, BLOCK_N), splits)
        from ridgeline.kernels.triton_quant_kernels import qmm_kernel
        qmm_kernel[grid](x, self.code, self.scale, self.scale if self.min is None else self.min, y,
                         M, self.N, K, x.stride(0), self.code.stride(0), self.scale.stride(0),
                         ELEM=self.elem, OFFSET=self.offset, PACKED4=self.elem in (UINT4, FP4_E2M1),
                         HAS_MIN=self.min is not None, IEEE=x.dtype == torch.float32 or interpreted(),
                         GROUP=group, K_TILES=k_tiles, BM=BLOCK_M, BN=BLOCK_N, BK=BLOCK_K,
                         num_stages=1 if interpreted() else 4)
        return y[0] if splits == 1 else y.sum(0)


def _nibbles(q: torch.Tensor) -> torch.Tensor:
    """[N, K] codes in [0, 15] -> [N, K / 2] uint8, the even k in the low nibble."""
    q = q.to(torch.uint8)
    return (q[:, 0::2] | (q[:, 1::2] << 4)).contiguous()


def pack(t) -> TritonWeight:
    """Any of the quantized tensors (formats/rtn.py, formats/fpq.py) as the kernel reads it."""
    if isinstance(t, rtn.Int8Tensor):
        N, K = t.q.shape
        return TritonWeight(t.q.view(torch.uint8).contiguous(), t.scale.float().view(N, 1).contiguous(), None,
                            INT8, 0, K, N, K)
    if isinstance(t, rtn.Int8GroupTensor):
        N, K = t.q.shape
        return TritonWeight(t.q.view(torch.uint8).contiguous(), t.scale.contiguous(), None, INT8, 0, t.group, N, K)
    if isinstance(t, rtn.Int4Tensor):
        N, K = t.q.shape
        return TritonWeight(_nibbles(t.q), t.scale.contiguous(), None if t.min is None else t.min.contiguous(),
                            UINT4, 8 if t.min is None else 0, t.group, N, K)
    if isinstance(t, fpq.Fp8Tensor):
        N, K = t.q.shape
        elem = FP8_E4M3 if t.element == "e4m3" else FP8_E5M2
        return TritonWeight(t.q.view(torch.uint8).contiguous(), t.scale.float().view(N, 1).contiguous(), None,
                            elem, 0, K, N, K)
    if isinstance(t, fpq.BlockTensor):
        N, K = t.q.shape
        scale = t.block_scales().contiguous()
        if t.kind == "mxfp8":
            return TritonWeight(t.q.view(torch.uint8).contiguous(), scale, None, FP8_E4M3, 0, t.block, N, K)
        return TritonWeight(_nibbles(t.q), scale, None, FP4_E2M1, 0, t.block, N, K)
    raise TypeError(f"no Triton packing for {type(t).__name__}")
