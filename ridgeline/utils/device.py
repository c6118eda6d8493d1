"""Pick the device and the compute dtype for this machine, and say why."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ridgeline.errors import InvalidRequestError

_NAMES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class DtypeChoice:
    dtype: torch.dtype
    reason: str


def pick_device(spec: str) -> torch.device:
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(spec)
    except (RuntimeError, TypeError):
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise InvalidRequestError(f"unknown device {spec!r}: use auto, cpu, cuda or cuda:N", "device")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise InvalidRequestError(f"device {spec!r}: torch sees no CUDA device here; use cpu or auto",
                                  "device")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise InvalidRequestError(f"device {spec!r}: only {torch.cuda.device_count()} CUDA device(s) visible",
                                  "device")
    return device


def nvidia_sm80(device: torch.device) -> bool:
    """An NVIDIA GPU of compute capability 8.0 or newer (Ampere, Hopper, ...): where bf16 tensor cores,
    FlashAttention-2 and the Triton kernels here run (ROCm and older cards take the torch paths)."""
    if device.type != "cuda" or torch.version.hip is not None or not torch.cuda.is_available():
        return False
    return torch.cuda.get_device_capability(device) >= (8, 0)


def cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def meminfo_bytes(field: str, default: int = 8 << 30) -> int:
    """A /proc/meminfo field in bytes (MemTotal, MemAvailable, ...); `default` where unreadable."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return default


def pick_dtype(spec: str, device: torch.device) -> DtypeChoice:
    if spec != "auto":
        return DtypeChoice(_NAMES[spec], f"--dtype {spec}")
    if device.type == "cuda":
        return DtypeChoice(torch.bfloat16, "CUDA device: bfloat16 tensor cores")
    native = cpu_flags() & {"avx512_bf16", "amx_bf16"}
    if native:
        return DtypeChoice(torch.bfloat16, f"CPU has native bf16 matrix instructions ({', '.join(sorted(native))})")
    return DtypeChoice(torch.float32, "CPU lacks AVX512-BF16/AMX, where bf16 matmul is 3-5x slower than fp32")
