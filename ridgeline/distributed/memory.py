"""What each tensor-parallel rank (or pipeline stage) holds: its shard (or layers), the weight bytes
resident in its process (every parameter and packed / quantized weight once, shared tensors once) and
its KV cache bytes."""
from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from ridgeline.distributed.layout import RankShard
from ridgeline.layers.linear import Linear


def resident_weight_bytes(model: nn.Module) -> int:
    """Bytes of model weights this process keeps: Linear weights as stored (packed, scales included),
    biases, norms, embeddings; a tensor shared by two modules (tied embeddings) counted once."""
    seen: set[int] = set()
    total = 0
    for m in model.modules():
        if isinstance(m, Linear):
            w = getattr(m, "weight", None)
            if w is None or w.data_ptr() not in seen:  # an unpacked tied head is the embedding itself
                total += m.format.weight_bytes(m)
                if w is not None:
                    seen.add(w.data_ptr())
            if m.bias is not None and m.bias.data_ptr() not in seen:
                seen.add(m.bias.data_ptr())
                total += m.bias.numel() * m.bias.element_size()
            continue
        for p in m.parameters(recurse=False):
            if p.data_ptr() not in seen:
                seen.add(p.data_ptr())
                total += p.numel() * p.element_size()
    return total


@dataclass(frozen=True)
class TPInfo:
    size: int
    ranks: tuple[tuple[RankShard, int, int], ...]  # per rank: (shard, resident weight bytes, KV cache bytes)
    worker_pids: tuple[int, ...] = ()  # ranks 1.. when this process started them

    def weight_bytes(self, rank: int) -> int:
        return self.ranks[rank][1]

    def describe(self) -> list[str]:
        lines = []
        for s, w, kv in self.ranks:
            lines.append(f"rank {s.rank}/{s.size}: query heads {s.heads[0]}..{s.heads[1] - 1}, KV heads "
                         f"{s.kv_heads[0]}..{s.kv_heads[1] - 1}{' (replicated)' if s.kv_replicated else ''}, "
                         f"MLP columns {s.inter[0]}..{s.inter[1] - 1}, vocab {s.vocab[0]}..{s.vocab[1] - 1}; "
                         f"weights {w / 1e6:.1f} MB, KV {kv / 2**20:.0f} MiB")
        return lines


@dataclass(frozen=True)
class PPInfo:
    size: int
    # per stage: (distributed.stages.Stage, resident weight bytes, KV cache bytes, tokens its KV budget holds)
    stages: tuple[tuple[object, int, int, int], ...]
    tokens: int  # KV tokens the engine schedules with: the smallest stage's
    one_process_tokens: int  # what the same per-process KV budget holds with every layer in one process
    worker_pids: tuple[int, ...] = ()  # stages 1.. when this process started them

    def weight_bytes(self, stage: int) -> int:
        return self.stages[stage][1]

    def describe(self) -> list[str]:
        lines = [f"{st.describe()}; weights {w / 1e6:.1f} MB, KV {kv / 2**20:.0f} MiB ({t} tokens)"
                 for st, w, kv, t in self.stages]
        lines.append(f"KV capacity {self.tokens} tokens per stage budget (every layer in one process: "
                     f"{self.one_process_tokens}, x{self.tokens / max(self.one_process_tokens, 1):.2f})")
        return lines
