"""Facts measured or derived at engine start-up: never written back into the config."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ridgeline.utils.device import meminfo_bytes


@dataclass(frozen=True)
class EngineInfo:
    model_folder: Path
    architecture: str
    device: torch.device
    dtype: torch.dtype
    dtype_reason: str
    kv_dtype: torch.dtype
    kernels: str  # the matmul and fused kernels chosen, for the start-up summary
    max_model_len: int
    block_size: int
    num_kv_blocks: int
    kv_bytes: int
    eos_token_ids: tuple[int, ...]
    load_seconds: float
    prefix_caching: bool = False

    @property
    def kv_capacity_tokens(self) -> int:
        return (self.num_kv_blocks - 1) * self.block_size

    @property
    def max_concurrency(self) -> float:
        """Requests of max_model_len tokens that fit in the cache at once."""
        return self.kv_capacity_tokens / self.max_model_len

    def summary(self) -> str:
        name = str(self.dtype).removeprefix("torch.")
        return "\n".join([
            f"model      {self.model_folder} ({self.architecture}), loaded in {self.load_seconds:.1f}s",
            f"device     {self.device}, dtype {name}: {self.dtype_reason}",
            f"kv cache   {self.num_kv_blocks - 1} blocks x {self.block_size} tokens = "
            f"{self.kv_capacity_tokens} tokens ({self.kv_bytes / 2**30:.2f} GiB, "
            f"{str(self.kv_dtype).removeprefix('torch.')}); max concurrency at "
            f"max_model_len {self.max_model_len}: {self.max_concurrency:.1f}; prefix caching "
            f"{'on' if self.prefix_caching else 'off'}",
            f"kernels    matmul: {self.kernels}",
        ])


def available_memory() -> int:
    return meminfo_bytes("MemAvailable")
