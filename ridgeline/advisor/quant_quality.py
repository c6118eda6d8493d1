"""Measured quality of each weight format on the default model (SmolLM2-135M), shared by `advise quant`
and the console: one table, copied from docs/performance.md ("Quality on the default model" and "GGUF
blocks kept").

How it was measured: `ridgeline eval --quantization Q --max-tokens 4096 --prompts 8 --gen-tokens 32`
(8 windows of 512 held-out tokens), the reference the same engine unquantized in bf16. Deterministic: a
loaded machine gives the same numbers. Another model or text moves these numbers; the ranking is what
transfers, and only roughly (the default model's matrices sit on Q4_1's grid, which flatters int4).
"""
from __future__ import annotations

from dataclasses import dataclass

MODEL = "SmolLM2-135M"
REFERENCE_PPL = 16.296
HOW = "ridgeline eval, 8 x 512 held-out tokens, against bf16"


@dataclass(frozen=True)
class Quality:
    fmt: str  # the engine's --quantization value
    precision: str  # the advisor's number format for its bytes and matrix rate
    weights_mb: float  # Linear weights read per token on the default model, scales included
    perplexity: float
    agreement: float  # top-1 agreement with the reference
    kl: float  # mean KL divergence from the reference
    note: str = ""

    @property
    def name(self) -> str:
        return "bf16" if self.fmt == "none" else self.fmt

    @property
    def ppl_change(self) -> float:
        """Relative perplexity change against the bf16 reference, in percent."""
        return (self.perplexity / REFERENCE_PPL - 1) * 100

    def json(self) -> dict:
        return {**self.__dict__, "ppl_change_pct": self.ppl_change}


MEASURED: tuple[Quality, ...] = (
    Quality("none", "bf16", 269.0, 16.296, 1.0, 0.0, "reference (bf16)"),
    Quality("gguf", "int4", 96.4, 16.295, 0.9905, 0.00024, "the file's Q4_1 blocks kept, Q8_0 head"),
    Quality("int4", "int4", 94.9, 16.321, 0.9763, 0.00129, "g32 asymmetric, int8 head"),
    Quality("int8", "int8", 135.3, 16.360, 0.9582, 0.00429, "per channel"),
    Quality("fp8", "fp8", 135.3, 16.666, 0.893, 0.0277, "E4M3 per channel"),
    Quality("mxfp8", "fp8", 138.7, 16.970, 0.893, 0.0323, "E4M3, power-of-two scale per 32"),
    Quality("nvfp4", "fp4", 88.2, 21.021, 0.751, 0.2488, "E2M1, E4M3 scale per 16, int8 activations"),
    Quality("mxfp4", "fp4", 85.6, 24.560, 0.658, 0.4749, "E2M1, power-of-two scale per 32, int8 activations"),
)
