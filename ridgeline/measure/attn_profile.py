"""Where a long prefill's time goes: one decoder layer's matmuls and its attention, timed apart.

The layers of a Llama-family model are alike, so one layer, run on random data of the model's shapes
(weights packed in the run's dtype, a paged KV cache of the run's KV format), splits a prefill of n
tokens (in chunks of the engine's token budget, each chunk's rows attending causally to everything
before them) into its two costs: the four projections (qkv, o, gate_up, down: 2 x params x tokens
FLOPs) and attention (4 x heads x head_dim x keys FLOPs per query row: q.k and p.v). Times are this
process's CPU time (steadier than wall time on a shared machine); with one thread the ratio of the
two is the ratio of their work on one core. Profiled at several lengths, the share curve gives the
prompt length where attention overtakes the matmuls (`crossover_from_profile`).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from ridgeline.kernels import cpu_attention
from ridgeline.kernels.cpu_gemm import PackedWeight


@dataclass(frozen=True)
class LayerShape:
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int

    @classmethod
    def of(cls, arch) -> LayerShape:
        return cls(arch.hidden_size, arch.intermediate_size, arch.num_heads, arch.num_kv_heads, arch.head_dim)

    @property
    def linears(self) -> list[tuple[int, int]]:
        """(N, K) of qkv, o, gate_up, down"""
        h, d = self.hidden, self.head_dim
        return [((self.heads + 2 * self.kv_heads) * d, h), (h, self.heads * d), (2 * self.intermediate, h),
                (h, self.intermediate)]

    def matmul_flops(self, tokens: int) -> float:
        return 2.0 * tokens * sum(n * k for n, k in self.linears)

    def attention_flops(self, start: int, n: int) -> float:
        """q.k and p.v of n causal rows at positions start.. (row i sees start + i + 1 keys)"""
        keys = n * start + n * (n + 1) / 2
        return 4.0 * self.heads * self.head_dim * keys


@dataclass
class StepProfile:
    tokens: int
    matmul_s: float
    attention_s: float
    matmul_flops: float
    attention_flops: float

    @property
    def attention_share(self) -> float:
        return self.attention_s / (self.attention_s + self.matmul_s)

    @property
    def matmul_gflops(self) -> float:
        return self.matmul_flops / self.matmul_s / 1e9

    @property
    def attention_gflops(self) -> float:
        return self.attention_flops / self.attention_s / 1e9

    def as_dict(self) -> dict:
        return {"tokens": self.tokens, "matmul_s": self.matmul_s, "attention_s": self.attention_s,
                "attention_share": self.attention_share, "matmul_gflops": self.matmul_gflops,
                "attention_gflops": self.attention_gflops,
                "attention_vs_matmul_rate": self.attention_gflops / self.matmul_gflops}


def _cpu_time(fn) -> float:
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


def profile_prefill(shape: LayerShape, n: int, chunk: int = 512, dtype: torch.dtype = torch.bfloat16,
                    kv_dtype: torch.dtype | None = None, block_size: int = 16, tiled: bool = True,
                    seed: int = 0) -> StepProfile:
    """One layer's prefill of n tokens in chunks of `chunk`: CPU seconds of its matmuls and attention."""
    g = torch.Generator().manual_seed(seed)
    kv_dtype = kv_dtype or dtype
    weights = [PackedWeight((torch.randn(nn, k, generator=g) * k ** -0.5).to(dtype)) for nn, k in shape.linears]
    nb = -(-n // block_size)
    D, Hkv, H = shape.head_dim, shape.kv_heads, shape.heads
    kc = torch.randn(nb + 1, block_size, Hkv, D, generator=g).to(kv_dtype)
    vc = torch.randn(nb + 1, block_size, Hkv, D, generator=g).to(kv_dtype)
    table = (torch.randperm(nb, generator=g) + 1).view(1, nb)
    mm_s = att_s = 0.0
    for start in range(0, n, chunk):
        m = min(chunk, n - start)
        x = torch.randn(m, shape.hidden, generator=g)
        inputs = [x, torch.randn(m, H * D, generator=g), x, torch.randn(m, shape.intermediate, generator=g)]
        mm_s += _cpu_time(lambda: [w(a) for w, a in zip(weights, inputs)])
        q = torch.randn(m, H, D, generator=g)
        row_seq = torch.zeros(m, dtype=torch.int64)
        key_lens = torch.arange(start + 1, start + m + 1, dtype=torch.int64)
        att_s += _cpu_time(lambda: cpu_attention.paged_decode(q, kc, vc, table, key_lens, D ** -0.5, None,
                                                              row_seq=row_seq, tiled=tiled))
    att_flops = sum(shape.attention_flops(s, min(chunk, n - s)) for s in range(0, n, chunk))
    return StepProfile(n, mm_s, att_s, shape.matmul_flops(n), att_flops)


def crossover_from_profile(shape: LayerShape, lengths: list[int], chunk: int, dtype, kv_dtype) -> float | None:
    """The prompt length where one layer's attention time reaches its matmul time (log-interpolated
    between profiled lengths), or None if it does not within them."""
    pts = [(n, profile_prefill(shape, n, chunk, dtype, kv_dtype).attention_share) for n in lengths]
    for (n0, s0), (n1, s1) in zip(pts, pts[1:]):
        if s0 < 0.5 <= s1:
            f = (0.5 - s0) / (s1 - s0)
            return math.exp(math.log(n0) + f * (math.log(n1) - math.log(n0)))
    return None
