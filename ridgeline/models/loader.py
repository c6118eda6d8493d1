"""Build a model from a HF folder: construct on the meta device, materialize, then hand each
checkpoint tensor to the module that owns its parameter (a Linear passes it to its weight format:
whole, or one shard of a fused projection), then let every Linear post-process (repack)."""
from __future__ import annotations

import itertools
from collections.abc import Iterable
from pathlib import Path

import torch
from torch import nn

from ridgeline.errors import ModelLoadError
from ridgeline.gguf.blocks import GGUFBlocks
from ridgeline.gguf.source import source_gguf
from ridgeline.layers.linear import Linear, finish_loading
from ridgeline.layers.rotary import Rotary
from ridgeline.layers.weight_formats import load_rows
from ridgeline.layers.build_options import BuildOptions
from ridgeline.models.expert_split import split_stacked_experts
from ridgeline.models.registry import model_class
from ridgeline.weights import fp8_checkpoint, mxfp4_checkpoint
from ridgeline.weights.mxfp4_checkpoint import MxBlocks
from ridgeline.weights.quant_checkpoint import read_quant_config, unpack_checkpoint
from ridgeline.weights.hf_config import ArchConfig
from ridgeline.weights.safetensors_loader import iter_tensors, weight_files

# A model takes at most this many times the bytes of the weight files that fill it (a dense float32 model
# from 2-bit packed weights takes 16x), plus SLACK: more means a config that does not describe its weights.
MAX_EXPANSION, SLACK = 32, 256 << 20


def build_model(cfg: ArchConfig, folder: Path, opts: BuildOptions, device: torch.device,
                max_positions: int, tensors: Iterable | None = None, slicer=None) -> nn.Module:
    """tensors: (checkpoint name, tensor or GGUFBlocks) to load instead of the folder's safetensors.
    slicer: tensor parallelism, cfg is the rank's (distributed.shard.local_arch) and slicer cuts each
    checkpoint tensor to this rank's part as it is read."""
    cls = model_class(cfg.architecture)
    with torch.device("meta"):
        model = cls(cfg, max_positions, opts)
    check_size(model, cfg, folder, max_positions, tensors is not None)
    model.to_empty(device=device)
    model.slice_tensor = slicer
    for module in model.modules():
        if isinstance(module, Rotary):  # its tables were made on the meta device
            module.init_tables(device)
    if model.ties_head:
        model.lm_head.weight = model.model.embed_tokens.weight
    load_weights(model, folder, tensors)
    finish_loading(model)  # repack for the kernels of opts.plan
    _drop_head_source(model)
    return model.eval()


def check_size(model: nn.Module, cfg: ArchConfig, folder: Path, max_positions: int, given: bool) -> None:
    """Before anything is allocated: the bytes the model's sizes call for (its parameters and buffers, still
    on the meta device, and the rotary tables for max_positions, float64 while they are built) against its
    weight files. given: the tensors come from elsewhere (a GGUF file); a folder without weights is not
    checked then."""
    linked = source_gguf(folder)
    files = [linked] if linked else weight_files(folder) if not given or any(Path(folder).glob("*.safetensors")) else []
    if not files:
        return
    have = sum(f.stat().st_size for f in files)
    tensors = itertools.chain(model.parameters(), model.buffers())
    params = sum(t.numel() * t.element_size() for t in tensors)
    tables = 20 * max_positions * cfg.head_dim
    if params + tables > MAX_EXPANSION * have + SLACK:
        why = (f"{max_positions} positions of rotary tables take {tables} bytes (lower --max-model-len)"
               if tables > params else "the config does not describe its weights")
        raise ModelLoadError(f"{folder}: a {cfg.architecture} of {cfg.num_layers} layers, hidden size "
                             f"{cfg.hidden_size}, intermediate size {cfg.intermediate_size} and vocabulary "
                             f"{cfg.vocab_size} would take {params + tables} bytes, over {MAX_EXPANSION}x its {have} "
                             f"bytes of weight files: {why}")


