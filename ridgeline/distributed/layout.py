"""How a model splits over tensor-parallel ranks: the one set of rules the engine shards by and the
advisor plans with (torch-free).

- Attention splits along whole GQA groups (a KV head with its G query heads): with Hkv >= N ranks,
  the groups go out as evenly as possible, earlier ranks taking one more where N does not divide
  Hkv (9 query / 3 KV heads over 2 ranks: 2 groups and 1). With Hkv < N, each KV head is
  replicated on N / Hkv ranks, which split its G query heads (N must be a multiple of Hkv, and
  N / Hkv must divide G).
- MLP widths (dense, each expert, the shared expert) split evenly: N must divide them.
- The vocabulary (embedding rows and LM head) splits in chunks of ceil(V / N); the last rank's
  chunk is padded with zero rows so every rank's logits have one width (trimmed after gathering).
- Replicated on every rank: norms, q/k norm weights, MoE routers and the shared-expert gate.
"""
from __future__ import annotations

from dataclasses import dataclass

from ridgeline.errors import InvalidRequestError


@dataclass(frozen=True)
class RankShard:
    """Rank `rank` of `size`: the ranges of each split dimension it holds, [start, stop)."""
    rank: int
    size: int
    heads: tuple[int, int]  # query heads
    kv_heads: tuple[int, int]
    inter: tuple[int, int]  # dense MLP intermediate columns
    expert_inter: tuple[int, int]  # each routed expert's intermediate columns (0, 0 without MoE)
    shared_inter: tuple[int, int]  # the shared expert's
    vocab: tuple[int, int]  # rows of the vocabulary this rank holds (the stop may be below start + chunk)
    vocab_chunk: int  # rows every rank allocates (the last rank's tail is zero padding)
    kv_replicated: bool = False  # fewer KV heads than ranks: this rank's KV head is also on others

    @property
    def num_heads(self) -> int:
        return self.heads[1] - self.heads[0]

    @property
    def num_kv_heads(self) -> int:
        return self.kv_heads[1] - self.kv_heads[0]


def _even(n: int, size: int, what: str) -> list[tuple[int, int]]:
    if n % size:
        raise InvalidRequestError(f"tensor_parallel_size {size} does not divide the {what} ({n}); "
                                  f"choose a size that divides it", "tensor_parallel_size")
    step = n // size
    return [(r * step, (r + 1) * step) for r in range(size)]


def _groups(num_heads: int, num_kv_heads: int, size: int) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """Per rank ((first query head, stop), (first KV head, stop))."""
    if num_heads % num_kv_heads:
        raise InvalidRequestError(f"{num_heads} query heads do not form groups over {num_kv_heads} KV heads")
    g = num_heads // num_kv_heads
    if num_kv_heads >= size:  # whole groups, uneven where size does not divide them
        base, extra = divmod(num_kv_heads, size)
        out, k = [], 0
        for r in range(size):
            n = base + (r < extra)
            out.append(((k * g, (k + n) * g), (k, k + n)))
            k += n
        return out
    per_kv = size // num_kv_heads  # ranks sharing one replicated KV head
    if size % num_kv_heads or g % per_kv:
        raise InvalidRequestError(
            f"tensor_parallel_size {size} cannot split {num_kv_heads} KV heads ({g} query heads each): with fewer "
            f"KV heads than ranks, each KV head is replicated on size / KV heads ranks, so the size must be a "
            f"multiple of {num_kv_heads} whose share divides {g}; use a size <= {num_kv_heads} or such a multiple",
            "tensor_parallel_size")
    q = g // per_kv
    return [((r * q, (r + 1) * q), (r // per_kv, r // per_kv + 1)) for r in range(size)]


def tp_layout(num_heads: int, num_kv_heads: int, intermediate: int, vocab: int, size: int,
              expert_inter: int = 0, shared_inter: int = 0, dense_mlp: bool = True) -> list[RankShard]:
    """Every rank's shard, or InvalidRequestError naming the size that cannot split. dense_mlp: some
    layer has a dense MLP (its width must divide)."""
    if size < 1:
        raise InvalidRequestError("tensor_parallel_size must be >= 1", "tensor_parallel_size")
    groups = _groups(num_heads, num_kv_heads, size)
    inter = _even(intermediate, size, "MLP width (intermediate_size)") if dense_mlp else [(0, 0)] * size
    experts = _even(expert_inter, size, "expert width (moe_intermediate_size)") if expert_inter else [(0, 0)] * size
    shared = _even(shared_inter, size, "shared expert width") if shared_inter else [(0, 0)] * size
    chunk = -(-vocab // size)
    return [RankShard(r, size, groups[r][0], groups[r][1], inter[r], experts[r], shared[r],
                      (min(r * chunk, vocab), min((r + 1) * chunk, vocab)), chunk, num_kv_heads < size)
            for r in range(size)]


def layout_for(arch, size: int) -> list[RankShard]:
    """tp_layout of an ArchConfig (engine) or anything with the same fields."""
    moe = getattr(arch, "moe", None)
    dense = moe is None or len(moe.sparse_layers) < arch.num_layers
    return tp_layout(arch.num_heads, arch.num_kv_heads, arch.intermediate_size, arch.vocab_size, size,
                     moe.intermediate_size if moe else 0, moe.shared_intermediate_size if moe else 0, dense)


def shard_bytes_fraction(num_heads: int, num_kv_heads: int, size: int) -> tuple[float, float]:
    """(largest rank's share of the query heads, of the KV heads): what the busiest rank reads of the
    attention weights and holds of the KV cache, e.g. 9/3 heads over 2 ranks -> (6/9, 2/3)."""
    groups = _groups(num_heads, num_kv_heads, size)
    q = max(b - a for (a, b), _ in groups) / num_heads
    kv = max(b - a for _, (a, b) in groups) / num_kv_heads
    return q, kv
