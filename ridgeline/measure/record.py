"""What a measurement run records beside its numbers: the machine it ran on (printed, and kept in its
JSON), and the JSON file itself. Shared by the benchmarks and `ridgeline eval`."""
from __future__ import annotations

import json
import platform
from pathlib import Path

from ridgeline.errors import RidgelineError


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info() -> dict:
    import os

    import torch
    info = {"cpu": cpu_model(), "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__,
            "python": platform.python_version()}
    try:
        import transformers
        info["transformers"] = transformers.__version__
    except ImportError:
        info["transformers"] = None
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def describe_machine(info: dict) -> str:
    s = (f"machine    {info['cpu']} ({info['cpus']} CPUs, torch {info['torch']} on {info['torch_threads']} "
         f"threads, {info['cpu_capability']})")
    if info.get("gpu"):
        s += f"; GPU {info['gpu']}"
    return s


def write_json(path: str, payload: dict) -> None:
    try:
        Path(path).write_text(json.dumps(payload, indent=2, default=str) + "\n")
    except OSError as e:
        raise RidgelineError(f"cannot write {path}: {e.strerror}") from None
