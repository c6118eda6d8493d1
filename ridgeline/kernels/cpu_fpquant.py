"""Floating-point quantized matmul y = x @ W^T on AVX-512 CPUs: fp8 and MXFP8 weights converted to fp32
in registers, x fp32 (kernels/gemm_fp8.c); MXFP4 and NVFP4 weights through a 16-entry table into int8
lanes against x quantized to int8 per row and block inside the call (kernels/gemm_fp4.c).

Packed once, at load time, in the 48-column groups of the other quantized kernels (cpu_quant.py);
`code` is the format in the C descriptors (kernels/formats.py), so the decoder stack calls the
same kernel on the same data as the module path.
"""
from __future__ import annotations

import struct

import torch

from ridgeline.kernels import cpu
from ridgeline.kernels.cpu_quant import NC, PackedQuant, _groups
from ridgeline.kernels.formats import code_of
from ridgeline.formats.fpq import BlockTensor, Fp8Tensor

FP8_MODES = {"e4m3": 0, "e5m2": 1, "mx": 2}  # gemm_fp8.c's modes: the fp8 rows' parameter (kernels/formats.py)
FP4_HEADER = 64  # bytes before the block scales: fp32 c (kernels/gemm_fp4.c)


def _pad_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    out = torch.zeros(rows, *t.shape[1:], dtype=t.dtype)
    out[:t.shape[0]] = t
    return out


def _block_scales(scale: torch.Tensor, N: int) -> torch.Tensor:
    """[N, K/B] uint8 -> [groups][K/B][NC] uint8 (zero past N)"""
    G = _groups(N)
    return _pad_rows(scale, G * NC).view(G, NC, -1).permute(0, 2, 1).contiguous().view(-1)


class PackedFp8(PackedQuant):
    """fp8 per channel (E4M3, E5M2) or MXFP8: data [groups][K][NC] bytes; scale per channel
    [groups * NC] fp32 (E4M3's times 256: the kernel reads E4M3 as fp16, 2^-8 of its value) or MXFP8's
    E8M0 bytes [groups][K/32][NC]."""

    def __init__(self, t: Fp8Tensor | BlockTensor):
        lib = cpu.lib()
        self.N, self.K = t.q.shape
        G = _groups(self.N)
        self.data = torch.empty(G * self.K * NC, dtype=torch.int8)
        lib.ridgeline_pack_i8(t.q.contiguous().view(torch.int8).data_ptr(), self.data.data_ptr(), self.N, self.K)
        if isinstance(t, BlockTensor):
            self.mode = FP8_MODES["mx"]
            self.scale = _block_scales(t.scale, self.N)
        else:
            e4m3 = t.element == "e4m3"
            self.mode = FP8_MODES[t.element]
            self.scale = _pad_rows(t.scale.float() * (256.0 if e4m3 else 1.0), G * NC)
        self.code = code_of("fp8", self.mode)

    def _gemm(self, x, y, M, threads) -> int:
        return cpu.lib().ridgeline_gemm_fp8(self.data.data_ptr(), self.scale.data_ptr(), x.data_ptr(), y.data_ptr(),
                                            M, self.N, self.K, self.mode, threads)


class PackedFp4(PackedQuant):
    """MXFP4 / NVFP4: E2M1 codes in the int4 nibble layout, data [groups][K/8][NC] uint32; scale 64 bytes
    of header (fp32 c) then the block scale bytes [groups][K/B][NC]."""

    def __init__(self, t: BlockTensor):
        lib = cpu.lib()
        self.N, self.K = t.q.shape
        self.block = t.block
        self.code = code_of("fp4", t.block)
        self.data = torch.empty(_groups(self.N) * (self.K // 8) * NC, dtype=torch.int32)
        held = t.q.contiguous()  # alive while the packer reads it
        if lib.ridgeline_pack_i4(held.data_ptr(), self.data.data_ptr(), self.N, self.K):
            raise ValueError(f"fp4 packing needs K a multiple of 8, got {self.K}")
        c = 0.5 if t.kind == "mxfp4" else 128.0 * t.tensor_scale  # the kernel's u = 2v + 12 and E4M3-as-fp16
        header = torch.zeros(FP4_HEADER, dtype=torch.uint8)
        header[:4] = torch.tensor(list(struct.pack("<f", c)), dtype=torch.uint8)
        self.scale = torch.cat([header, _block_scales(t.scale, self.N)])

    def _gemm(self, x, y, M, threads) -> int:
        return cpu.lib().ridgeline_gemm_fp4(self.data.data_ptr(), self.scale.data_ptr(), x.data_ptr(), y.data_ptr(),
                                            M, self.N, self.K, self.block, threads)
