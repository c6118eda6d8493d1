"""Build a model from a HF folder: construct on the meta device, then fill from safetensors."""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from ridgeline.errors import ModelLoadError
from ridgeline.layers.linear import prepack
from ridgeline.layers.rotary import Rotary
from ridgeline.models.registry import model_class
from ridgeline.weights.hf_config import ArchConfig
from ridgeline.weights.safetensors_loader import iter_tensors


def build_model(cfg: ArchConfig, folder: Path, dtype: torch.dtype, device: torch.device,
                max_positions: int, backend: str = "auto", act_dtype: torch.dtype | None = None) -> nn.Module:
    """Matmul weights in `dtype`; activations, norm weights and biases in `act_dtype` (default: dtype)."""
    act_dtype = act_dtype or dtype
    cls = model_class(cfg.architecture)
    with torch.device("meta"):
        model = cls(cfg, max_positions, backend).to(dtype)
        model.act_dtype = act_dtype
        for name, p in model.named_parameters():
            if p.ndim == 1:  # norm weights, biases
                p.data = p.data.to(act_dtype)
    model.to_empty(device=device)
    for module in model.modules():
        if isinstance(module, Rotary):  # its tables were made on the meta device
            module.init_tables(device)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    load_weights(model, folder)
    prepack(model)  # for the matmul kernels chosen at engine start (ridgeline.layers.kernels)
    return model.eval()


def load_weights(model: nn.Module, folder: Path) -> None:
    params = dict(model.named_parameters(remove_duplicate=False))
    pending: set[tuple[str, int | None]] = set()  # (parameter, shard) still to fill; fused ones per shard
    for n in params:
        if model.cfg.tie_word_embeddings and n == "lm_head.weight":
            continue
        fused = n.split(".")[-2] if n.count(".") else ""
        shards = range(len(model.shard_sizes(fused))) if fused in ("qkv_proj", "gate_up_proj") else [None]
        pending.update((n, i) for i in shards)
    for name, tensor in iter_tensors(folder):
        target, shard = _map_name(model, name)
        if target is None or target not in params:
            continue
        dst = params[target].data
        if shard is not None:
            sizes = model.shard_sizes(target.split(".")[-2])
            dst = dst.narrow(0, sum(sizes[:shard]), sizes[shard])
        tensor = model.transform_weight(name, tensor)
        if tuple(dst.shape) != tuple(tensor.shape):
            raise ModelLoadError(f"weight {name} has shape {tuple(tensor.shape)}, expected {tuple(dst.shape)}")
        dst.copy_(tensor)
        pending.discard((target, shard))
    if pending:
        names = sorted(n if i is None else f"{n}[shard {i}]" for n, i in pending)
        raise ModelLoadError(f"weights missing from {folder}: {', '.join(names[:8])}{' ...' if len(names) > 8 else ''}")


def _map_name(model: nn.Module, name: str) -> tuple[str | None, int | None]:
    parts = name.split(".")
    for i, p in enumerate(parts):
        if p in model.packed:
            fused, shard = model.packed[p]
            return ".".join(parts[:i] + [fused] + parts[i + 1:]), shard
    if name.endswith("rotary_emb.inv_freq"):
        return None, None
    return name, None
