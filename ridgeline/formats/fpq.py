"""Round-to-nearest quantizers for the floating-point weight formats, and the exact dequantization each
defines (kernels/gemm_fp8.c and kernels/gemm_fp4.c compute with these values).

fp8, per output channel (or one scale for the tensor):  w[n, k] = s[n] * q[n, k], q an fp8 number
    (E4M3: |q| <= 448; E5M2: |q| <= 57344), s = max|w[n]| / max|q| in fp32.
mxfp8, mxfp4 (OCP microscaling): blocks of 32 consecutive k of one output channel share a power of
    two 2^(e - 127), stored as one E8M0 byte e in [1, 254]; elements E4M3 (mxfp8) or E2M1 (mxfp4).
    Per block, of the two exponents near max|w| / max element (one that clips the largest values,
    one that does not), the one with the smaller squared error.
nvfp4: blocks of 16 share an E4M3 scale d (positive), the tensor a fp32 scale t; w = t * d * q, q
    E2M1. t = max|w| / (448 * 6), d = max|block| / 6 / t rounded to E4M3.
E2M1 (fp4) has the 16 values +-{0, 0.5, 1, 1.5, 2, 3, 4, 6}: code = sign << 3 | index into that list.
Elements round to nearest (fp8 by torch's conversion, fp4 by the table), saturating at the largest value.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ridgeline.errors import InvalidRequestError

FP8_DTYPES = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
FP8_MAX = {"e4m3": 448.0, "e5m2": 57344.0}
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
E2M1_VALUES = torch.cat([E2M1, -E2M1])  # value of each 4-bit code
_E2M1_MIDPOINTS = (E2M1[1:] + E2M1[:-1]) / 2
MX_BLOCK = 32
NV_BLOCK = 16


@dataclass
class Fp8Tensor:
    q: torch.Tensor  # [N, K] float8_e4m3fn or float8_e5m2
    scale: torch.Tensor  # [N] fp32 (one value repeated for a per-tensor scale)

    @property
    def element(self) -> str:
        return "e4m3" if self.q.dtype == torch.float8_e4m3fn else "e5m2"

    @property
    def nbytes(self) -> int:
        return self.q.numel() + self.scale.numel() * 4

    def dequantize(self) -> torch.Tensor:
        return self.q.float() * self.scale[:, None]


@dataclass
class BlockTensor:
    """Block-scaled: mxfp8 (q float8_e4m3fn, scale E8M0 bytes), mxfp4 (q E2M1 codes uint8, scale E8M0),
    nvfp4 (q E2M1 codes, scale E4M3 bytes as uint8, tensor_scale fp32)."""
    kind: str  # "mxfp8", "mxfp4", "nvfp4"
    q: torch.Tensor  # [N, K]
    scale: torch.Tensor  # [N, K / block] uint8
    tensor_scale: float = 1.0

    @property
    def block(self) -> int:
        return NV_BLOCK if self.kind == "nvfp4" else MX_BLOCK

    @property
    def nbytes(self) -> int:
        elem = self.q.numel() if self.kind == "mxfp8" else self.q.numel() // 2
        return elem + self.scale.numel()

    def block_scales(self) -> torch.Tensor:
        """[N, K / block] fp32"""
        if self.kind == "nvfp4":
            return self.scale.view(torch.float8_e4m3fn).float() * self.tensor_scale
        return e8m0_value(self.scale)

    def elements(self) -> torch.Tensor:
        return self.q.float() if self.kind == "mxfp8" else E2M1_VALUES.to(self.q.device)[self.q.long()]

    def dequantize(self) -> torch.Tensor:
        N, K = self.q.shape
        e = self.elements().view(N, K // self.block, self.block)
        return (e * self.block_scales()[..., None]).view(N, K)


def e8m0_value(e: torch.Tensor) -> torch.Tensor:
    return torch.exp2(e.float() - 127)


def quantize_fp8(w: torch.Tensor, element: str = "e4m3", per_tensor: bool = False) -> Fp8Tensor:
    """w [N, K] -> fp8 with a scale per output channel (or one for the tensor); an all-zero row gets scale 0."""
    w = w.detach().float()
    amax = w.abs().amax() if per_tensor else w.abs().amax(dim=1)
    scale = (amax / FP8_MAX[element]).expand(w.shape[0]).contiguous()
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = (w / safe[:, None]).clamp_(-FP8_MAX[element], FP8_MAX[element]).to(FP8_DTYPES[element])
    return Fp8Tensor(q, scale)


def check_block(kind: str, K: int, what: str = "the weight") -> None:
    """A clear error when K is not whole blocks of this format, naming the formats that fit."""
    block = NV_BLOCK if kind == "nvfp4" else MX_BLOCK
    if K % block:
        fits = ["fp8", "fp8-e5m2", "int8"] + (["nvfp4"] if K % NV_BLOCK == 0 else [])
        raise InvalidRequestError(f"{kind} needs the input columns in whole blocks of {block}; {what} has {K}. "
                                  f"Formats that take {K} columns: {', '.join(fits)}", "quantization")


def round_e2m1(v: torch.Tensor) -> torch.Tensor:
    """float -> E2M1 codes (uint8), nearest value, saturating at +-6."""
    idx = torch.bucketize(v.abs().clamp(max=6.0), _E2M1_MIDPOINTS.to(v.device))
    return (idx + 8 * (v < 0).long() * (idx > 0).long()).to(torch.uint8)


def _round_elements(v: torch.Tensor, kind: str) -> torch.Tensor:
    """scaled values -> element values (as float) and their stored form"""
    if kind == "mxfp8":
        q = v.clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
        return q.float(), q
    codes = round_e2m1(v)
    return E2M1_VALUES.to(v.device)[codes.long()], codes


def quantize_mx(w: torch.Tensor, kind: str) -> BlockTensor:
    """w [N, K] -> mxfp8 or mxfp4, blocks of 32 along K"""
    N, K = w.shape
    check_block(kind, K)
    wb = w.detach().float().view(N, K // MX_BLOCK, MX_BLOCK)
    emax = 448.0 if kind == "mxfp8" else 6.0
    amax = wb.abs().amax(-1)
    hi = torch.ceil(torch.log2(torch.where(amax > 0, amax / emax, torch.ones_like(amax))))  # no clipping
    best_e, best_err, best_q = None, None, None
    for e in (hi, hi - 1):
        e = (e + 127).clamp(1, 254)
        vals, q = _round_elements(wb / e8m0_value(e)[..., None], kind)
        err = ((vals * e8m0_value(e)[..., None] - wb) ** 2).sum(-1)
        if best_e is None:
            best_e, best_err, best_q = e, err, q
        else:
            take = err < best_err
            best_e = torch.where(take, e, best_e)
            best_q = torch.where(take[..., None], q.view(torch.uint8), best_q.view(torch.uint8))
            best_err = torch.where(take, err, best_err)
    q = best_q.view(torch.uint8).view(N, K)
    return BlockTensor(kind, q.view(torch.float8_e4m3fn) if kind == "mxfp8" else q, best_e.to(torch.uint8))


def quantize_nvfp4(w: torch.Tensor) -> BlockTensor:
    """w [N, K] -> nvfp4, blocks of 16 along K"""
    N, K = w.shape
    check_block("nvfp4", K)
    wb = w.detach().float().view(N, K // NV_BLOCK, NV_BLOCK)
    amax = float(wb.abs().max())
    t = amax / (448.0 * 6.0) if amax > 0 else 1.0
    d = (wb.abs().amax(-1) / 6.0 / t).clamp(max=448.0).to(torch.float8_e4m3fn)
    df = d.float() * t
    safe = torch.where(df > 0, df, torch.ones_like(df))
    codes = round_e2m1(wb / safe[..., None])
    codes = torch.where(df[..., None] > 0, codes, torch.zeros_like(codes))
    return BlockTensor("nvfp4", codes.view(N, K), d.view(torch.uint8), t)


def quantize(w: torch.Tensor, kind: str) -> Fp8Tensor | BlockTensor:
    """kind: fp8, fp8-e5m2, fp8-tensor, fp8-e5m2-tensor, mxfp8, mxfp4, nvfp4"""
    if kind.startswith("fp8"):
        return quantize_fp8(w, "e5m2" if "e5m2" in kind else "e4m3", kind.endswith("-tensor"))
    return quantize_nvfp4(w) if kind == "nvfp4" else quantize_mx(w, kind)
