"""Quantized matmul y = x @ W^T on AVX-512 CPUs: weight-only (kernels/gemm_int8.c, kernels/gemm_int4.c)
and with x quantized to int8 inside the call (kernels/gemm_a8.c: W8A8, W4A8).

The quantized weight is packed once, at load time, into the 48-column groups of the packed kernels
(k-major, one contiguous stream per group) with its scales beside it; x stays fp32 at the interface.
`code` is the weight's format in the C descriptors (kernels/formats.py), so the C decoder stack
calls the same kernel on the same data: the two paths agree bit for bit.
"""
from __future__ import annotations

import torch

from ridgeline.kernels import cpu
from ridgeline.kernels.cpu_gemm import call_matmul
from ridgeline.kernels.formats import code_of
from ridgeline.formats.rtn import IQ4Tensor, KGridTensor, KQTensor, Int4Tensor, Int5Tensor, Int6Tensor, Int8GroupTensor, Int8Tensor

NC = 48  # output columns per packed group (QT_NC in kernels/quant_tile.h)
KINDS = ("int8", "int4", "int5", "int6", "iq4", "kq", "w8a8", "w4a8", "fp8", "fp4")  # fp8, fp4: kernels/cpu_fpquant.py
NEEDS = {"int8": "AVX-512", "int4": "AVX-512 with AVX512-BF16", "int5": "AVX-512 with AVX512-BF16",
         "int6": "AVX-512 with AVX512-BF16", "iq4": "AVX-512 with AVX512-BF16",
         "kq": "AVX-512 with AVX512-BF16",
         "w8a8": "AVX-512 with AVX512-VNNI",
         "w4a8": "AVX-512 with AVX512-VNNI", "fp8": "AVX-512 with AVX512BW", "fp4": "AVX-512 with AVX512-VNNI"}


def available(kind: str) -> bool:
    """The library built and this CPU runs the kernel of this kind (one of KINDS)."""
    lib = cpu.lib()
    if lib is None:
        return False
    fn = {"int8": lib.ridgeline_int8_available, "int4": lib.ridgeline_int4_available,
          "int5": lib.ridgeline_int4_available, "int6": lib.ridgeline_int4_available,
          "iq4": lib.ridgeline_iq4_available, "kq": lib.ridgeline_int4_available,
          "fp8": lib.ridgeline_fp8_available, "fp4": lib.ridgeline_fp4_available}.get(
        kind, lib.ridgeline_a8_available)
    return bool(fn())


def int8_rounds_activations() -> bool:
    """The int8 and int8-g32 kernels round x to bf16 for bf16 dot products (AVX512-BF16), as int4's and
    the bf16 kernels do; without AVX512-BF16 they multiply fp32 x."""
    lib = cpu.lib()
    return bool(lib is not None and lib.ridgeline_int8_bf16())


def int8_g32_activations() -> str:
    """How the int8-g32 kernel reads x: "int16" (per block of 32 k with an fp32 scale, AVX512-BF16 and VNNI:
    kernels/gemm_int8_g32.c), "bf16" or "fp32"."""
    lib = cpu.lib()
    return ("fp32", "bf16", "int16")[lib.ridgeline_i8g32_activations()] if lib is not None else "fp32"


