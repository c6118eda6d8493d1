"""A PEFT LoRA folder (`adapter_config.json` + `adapter_model.safetensors`), read in two steps: the config
and the safetensors header (names, dtypes, shapes, offsets) first, checked before any tensor data is read;
then each tensor's bytes. A pickled `adapter_model.bin` is refused (unpickling can run code), as are the
variants this engine does not run (DoRA, trained biases, extra trained modules), each named."""
from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

from ridgeline.errors import InvalidRequestError

CONFIG, WEIGHTS, PICKLED = "adapter_config.json", "adapter_model.safetensors", "adapter_model.bin"
MAX_HEADER = 64 << 20  # bytes of safetensors header at most (names and offsets only)
DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
# PEFT config keys of variants this engine does not run: refused when set (truthy)
VARIANTS = {"use_dora": "DoRA", "lora_bias": "trained LoRA biases", "layer_replication": "layer replication",
            "target_parameters": "LoRA on parameters (target_parameters)", "alpha_pattern": "per-module alphas "
            "(alpha_pattern)", "modules_to_save": "extra trained modules (modules_to_save)",
            "trainable_token_indices": "trainable token indices", "use_qalora": "QA-LoRA",
            "alora_invocation_tokens": "activated LoRA (aLoRA)", "megatron_config": "Megatron layers"}


def _bad(name: str, msg: str) -> InvalidRequestError:
    return InvalidRequestError(f"LoRA adapter {name!r}: {msg}", "lora_request")


@dataclass(frozen=True)
class TensorEntry:
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int  # byte offsets in the file
    end: int


@dataclass(frozen=True)
class PeftFiles:
    name: str
    folder: Path
    alpha: float
    rank: int  # the config's r (a module's own rank comes from its tensors: rank_pattern)
    rslora: bool  # scale alpha / sqrt(r) instead of alpha / r
    targets: object  # target_modules as the config gives it (a list, or a regex string)
    tensors: dict[str, TensorEntry]

    def scale(self, r: int) -> float:
        return self.alpha / math.sqrt(r) if self.rslora else self.alpha / r

    def read(self, key: str) -> torch.Tensor:
        """One tensor's values: bf16 as stored, F32 and F16 as fp32."""
        e = self.tensors[key]
        with open(self.folder / WEIGHTS, "rb") as f:
            f.seek(e.start)
            raw = f.read(e.end - e.start)
        if len(raw) != e.end - e.start:
            raise _bad(self.name, f"{WEIGHTS} ends inside {key}")
        t = torch.frombuffer(bytearray(raw), dtype=e.dtype).reshape(e.shape)
        return t if t.dtype == torch.bfloat16 else t.float()


def read_peft(name: str, path: str | Path, max_rank: int) -> PeftFiles:
    """The folder's config and tensor index, checked; no tensor data is read."""
    folder = Path(path)
    if not folder.is_dir():
        raise _bad(name, f"{path} is not a folder (want {CONFIG} and {WEIGHTS})")
    if not (folder / WEIGHTS).is_file():
        if (folder / PICKLED).is_file():
            raise _bad(name, f"{PICKLED} is a pickled file, which is not loaded (unpickling can run code); save the "
                             "adapter as safetensors (peft: save_pretrained(..., safe_serialization=True))")
        raise _bad(name, f"no {WEIGHTS} in {path}")
    try:
        cfg = json.loads((folder / CONFIG).read_text())
    except FileNotFoundError:
        raise _bad(name, f"no {CONFIG} in {path}") from None
    except (OSError, ValueError) as e:
        raise _bad(name, f"{CONFIG} is not readable JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise _bad(name, f"{CONFIG} must hold a JSON object")
    if cfg.get("peft_type", "LORA") != "LORA":
        raise _bad(name, f"peft_type {cfg.get('peft_type')!r}: only LoRA adapters (LORA) load")
    for key, what in VARIANTS.items():
        if cfg.get(key):
            raise _bad(name, f"{what} ({key} in {CONFIG}) is not supported")
    if cfg.get("bias", "none") != "none":
        raise _bad(name, f"bias {cfg.get('bias')!r}: trained biases are not supported (only 'none')")
    if cfg.get("fan_in_fan_out"):
        raise _bad(name, "fan_in_fan_out (GPT-2 style Conv1D layers) is not supported")
    r, alpha = cfg.get("r"), cfg.get("lora_alpha", cfg.get("r"))
    if isinstance(r, bool) or not isinstance(r, int) or not 1 <= r <= max_rank:
        raise _bad(name, f"rank r={r!r} is outside [1, {max_rank}] (--max-lora-rank)")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha) or alpha <= 0:
        raise _bad(name, f"lora_alpha must be a positive number, not {alpha!r}")
    rslora = cfg.get("use_rslora", False)
    if not isinstance(rslora, bool):
        raise _bad(name, f"use_rslora must be true or false, not {rslora!r}")
    return PeftFiles(name, folder, float(alpha), r, rslora, cfg.get("target_modules"), _header(name, folder / WEIGHTS))


def _header(name: str, path: Path) -> dict[str, TensorEntry]:
    """The safetensors header: every tensor's dtype, shape and byte range, checked against the file's size."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise _bad(name, f"{WEIGHTS} is truncated (no header)")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER or 8 + n > size:
            raise _bad(name, f"{WEIGHTS}: a header of {n} bytes does not fit the file ({size} bytes)")
        try:
            meta = json.loads(f.read(n))
        except ValueError as e:
            raise _bad(name, f"{WEIGHTS}: unreadable header ({e})") from None
    if not isinstance(meta, dict):
        raise _bad(name, f"{WEIGHTS}: the header must be a JSON object")
    out, base, end = {}, 8 + n, 8 + n
    for key, v in meta.items():
        if key == "__metadata__":
            continue
        try:
            dtype, shape, (a, b) = v["dtype"], tuple(int(d) for d in v["shape"]), v["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise _bad(name, f"{WEIGHTS}: a malformed header entry for {key}") from None
        if dtype not in DTYPES:
            raise _bad(name, f"{key} is {dtype}; adapters load from F32, BF16 or F16")
        want = math.prod(shape) * DTYPES[dtype].itemsize
        if any(d < 0 for d in shape) or not (isinstance(a, int) and isinstance(b, int)) or b - a != want or a < 0:
            raise _bad(name, f"{WEIGHTS}: {key}'s byte range does not match its shape {list(shape)}")
        out[key] = TensorEntry(DTYPES[dtype], shape, base + a, base + b)
        end = max(end, base + b)
    if end > size:
        raise _bad(name, f"{WEIGHTS} is truncated: its header names {end} bytes, the file has {size}")
    if size > end:
        raise _bad(name, f"{WEIGHTS} has {size - end} bytes past what its header names (an oversized file)")
    return out