def _drop_head_source(model: nn.Module) -> None:
    """A pipeline stage after the first holds the embedding table only as its tied head's weights: once
    the head keeps its own (packed) copy, the table goes."""
    m = model.model
    if getattr(m, "stage", None) is None or m.stage.first or m.embed_tokens is None:
        return
    w = getattr(model.lm_head, "weight", None)
    if w is None or w.data_ptr() != m.embed_tokens.weight.data_ptr():
        m.embed_tokens = None


def load_weights(model: nn.Module, folder: Path, tensors: Iterable | None = None) -> None:
    modules = dict(model.named_modules())
    pending: set[tuple[str, int | None]] = set()  # (parameter, shard) still to fill; fused ones per shard
    for n, _ in model.named_parameters(remove_duplicate=False):
        if model.ties_head and n == "lm_head.weight":
            continue
        owner = modules[n.rpartition(".")[0]]
        sizes = owner.shard_sizes if isinstance(owner, Linear) else None
        pending.update((n, i) for i in (range(len(sizes)) if sizes else [None]))
    stream = folder_tensors(folder, model.cfg, lambda name: _not_held(model, modules, name)) \
        if tensors is None else tensors
    qc = read_quant_config(folder) if tensors is None else None
    if qc is not None:  # a GPTQ / AWQ folder: its packed layers unpacked for their formats
        stream = unpack_checkpoint(stream, qc)
    elif tensors is None and fp8_checkpoint.is_fp8_checkpoint(folder):
        stream = fp8_checkpoint.tensors(folder, stream, lambda name, dtype: _keeps_fp8(model, modules, name, dtype))
    elif tensors is None and mxfp4_checkpoint.is_mxfp4_checkpoint(folder):  # X_blocks + X_scales -> MxBlocks X
        stream = mxfp4_checkpoint.tensors(stream)
    if getattr(model.cfg, "fused_checkpoint", False):
        stream = split_fused(stream, model, folder)
    if model.cfg.family.stacked_experts and model.cfg.moe is not None:
        stream = split_stacked_experts(stream, model.cfg.moe.num_experts)
    for name, tensor in stream:
        target, shard = map_name(model, name)
        if target is None:
            continue
        owner_name, _, param = target.rpartition(".")
        owner = modules.get(owner_name)
        if owner is None or not (_known(owner, param) or _extra(owner, param)):
            continue
        tensor = _transform(model, name, tensor)
        if getattr(model, "slice_tensor", None) is not None:  # tensor parallelism: this rank's part only
            tensor = model.slice_tensor(target, shard, tensor)
        try:
            if isinstance(owner, Linear):
                owner.load(param, _loadable(owner, tensor), shard)
            else:
                load_rows(getattr(owner, param).data, _loadable(owner, tensor), None, target)
        except ValueError as e:
            raise ModelLoadError(f"weight {name}: {e}") from None
        pending.discard((target, shard))
        if target == "model.embed_tokens.weight" and model.cfg.tie_word_embeddings and not model.ties_head \
                and model.lm_head is not None:
            # a tied head with its own (quantized) copy: the same checkpoint tensor (GGUF blocks as stored)
            model.lm_head.load("weight", _loadable(model.lm_head, tensor))
            pending.discard(("lm_head.weight", None))
    if pending:
        names = sorted(n if i is None else f"{n}[shard {i}]" for n, i in pending)
        raise ModelLoadError(f"weights missing from {folder}: {', '.join(names[:8])}{' ...' if len(names) > 8 else ''}")


def folder_tensors(folder: Path, cfg: ArchConfig, skip=None) -> Iterable:
    """(checkpoint name, tensor) of a folder's weights: its safetensors, or for a folder converted from a
    GGUF file (gguf/source.py) the file's tensors decoded as they are read. skip(name) True: not read."""
    linked = source_gguf(folder)
    if linked is None:
        return iter_tensors(folder, skip)
    from ridgeline.gguf.load import dequantized_tensors  # the gguf package loads only for a GGUF model
    return dequantized_tensors(linked, cfg, skip)


FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def split_fused(stream: Iterable, model: nn.Module, folder: Path) -> Iterable:
    """A checkpoint that stores qkv_proj / gate_up_proj fused (Phi-3): each as its projections' names and
    rows, so they take the path (row transforms, quantization per shard, tensor-parallel slicing) that
    separately stored ones take. Sizes come from the checkpoint's own config (with tensor parallelism the
    model's is one rank's)."""
    from ridgeline.weights.hf_config import load_arch_config
    full = load_arch_config(folder)
    kv = full.num_kv_heads * full.head_dim
    sizes = {"qkv_proj": (full.num_heads * full.head_dim, kv, kv),
             "gate_up_proj": (full.intermediate_size, full.intermediate_size)}
    for name, tensor in stream:
        parts = name.split(".")
        fused = next((i for i, p in enumerate(parts) if p in FUSED), None)
        if fused is None or ".experts." in name:
            yield name, tensor
            continue
        rows = sizes[parts[fused]]
        if tensor.shape[0] != sum(rows):
            raise ModelLoadError(f"weight {name}: {tensor.shape[0]} rows, the fused projection has "
                                 f"{sum(rows)} ({' + '.join(map(str, rows))})")
        start = 0
        for sub, n in zip(FUSED[parts[fused]], rows):
            part = tensor.rows(start, n) if isinstance(tensor, GGUFBlocks) else tensor.narrow(0, start, n)
            yield ".".join(parts[:fused] + [sub] + parts[fused + 1:]), part
            start += n


def _not_held(model: nn.Module, modules: dict, name: str) -> bool:
    """A weight whose module this process does not hold (another rank's expert, another pipeline stage's
    layer, embedding or head) or of a part the engine does not run (a vision tower): never read."""
    family = getattr(getattr(model, "cfg", None), "family", None)
    if family is not None and family.skipped and name.startswith(family.skipped):
        return True
    if ".experts." not in name and getattr(model.model, "stage", None) is None:
        return False
    target, _ = map_name(model, name)
    return target is not None and modules.get(target.rpartition(".")[0]) is None


def _transform(model: nn.Module, name: str, tensor):
    if isinstance(tensor, GGUFBlocks):  # a row permutation moves whole rows of blocks
        return tensor.permute_rows(lambda rows: model.transform_weight(name, rows))
    return model.transform_weight(name, tensor)


def _loadable(owner: nn.Module, tensor):
    """GGUF or MXFP4 blocks stay blocks for a format that keeps them; anything else gets their float32 values."""
    if isinstance(tensor, (GGUFBlocks, MxBlocks)) and not (isinstance(owner, Linear) and owner.format.takes(tensor)):
        return tensor.dequantize()
    return tensor


def _known(owner: nn.Module, param: str) -> bool:
    return isinstance(getattr(owner, param, None), nn.Parameter)


def _extra(owner: nn.Module, param: str) -> bool:
    """A checkpoint tensor the Linear's format takes besides its parameters (an fp8 checkpoint's scales)."""
    return isinstance(owner, Linear) and param in getattr(owner.format, "extra_tensors", ())


def _keeps_fp8(model: nn.Module, modules: dict, name: str, dtype: torch.dtype) -> bool:
    """Whether the Linear that checkpoint weight `name` loads into takes its fp8 values as they are."""
    target, _ = map_name(model, name)
    owner = modules.get((target or "").rpartition(".")[0])
    return isinstance(owner, Linear) and getattr(owner.format, "keeps", lambda d: False)(dtype)


def map_name(model: nn.Module, name: str) -> tuple[str | None, int | None]:
    family = getattr(getattr(model, "cfg", None), "family", None)
    if family is not None:
        if family.skipped and name.startswith(family.skipped):
            return None, None
        for theirs, ours in family.prefixes:  # a nested text model's names (Gemma 3 image-text checkpoints)
            if name.startswith(theirs):
                name = ours + name[len(theirs):]
                break
    renames = getattr(model, "renames", {})
    parts = [renames.get(p, p) for p in name.split(".")]
    for i, p in enumerate(parts):
        if p in model.packed:
            fused, shard = model.packed[p]
            return ".".join(parts[:i] + [fused] + parts[i + 1:]), shard
    if name.endswith("rotary_emb.inv_freq"):
        return None, None
    return ".".join(parts), None