def int16_blocks(x: torch.Tensor) -> torch.Tensor:
    """x [M, K] fp32 as the int16 int8-g32 kernel holds it, dequantized: per block of 32 k,
    round(x * 32767 / max|x|) * (max|x| / 32767) (a block of zeros stays zero)."""
    M, K = x.shape
    b = x.float().reshape(M, K // 32, 32)
    mx = b.abs().amax(-1, keepdim=True)
    inv = torch.where(mx > 0, torch.tensor(32767.0) / mx, torch.zeros_like(mx))
    return (torch.round(b * inv).clamp(-32768, 32767) * (mx / 32767.0)).reshape(M, K)


def activations_as_read(kind: str, x: torch.Tensor) -> torch.Tensor:
    """x [M, K] as the kind's kernel multiplies it (fp32): int8-g32's int16 blocks or bf16 rounding (above), the
    int8 kernel's bf16 rounding where int8_rounds_activations, the bf16 rounding of every other weight-only kind."""
    mode = int8_g32_activations() if kind == "int8-g32" else \
        ("bf16" if int8_rounds_activations() else "fp32") if kind == "int8" else "bf16"
    return int16_blocks(x) if mode == "int16" else x.bfloat16().float() if mode == "bf16" else x.float()


def _groups(n: int) -> int:
    return -(-n // NC)


def _grouped(src: torch.Tensor, G: int) -> torch.Tensor:
    """Per-column scales [N, C] (or [N, C, 2]) as the kernels read them, as bytes: [G][C](...)[NC], zero past N."""
    out = torch.zeros((G * NC,) + tuple(src.shape[1:]), dtype=src.dtype)
    out[:src.shape[0]] = src
    out = out.view(G, NC, *src.shape[1:])
    return out.permute(0, *range(2, out.dim()), 1).contiguous().view(-1).view(torch.uint8)


def _group_scales(t: Int8GroupTensor, G: int) -> torch.Tensor:
    """An int8-g32 tensor's fp16 scales as its kernels read them: [G][K/32][NC], zero past N."""
    N, K = t.q.shape
    sc = torch.zeros(G * NC, K // t.group, dtype=torch.float16)
    sc[:N] = t.scale
    return sc.view(G, NC, -1).permute(0, 2, 1).contiguous().view(-1)


class PackedQuant:
    """A quantized [N, K] weight packed for its kernel: data and scale are what the decoder stack's
    descriptor points at, code its format there."""

    data: torch.Tensor
    scale: torch.Tensor
    code: int
    N: int
    K: int

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.data, self.scale))

    def __call__(self, x: torch.Tensor, threads: int | None = None) -> torch.Tensor:
        """x [M, K] (any float dtype) -> [M, N] fp32."""
        return call_matmul(x, self.N, self.K, "quantized matmul", threads, self._gemm)


class PackedInt8(PackedQuant):
    """Per-channel int8: data int8 in kernels/gemm_int8.c's layout (with AVX512-BF16 [groups][K2/2][NC][2],
    K2 = K rounded up to even, for bf16 dot products; else [groups][K][NC]); scale [groups * NC] fp32
    (zero past N)."""

    code = code_of("i8")

    def __init__(self, t: Int8Tensor):
        lib = cpu.lib()
        self.N, self.K = t.q.shape
        self.data = torch.zeros(_groups(self.N) * (self.K + self.K % 2) * NC, dtype=torch.int8)
        held = t.q.contiguous()  # alive while the packer reads it
        lib.ridgeline_pack_i8_gemm(held.data_ptr(), self.data.data_ptr(), self.N, self.K)
        self.scale = torch.zeros(_groups(self.N) * NC)
        self.scale[:self.N] = t.scale

    def _gemm(self, x, y, M, threads) -> int:
        return cpu.lib().ridgeline_gemm_i8p(self.data.data_ptr(), self.scale.data_ptr(), x.data_ptr(), y.data_ptr(),
                                            M, self.N, self.K, threads)


class PackedInt8G32(PackedQuant):
    """int8 with an fp16 scale per 32 k: data as PackedInt8's, scale [groups][K/32][NC] fp16 (kernels/gemm_int8_g32.c)."""

    code = code_of("i8g32")

    def __init__(self, t: Int8GroupTensor):
        lib = cpu.lib()
        self.N, self.K = t.q.shape
        G = _groups(self.N)
        self.data = torch.empty(G * self.K * NC, dtype=torch.int8)
        held = t.q.contiguous()  # alive while the packer reads it
        lib.ridgeline_pack_i8_gemm(held.data_ptr(), self.data.data_ptr(), self.N, self.K)
        self.scale = _group_scales(t, G)

    def _gemm(self, x, y, M, threads) -> int:
        return cpu.lib().ridgeline_gemm_i8g32(self.data.data_ptr(), self.scale.data_ptr(), x.data_ptr(),
                                              y.data_ptr(), M, self.N, self.K, threads)


class PackedInt4(PackedQuant):
    """Group-wise int4: data [groups][K/8][NC] uint32 (8 nibbles each), scale [groups][K/G][2 or 1][NC] fp16."""

    def __init__(self, t: Int4Tensor):
        lib = cpu.lib()
        self.N, self.K = t.q.shape
        self.group, self.symmetric = t.group, t.symmetric
        self.code = code_of("i4", t.group, t.symmetric)
        G = _groups(self.N)
        self.data = torch.empty(G * (self.K // 8) * NC, dtype=torch.int32)
        held = t.q.contiguous()  # alive while the packer reads it
        if lib.ridgeline_pack_i4(held.data_ptr(), self.data.data_ptr(), self.N, self.K):
            raise ValueError(f"int4 packing needs K a multiple of 8, got {self.K}")
        parts = [t.scale] if t.symmetric else [t.scale, t.min]
        sc = torch.zeros(G * NC, self.K // t.group, len(parts), dtype=torch.float16)
        sc[:self.N] = torch.stack(parts, dim=-1)
        self.scale = sc.view(G, NC, -1, len(parts)).permute(0, 2, 3, 1).contiguous().view(-1)  # [G][K/G][parts][NC]

    def _gemm(self, x, y, M, threads) -> int:
        return cpu.lib().ridgeline_gemm_i4p(self.data.data_ptr(), self.scale.data_ptr(), x.data_ptr(), y.data_ptr(),
                                            M, self.N, self.K, self.group, int(self.symmetric), threads)


class PackedInt5(PackedQuant):
    """5-bit weights in groups of 32 (kernels/gemm_int5.c): data [groups][ceil(K/6)][NC] uint32 (three k pairs a
    word); scale [groups][K/32][2 or 1][NC] fp16."""

    def __init__(self, t: Int5Tensor):
        self.N, self.K = t.q.shape
        if self.K % 32:
            raise ValueError(f"5-bit packing needs K a multiple of 32, got {self.K}")
        self.symmetric = t.symmetric
        self.code = code_of("i5", 32, t.symmetric)
        G = _groups(self.N)
        self.data = _pack_i5(t.q, G)
        parts = [t.scale] if t.symmetric else [t.scale, t.min]
        sc = torch.zeros(G * NC, self.K // 32, len(parts), dtype=torch.float16)
        sc[:self.N] = torch.stack(parts, dim=-1)
        self.scale = sc.view(G, NC, -1, len(parts)).permute(0, 2, 3, 1).contiguous().view(-1)  # [G][K/32][parts][NC]

    def _gemm(self, x, y, M, threads) -> int:
        return cpu.lib().ridgeline_gemm_i5p(self.data.data_ptr(), self.scale.data_ptr(), x.data_ptr(), y.data_ptr(),
                                            M, self.N, self.K, int(self.symmetric), threads)


def _pack_i5(q: torch.Tensor, G: int) -> torch.Tensor:
    """q [N, K] uint8 in [0, 31] -> [G][ceil(K/6)][NC] uint32 words, three k pairs each (kernels/gemm_int5.c)."""
    N, K = q.shape
    data = torch.empty(G * ((K + 5) // 6) * NC, dtype=torch.int32)
    held = q.contiguous()  # alive while the packer reads it
    cpu.lib().ridgeline_pack_i5(held.data_ptr(), data.data_ptr(), N, K)
    return data


class PackedInt6(PackedQuant):
    """Q6_K's grid (kernels/gemm_int6.c): data [groups][K/16][3][NC] uint32 (eight k pairs in three words); scale
    [groups][K/16][NC] int8 s, then [groups][K/256][NC] fp16 d, as bytes."""

    code = code_of("i6", 16, True)

    def __init__(self, t: Int6Tensor):
        lib = cpu.lib()
        self.N, self.K = t.q.shape
        if self.K % 256:
            raise ValueError(f"6-bit packing needs K a multiple of 256, got {self.K}")
        G = _groups(self.N)
        self.data = torch.empty(G * (self.K // 16) * 3 * NC, dtype=torch.int32)
        q = t.q.contiguous()  # held while the packer reads it
        lib.ridgeline_pack_i6(q.data_ptr(), self.data.data_ptr(), self.N, self.K)
        self.scale = torch.cat([_grouped(t.sub, G), _grouped(t.scale, G)])

    def _gemm(self, x, y, M, threads) -> int:
        return cpu.lib().ridgeline_gemm_i6p(self.data.data_ptr(), self.scale.data_ptr(), x.data_ptr(), y.data_ptr(),
                                            M, self.N, self.K, threads)


class PackedIQ4(PackedQuant):
    """IQ4_NL's / IQ4_XS's grids (kernels/gemm_iq4.c): data [groups][K/8][NC] uint32 (the codes, as PackedInt4's
    nibbles); scale [groups][K/32][NC] fp16 (IQ4_NL), or [groups][K/32][NC] int8 s then [groups][K/256][NC] fp16
    (IQ4_XS), as bytes."""

    def __init__(self, t: IQ4Tensor):
        lib = cpu.lib()
        self.N, self.K = t.q.shape
        self.block = t.block
        if self.K % self.block:
            raise ValueError(f"IQ4 packing needs K a multiple of {self.block}, got {self.K}")
        self.code = code_of("iq4", self.block)
        G = _groups(self.N)
        self.data = torch.empty(G * (self.K // 8) * NC, dtype=torch.int32)
        q = t.q.contiguous()  # held while the packer reads it
        lib.ridgeline_pack_i4(q.data_ptr(), self.data.data_ptr(), self.N, self.K)
        self.scale = torch.cat([_grouped(src, G) for src in ((t.scale,) if t.sub is None else (t.sub, t.scale))])

    def _gemm(self, x, y, M, threads) -> int:
        return cpu.lib().ridgeline_gemm_iq4(self.data.data_ptr(), self.scale.data_ptr(), x.data_ptr(), y.data_ptr(),
                                            M, self.N, self.K, self.block, threads)


class PackedKGrid(PackedQuant):
    """Q4_K's grid (kernels/gemm_int4.c, ridgeline_gemm_i4k) or Q5_K's (gemm_int5.c, ridgeline_gemm_i5k): data as
    PackedInt4's nibbles (Q5_K: as PackedInt5's words); scale [groups][K/32][2][NC] bytes (scale, minimum),
    then [groups][K/256][2][NC] fp16 (D, Dmin), as bytes."""

    def __init__(self, t: KGridTensor):
        lib = cpu.lib()
        self.N, self.K = t.q.shape
        self.bits = t.bits
        if self.K % 256:
            raise ValueError(f"Q{t.bits}_K packing needs K a multiple of 256, got {self.K}")
        self.code = code_of("i4k" if t.bits == 4 else "i5k", 32)
        G = _groups(self.N)
        if t.bits == 5:
            self.data = _pack_i5(t.q, G)
        else:
            self.data = torch.empty(G * (self.K // 8) * NC, dtype=torch.int32)
            q = t.q.contiguous()  # held while the packer reads it
            lib.ridgeline_pack_i4(q.data_ptr(), self.data.data_ptr(), self.N, self.K)
        self.scale = torch.cat([_grouped(torch.stack(pair, dim=-1), G) for pair in ((t.sub, t.mins), (t.scale, t.dmin))])

    def _gemm(self, x, y, M, threads) -> int:
        p = self.data.data_ptr()
        if self.bits == 4:
            return cpu.lib().ridgeline_gemm_i4k(p, self.scale.data_ptr(), x.data_ptr(), y.data_ptr(), M, self.N, self.K,
                                                threads)
        return cpu.lib().ridgeline_gemm_i5k(p, self.scale.data_ptr(), x.data_ptr(), y.data_ptr(), M, self.N, self.K,
                                            threads)


class PackedKQ(PackedQuant):
    """Q3_K's / Q2_K's grids (kernels/gemm_kq.c): data [groups][K/16][NC] uint32 (q's low 2 bits, as
    ridgeline_pack_i6_high lays out bit pairs), then for Q3_K [groups][K/32][NC] uint32 (its third bit, as
    ridgeline_pack_i5_high lays out single bits); scale
    [groups][K/16][NC] bytes, then [groups][K/256][NC] fp16 D, then for Q2_K the same of Dmin."""

    def __init__(self, t: KQTensor):
        lib = cpu.lib()
        self.N, self.K = t.q.shape
        self.bits = t.bits
        if self.K % 256:
            raise ValueError(f"{t.bits}-bit K-quant packing needs K a multiple of 256, got {self.K}")
        self.code = code_of("kq", t.bits)
        G = _groups(self.N)
        low = G * (self.K // 16) * NC
        self.data = torch.empty(low + (G * (self.K // 32) * NC if t.bits == 3 else 0), dtype=torch.int32)
        q = t.q.contiguous()
        low_bits = ((q & 3) << 4).contiguous()  # held while the packer reads it
        lib.ridgeline_pack_i6_high(low_bits.data_ptr(), self.data.data_ptr(), self.N, self.K)
        if t.bits == 3:
            third = ((q >> 2) << 4).contiguous()
            lib.ridgeline_pack_i5_high(third.data_ptr(), self.data[low:].data_ptr(), self.N, self.K)
        self.scale = torch.cat([_grouped(src, G) for src in (t.sub, t.scale) + ((t.dmin,) if t.bits == 2 else ())])

    def _gemm(self, x, y, M, threads) -> int:
        return cpu.lib().ridgeline_gemm_kq(self.data.data_ptr(), self.scale.data_ptr(), x.data_ptr(), y.data_ptr(),
                                           M, self.N, self.K, self.bits, threads)


class PackedW8A8(PackedQuant):
    """int8 weights against int8 activations: data [groups][K/4][NC][4] uint8 (q + 128); scale
    [groups * NC] fp32 (zero past N)."""

    code = code_of("w8a8")

    def __init__(self, t: Int8Tensor):
        self.N, self.K = t.q.shape
        G = _groups(self.N)
        self.data = torch.empty(G * self.K * NC, dtype=torch.uint8)
        held = t.q.contiguous()  # alive while the packer reads it
        if cpu.lib().ridgeline_pack_w8a8(held.data_ptr(), self.data.data_ptr(), self.N, self.K):
            raise ValueError(f"w8a8 packing needs K a multiple of 4, got {self.K}")
        self.scale = torch.zeros(G * NC, dtype=torch.float32)
        self.scale[:self.N] = t.scale.float()

    def _gemm(self, x, y, M, threads) -> int:
        return cpu.lib().ridgeline_gemm_w8a8(self.data.data_ptr(), self.scale.data_ptr(), x.data_ptr(),
                                             y.data_ptr(), M, self.N, self.K, threads)


class PackedW8A8G32(PackedQuant):
    """int8 with an fp16 scale per 32 k against int8 activations: data as PackedW8A8's, scale
    [groups][K/32][NC] fp16 (PackedInt8G32's)."""

    code = code_of("w8a8g32")

    def __init__(self, t: Int8GroupTensor):
        self.N, self.K = t.q.shape
        G = _groups(self.N)
        self.data = torch.empty(G * self.K * NC, dtype=torch.uint8)
        held = t.q.contiguous()  # alive while the packer reads it
        cpu.lib().ridgeline_pack_w8a8(held.data_ptr(), self.data.data_ptr(), self.N, self.K)
        self.scale = _group_scales(t, G)

    def _gemm(self, x, y, M, threads) -> int:
        return cpu.lib().ridgeline_gemm_w8a8_g32(self.data.data_ptr(), self.scale.data_ptr(), x.data_ptr(),
                                                 y.data_ptr(), M, self.N, self.K, threads)


class PackedW4A8(PackedInt4):
    """Group-wise int4 weights (PackedInt4's layout) against int8 activations quantized per group of G."""

    def __init__(self, t: Int4Tensor):
        super().__init__(t)
        self.code = code_of("w4a8", t.group, t.symmetric)

    def _gemm(self, x, y, M, threads) -> int:
        return cpu.lib().ridgeline_gemm_w4a8(self.data.data_ptr(), self.scale.data_ptr(), x.data_ptr(), y.data_ptr(),
                                             M, self.N, self.K, self.group, int(self.symmetric), threads)
