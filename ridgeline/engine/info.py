"""Facts measured or derived at engine start-up: never written back into the config."""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import torch

from ridgeline.kv_spec import KV_FORMATS, KVCacheSpec
from ridgeline.layers.kernel_plan import KernelPlan
from ridgeline.utils.device import meminfo_bytes

_TORCH = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


@dataclass(frozen=True)
class EngineInfo:
    model_folder: Path
    architecture: str
    device: torch.device
    dtype: torch.dtype
    dtype_reason: str
    kv_spec: KVCacheSpec
    kernel_plan: KernelPlan
    layer_paths: tuple[str | None, ...]  # per layer: None if the C decoder stack runs it, else why modules
    max_model_len: int
    num_kv_blocks: int
    kv_bytes: int
    eos_token_ids: tuple[int, ...]
    load_seconds: float
    prefix_caching: bool = False
    weight_formats: str = ""  # each Linear weight format with its count, e.g. "int8 x 121"
    weight_bytes: int = 0  # bytes of Linear weights as stored (scales included)
    # of those, what one token's decode step reads: a sparse layer's experts counted as the top_k a token runs
    # (0: not known, take weight_bytes)
    weight_bytes_per_token: int = 0
    speculative: str | None = None  # "ngram, k <= 4", or None when off
    quantization: str = "none"  # what the quantization option resolved to (auto: gguf for a GGUF model)
    kv_window: int | None = None  # every layer has a sliding window: the widest (blocks behind it are freed)
    kv_budget: int | None = None  # KV eviction: tokens of KV a request keeps at most
    # local and global layers, one table for every layer all the same: why (None: a table per KV group, or
    # a model without both kinds)
    kv_one_table: str | None = None
    kv_eviction: str | None = None  # the eviction policy, described; None when off
    offload: str | None = None  # the second KV tier, or None when off
    tensor_parallel: object | None = None  # distributed.memory.TPInfo: every rank's shard and bytes; None: one process
    pipeline_parallel: object | None = None  # distributed.memory.PPInfo: every stage's layers and bytes
    expert_parallel: object | None = None  # parallel.ep_runtime.EPInfo: each rank's experts and bytes (own ranks)

    @property
    def block_size(self) -> int:
        return self.kv_spec.block_size

    @property
    def kv_dtype(self) -> torch.dtype | None:
        """The torch dtype K and V are stored in, or None for quantized (or mixed) formats."""
        k, v = self.kv_spec.format.name, self.kv_spec.v_format.name
        return _TORCH.get(k) if k == v else None

    @property
    def kv_format_name(self) -> str:
        """The KV cache format as users name it: "bf16", "int8", or "int4/int8" when K and V differ."""
        k, v = self.kv_spec.format.name, self.kv_spec.v_format.name
        return k if k == v else f"{k}/{v}"

    @property
    def kv_capacity_ratio(self) -> float:
        """Tokens this cache holds over what the same memory holds in the model's dtype."""
        name = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}.get(self.dtype, "f32")
        plain = replace(self.kv_spec, format=KV_FORMATS[name], v_format=None)
        return plain.bytes_per_token / self.kv_spec.bytes_per_token

    @property
    def kernels(self) -> str:
        return self.kernel_plan.summary + self.stack_summary

    @property
    def stack_summary(self) -> str:
        n = sum(p is None for p in self.layer_paths)
        if n == 0:
            return ""
        if n == len(self.layer_paths):
            return "; all layers in one C call per step"
        return f"; {n} of {len(self.layer_paths)} layers in the C decoder stack"

    @property
    def kv_capacity_tokens(self) -> int:
        """Tokens the cache holds (with KV groups, below every window: a block of each group per block)."""
        groups = self.kv_spec.groups
        return (self.num_kv_blocks - 1) * self.block_size // (groups.num_groups if groups else 1)

    @property
    def tokens_per_request(self) -> int:
        """KV slots a decoding request of max_model_len holds: all its tokens, or with a window on every
        layer the blocks its window spans (at most ceil(window / block_size) + 1)."""
        bs = self.block_size
        if self.kv_budget is not None:
            return min(self.max_model_len, -(-self.kv_budget // bs) * bs)
        if self.kv_spec.groups is not None:  # in tokens of every group: pages held x block size / groups
            return self._group_pages() * bs // self.kv_spec.groups.num_groups
        if self.kv_window is None:
            return self.max_model_len
        return min(self.max_model_len, (-(-self.kv_window // bs) + 1) * bs)

    @property
    def max_concurrency(self) -> float:
        """Requests of max_model_len tokens that fit in the cache at once (decoding)."""
        return self.kv_capacity_tokens / self.tokens_per_request

    def layer_report(self) -> list[str]:
        """Which path each layer runs, runs of equal layers merged: names every module-path layer and why."""
        lines, i, paths = [], 0, self.layer_paths
        while i < len(paths):
            j = i
            while j + 1 < len(paths) and paths[j + 1] == paths[i]:
                j += 1
            span = f"layer {i}" if i == j else f"layers {i}-{j}"
            lines.append(f"{span}: " + ("C decoder stack" if paths[i] is None else f"modules ({paths[i]})"))
            i = j + 1
        return lines

    def _kv_ratio_note(self) -> str:
        r = self.kv_capacity_ratio
        return "" if abs(r - 1) < 1e-9 else f", {r:.2f}x the tokens of {str(self.dtype).removeprefix('torch.')}"

    def _group_pages(self) -> int:
        """Pages a decoding request of max_model_len holds over every KV group."""
        return self.kv_spec.groups.peak_pages(self.max_model_len, 1, self.block_size)

    def _window_note(self) -> str:
        groups = self.kv_spec.groups
        if groups is not None:
            share = self._group_pages() * groups.size / (-(-self.max_model_len // self.block_size) * len(groups.group))
            return (f" ({groups.describe()}: a request of max_model_len holds {share:.0%} of the KV one table for "
                    f"every layer would)")
        if self.kv_one_table is not None:
            return f" (local and global layers in one table, every block kept: {self.kv_one_table})"
        if self.kv_budget is not None:
            return f" (KV eviction: at most {self.tokens_per_request} tokens held per request)"
        if self.kv_window is None:
            return ""
        return f" (sliding window {self.kv_window}: at most {self.tokens_per_request} tokens held per request)"

    def summary(self) -> str:
        name = str(self.dtype).removeprefix("torch.")
        lines = [
            f"model      {self.model_folder} ({self.architecture}), loaded in {self.load_seconds:.1f}s",
            f"device     {self.device}, dtype {name}: {self.dtype_reason}",
            f"kv cache   {self.num_kv_blocks - 1} blocks x {self.block_size} tokens = "
            f"{self.kv_capacity_tokens} tokens ({self.kv_bytes / 2**30:.2f} GiB, "
            f"{self.kv_spec.describe()}{self._kv_ratio_note()}); max concurrency at "
            f"max_model_len {self.max_model_len}{self._window_note()}: {self.max_concurrency:.1f}; prefix caching "
            f"{'on' if self.prefix_caching else 'off'}",
            f"kernels    {self.kernels}",
        ]
        if self.weight_formats:
            lines.insert(2, f"weights    {self.weight_formats}: {self.weight_bytes / 1e6:.1f} MB in linear layers "
                            f"(the LM head included; quantization {self.quantization})")
        if self.offload:
            at = next(i for i, line in enumerate(lines) if line.startswith("kv cache"))
            lines.insert(at + 1, f"kv offload {self.offload}")
        if self.speculative:
            lines.append(f"speculate  {self.speculative}")
        if self.kv_eviction:
            lines.append(f"evict      {self.kv_eviction}")
        if self.tensor_parallel is not None:
            lines += [f"parallel   {line}" for line in self.tensor_parallel.describe()]
        if self.pipeline_parallel is not None:
            lines += [f"pipeline   {line}" for line in self.pipeline_parallel.describe()]
        if self.expert_parallel is not None:
            lines += [f"parallel   {line}" for line in self.expert_parallel.describe()]
        if self.kernel_plan.c_stack or any(p is None for p in self.layer_paths):
            lines += [f"layers     {line}" for line in self.layer_report()]
        return "\n".join(lines)


def available_memory() -> int:
    return meminfo_bytes("MemAvailable")
