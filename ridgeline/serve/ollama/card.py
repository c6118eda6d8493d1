"""The served model as ollama describes a model: its name with a tag (`NAME:latest` unless the served
name has one; both spellings are accepted), details (format, family, parameter size, quantization), size
and modification time of its files, and a digest: sha256 of the server's fingerprint (the same Ridgeline
version, model files, dtypes and kernels give the same digest)."""
from __future__ import annotations

import hashlib
from datetime import datetime, timezone
from pathlib import Path

from ridgeline.http.errors import ApiError
from ridgeline.serve import reasoning

NEVER = "9999-12-31T23:59:59Z"  # /api/ps expires_at: the model stays loaded while the server runs


def listed_name(state) -> str:
    served = state.settings.served_model_name
    return served if ":" in served else f"{served}:latest"


def resolve(state, name: str) -> str:
    """The served model's name for a client's `name` or `name:latest`; any other a 404."""
    served = state.settings.served_model_name
    if name in (served, listed_name(state)):
        return served
    raise ApiError(404, f'model "{ascii(name)[1:-1][:80]}" not found; this server serves "{listed_name(state)}"',
                   param="model", code="model_not_found")


def _files(folder: Path) -> list[Path]:
    if folder.is_file():
        return [folder]
    return [p for p in folder.iterdir() if p.is_file()] if folder.is_dir() else []


def _when(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def family(state) -> str:
    arch = state.engine.info.architecture
    for tail in ("ForCausalLM", "ForConditionalGeneration", "Model"):
        arch = arch.removesuffix(tail)
    return arch.lower() or "unknown"


def parameter_size(n: int) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            value = n / scale
            return f"{value:.1f}{unit}" if value < 10 else f"{value:.0f}{unit}"
    return str(n)


def details(state) -> dict:
    info = state.engine.info
    files = _files(Path(info.model_folder))
    fmt = "gguf" if any(p.suffix == ".gguf" for p in files) else "safetensors"
    quant = (info.weight_formats.split(" ", 1)[0] or str(info.dtype).removeprefix("torch.")).upper()
    return {"parent_model": "", "format": fmt, "family": family(state), "families": [family(state)],
            "parameter_size": parameter_size(state.engine.arch.num_params), "quantization_level": quant}


def entry(state) -> dict:
    """One model of /api/tags."""
    files = _files(Path(state.engine.info.model_folder))
    name = listed_name(state)
    return {"name": name, "model": name, "modified_at": _when(max((p.stat().st_mtime for p in files), default=0)),
            "size": sum(p.stat().st_size for p in files), "digest": digest(state), "details": details(state)}


def digest(state) -> str:
    return hashlib.sha256(state.system_fingerprint.encode()).hexdigest()


def running(state) -> dict:
    """One model of /api/ps: its memory (weights and KV cache), on the accelerator or not."""
    info = state.engine.info
    size = info.weight_bytes + info.kv_bytes
    name = listed_name(state)
    return {"name": name, "model": name, "size": size, "digest": digest(state), "details": details(state),
            "expires_at": NEVER, "size_vram": size if info.device.type != "cpu" else 0,
            "context_length": state.engine.max_model_len}


def capabilities(state) -> list[str]:
    tok = state.engine.tokenizer
    caps = ["completion", "tools"]  # tools: the model's own call format, or the generic one the server writes
    if reasoning.reasoning_format(state.settings.reasoning_parser, tok) is not None:
        caps.append("thinking")
    return caps


def show(state) -> dict:
    """/api/show: what ollama's clients read (template, details, model_info, capabilities)."""
    arch, fam = state.engine.arch, family(state)
    info = {"general.architecture": fam, "general.parameter_count": arch.num_params,
            f"{fam}.context_length": state.engine.max_model_len, f"{fam}.embedding_length": arch.hidden_size,
            f"{fam}.block_count": arch.num_layers, f"{fam}.attention.head_count": arch.num_heads,
            f"{fam}.attention.head_count_kv": arch.num_kv_heads, f"{fam}.vocab_size": arch.vocab_size}
    return {"license": "", "modelfile": f"# served by Ridgeline\nFROM {Path(state.engine.info.model_folder).name}\n",
            "parameters": "", "template": state.engine.tokenizer.chat_template or "", "details": details(state),
            "model_info": info, "capabilities": capabilities(state), "modified_at": entry(state)["modified_at"]}
