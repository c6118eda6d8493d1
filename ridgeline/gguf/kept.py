"""`--quantization gguf`: every Linear keeps the blocks a GGUF file stores, in the nearest packed format.

A layer's format follows the GGML types of the tensors fused into it (repack.target_for: the narrowest
format that holds what their block layouts keep, layouts.py), e.g. all Q4_0 -> int4-sym g32, Q4_0 with
Q4_1 -> int4 g32, Q5_0 -> int5-sym, Q5_1 / Q5_K (or Q5_0 with Q4_K) -> int5, anything with Q8_0 ->
int8-g32, MXFP4 alone -> mxfp4; a dense (F32 / F16 / BF16) or unsupported shard -> the dense
format of --dtype, its blocks dequantized. The
tied LM head takes the embedding's type (the smollm2 file's Q8_0: int8-g32); the embedding itself is
a dense table in --dtype, since a lookup reads one row per token, not the whole matrix.
`layer_formats` rules still win where they match (a format that takes floats gets dequantized blocks).
Start-up names each kind, e.g. "Q4_1 kept (int4) x 90", "Q6_K repacked (int8-g32) x 30".
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from fnmatch import fnmatchcase

import torch
from torch import nn

from ridgeline.errors import InvalidRequestError
from ridgeline.gguf import repack
from ridgeline.gguf.blocks import GGUFBlocks
from ridgeline.layers.kernel_plan import KernelPlan
from ridgeline.layers.weight_formats import (WEIGHT_FORMATS, WeightFormat, create_weight_format, keep_shard,
                                             kept_shards, register_weight_format)
from ridgeline.layers.fp_formats import MxFp4
from ridgeline.layers.int_formats import IQ4, KQ, Int4, Int4K, Int5K, Int5, Int6, Int8G32, QuantizedFormat


class KeptBlocks(QuantizedFormat):
    """Loads GGUF blocks shard by shard (kept aside, never as floats) and converts them in finish()."""
    target = "?"

    def takes(self, tensor) -> bool:
        return isinstance(tensor, GGUFBlocks)

    def create(self, layer: nn.Module) -> None:
        self.check_shape(layer)
        layer.weight = nn.Parameter(torch.empty(0), requires_grad=False)  # placeholder: the blocks are kept aside
        layer.blocks = {}  # shard (None: the whole weight) -> GGUFBlocks
        layer.kept = ""  # "Q4_1 kept", "Q4_K repacked", ... once finished
        layer.packed = layer.quant = None

    def load(self, layer: nn.Module, param: str, tensor, shard: int | None) -> None:
        if not self.takes(tensor):
            raise ValueError(f"{param} of {layer.prefix}: format {self.name} loads GGUF blocks, got a float tensor")
        keep_shard(layer, param, tensor, shard)

    def finish(self, layer: nn.Module) -> None:
        if layer.weight is None:
            return
        shards = kept_shards(layer)
        parts = [repack.convert(layer.blocks[s], self.target) for s in shards]
        types = sorted({layer.blocks[s].qtype.name for s in shards})
        exact = all(e for _, e in parts)
        layer.kept = f"{'+'.join(types)} {'kept' if exact else 'repacked'}"
        t = repack.concat([p for p, _ in parts])
        if self.runs_kernel(layer.weight):
            layer.packed = self.pack(t)
        else:  # the torch path dequantizes on the model's device (the blocks were read on the host)
            dev = layer.weight.device
            layer.quant = type(t)(**{k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in vars(t).items()})
        layer.weight, layer.blocks = None, None

    def label(self, layer: nn.Module) -> str:
        return f"{layer.kept} ({self.target})" if layer.kept else self.name


# target -> (the format whose kernel runs it, what differs from that format's defaults): `gguf-<target>`
KEPT = {"int4": (Int4, {}), "int4-sym": (Int4, {"symmetric": True}), "int5": (Int5, {}),
        "int5-sym": (Int5, {"symmetric": True}), "int6": (Int6, {}), "iq4-nl": (IQ4, {}),
        "iq4-xs": (IQ4, {"multiple": 256}), "int4-k": (Int4K, {}), "int5-k": (Int5K, {}), "int3": (KQ, {}),
        "int2": (KQ, {"bits": 2}), "int8-g32": (Int8G32, {})}
for _target, (_base, _fields) in KEPT.items():
    register_weight_format(f"gguf-{_target}")(
        type(f"Kept{_base.__name__}{_target.title().replace('-', '')}", (KeptBlocks, _base),
             {"target": _target, **_fields}))


@register_weight_format("gguf-mxfp4")
class KeptMxFp4(KeptBlocks, MxFp4):
    """MXFP4 blocks (GPT-OSS's experts) as the mxfp4 format's own: its kernel quantizes the input to int8 per
    block of 32, as llama.cpp's MXFP4 dot product does."""
    target = "mxfp4"


def layer_types(types: dict[str, object], fused: dict[str, tuple[str, int]], tied: bool) -> dict[str, set]:
    """Our Linear's name -> the GGML types of the file tensors it loads (fused: checkpoint module name ->
    (our fused name, shard), the model class's `packed`). types: HF tensor name -> GGML type."""
    out: dict[str, set] = {}
    for name, qtype in types.items():
        if not name.endswith(".weight"):
            continue
        parts = name.removesuffix(".weight").split(".")
        parts = [fused[p][0] if p in fused else p for p in parts]
        out.setdefault(".".join(parts), set()).add(qtype)
    if tied and "model.embed_tokens" in out:
        out.setdefault("lm_head", out["model.embed_tokens"])
    return out


def gguf_format_rules(rules: Sequence[tuple[str, str]], per_layer: dict[str, set], dense: str,
                      plan: KernelPlan) -> Callable[[str], WeightFormat]:
    """prefix -> format: the first matching layer_formats rule, else the kept-blocks format its file
    types call for, else `dense`."""
    for _, name in rules:
        if name not in WEIGHT_FORMATS:
            raise InvalidRequestError(f"unknown weight format {name!r} in layer_formats; known: "
                                      f"{', '.join(sorted(WEIGHT_FORMATS))}", "layer_formats")
    formats: dict[str, WeightFormat] = {}

    def get(name: str) -> WeightFormat:
        if name not in formats:
            formats[name] = create_weight_format(name, plan)
        return formats[name]

    def pick(prefix: str) -> WeightFormat:
        rule = next((n for glob, n in rules if fnmatchcase(prefix, glob)), None)
        if rule is not None:
            return get(rule)
        target = repack.target_for(per_layer.get(prefix, {None}))
        return get(dense if target is None else f"gguf-{target}")
    return pick
