"""`--quantization gguf`: every Linear keeps the blocks a GGUF file stores, in the nearest packed format.

A layer's format follows the GGML type of the tensors fused into it (repack.target_for: the format that
keeps what its block layout holds, layouts.py), e.g. Q4_0 -> int4-sym g32, Q4_1 -> int4, Q4_K -> int4-k,
Q5_0 -> int5-sym, Q6_K -> int6, Q8_0 -> int8-g32, MXFP4 -> mxfp4; a fused projection whose tensors mix
types (a Q4_K_M file's q/k in Q4_K beside v in Q6_K) is split, each run of one type in its own format
(KeptSplit); a dense (F32 / F16 / BF16) or unsupported shard -> the dense format of --dtype, its blocks
dequantized. The
tied LM head takes the embedding's type (the smollm2 file's Q8_0: int8-g32); the embedding itself is
a dense table in --dtype, since a lookup reads one row per token, not the whole matrix.
`layer_formats` rules still win where they match (a format that takes floats gets dequantized blocks).
Start-up names each kind, e.g. "Q4_1 kept (int4) x 90", "Q4_K+Q6_K kept (int4-k + int6) x 8"; a rule naming
one grid for mixed shards re-rounds those it does not hold: "Q4_K+Q6_K repacked (int8-g32) x 8".
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from fnmatch import fnmatchcase

import torch
from torch import nn

from ridgeline.errors import InvalidRequestError
from ridgeline.gguf import repack
from ridgeline.gguf.blocks import GGUFBlocks
from ridgeline.kernels import cpu_stack
from ridgeline.kernels.formats import code_of
from ridgeline.layers.kernel_plan import KernelPlan
from ridgeline.layers.weight_formats import (WEIGHT_FORMATS, WeightFormat, create_weight_format, keep_shard,
                                             kept_shards, register_weight_format)
from ridgeline.layers.fp_formats import MxFp4
from ridgeline.layers.int_formats import (IQ4, KQ, W4A8, W8A8G32, Int4, Int4K, Int5K, Int5, Int6, Int8G32,
                                         QuantizedFormat)


C_SPLIT = code_of("split")


class KeptBlocks(QuantizedFormat):
    """Loads GGUF blocks shard by shard (kept aside, never as floats) and converts them in finish(): `grid` is the
    packed grid they convert to (repack.TARGETS), `target` what start-up calls it (the grid, or its a8 format)."""
    target = "?"
    grid = None  # None: the target itself

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
        parts = [repack.convert(layer.blocks[s], self.grid or self.target) for s in shards]
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
# gguf-a8's formats: a8 target -> (the grid its blocks convert to, the a8 format whose kernel runs it, its fields)
KEPT_A8 = {"w4a8": ("int4", W4A8, {}), "w4a8-sym": ("int4-sym", W4A8, {"symmetric": True}),
           "w8a8-g32": ("int8-g32", W8A8G32, {})}
for _target, (_base, _fields) in KEPT.items():
    register_weight_format(f"gguf-{_target}")(
        type(f"Kept{_base.__name__}{_target.title().replace('-', '')}", (KeptBlocks, _base),
             {"target": _target, **_fields}))
for _target, (_grid, _base, _fields) in KEPT_A8.items():
    register_weight_format(f"gguf-{_target}")(
        type(f"Kept{_base.__name__}{_target.title().replace('-', '')}", (KeptBlocks, _base),
             {"target": _target, "grid": _grid, **_fields}))


def a8_target_for(qtype) -> str:
    """gguf-a8's format for one GGML type (which has a layout): the int4 grids on w4a8's kernel (Q4_0 and Q4_1 as
    stored, Q4_K's fp32 scale products rounded to fp16), MXFP4 on its own (its kernel already takes int8
    activations), everything else on w8a8-g32's (Q8_0, Q5_0 and IQ4_NL as stored, the rest re-rounded to int8)."""
    kept = repack.target_for({qtype})
    if kept == "int4-sym":
        return "w4a8-sym"
    if kept in ("int4", "int4-k"):
        return "w4a8"
    return "mxfp4" if kept == "mxfp4" else "w8a8-g32"


@register_weight_format("gguf-mxfp4")
class KeptMxFp4(KeptBlocks, MxFp4):
    """MXFP4 blocks (GPT-OSS's experts) as the mxfp4 format's own: its kernel quantizes the input to int8 per
    block of 32, as llama.cpp's MXFP4 dot product does."""
    target = "mxfp4"


@register_weight_format("gguf-split")
class KeptSplit(KeptBlocks):
    """A fused projection whose shards mix GGML types (a Q4_K_M file's q and k in Q4_K beside v in Q6_K): each
    run of consecutive shards of one format kept in it (repack.target_for of each type alone), as a
    part of its own, instead of one grid wide enough for them all (int8-g32: about 1.5x the file's bits). The
    parts run their own kernels on their columns (the C stack through one WF_SPLIT descriptor,
    kernels/stack_linear.c), so a column's value is its part's alone: the module path concatenates the same
    calls. layer.parts: [(first row, Linear of that run's shards)]. a8: the runs in gguf-a8's formats."""
    target = "split"
    a8 = False

    def finish(self, layer: nn.Module) -> None:
        if layer.weight is None:
            return
        from ridgeline.layers.linear import Linear  # a part is a Linear of its own rows (layers import formats)
        shards = kept_shards(layer)
        sizes = layer.shard_sizes or {None: layer.out_features}  # a whole weight (a rule naming this format): one part
        runs: list[tuple[str, list[int]]] = []  # (format, consecutive shards of it)
        for s in shards:
            target = self.target_of(layer.blocks[s].qtype)
            if runs and runs[-1][0] == target:
                runs[-1][1].append(s)
            else:
                runs.append((target, [s]))
        layer.parts, row = [], 0
        for target, run in runs:
            fmt = create_weight_format(f"gguf-{target}", self.plan)
            whole = run == [None]
            part = Linear(layer.in_features, sum(sizes[s] for s in run), fmt,
                          shard_sizes=None if whole else [sizes[s] for s in run], prefix=f"{layer.prefix}[{row}:]")
            part.weight = nn.Parameter(torch.empty(0, device=layer.weight.device), requires_grad=False)
            for i, s in enumerate(run):
                part.load("weight", layer.blocks[s], None if whole else i)
            part.finish_loading()
            layer.parts.append((row, part))
            row += part.out_features
        kinds = [part.kept.split(" ") for _, part in layer.parts]  # "Q4_K kept" -> its types, kept or repacked
        layer.kept = f"{'+'.join(k[0] for k in kinds)} {'kept' if all(k[1] == 'kept' for k in kinds) else 'repacked'}"
        layer.targets = " + ".join(part.format.target for _, part in layer.parts)
        layer.desc = None
        layer.weight, layer.blocks = None, None

    def target_of(self, qtype) -> str:
        return a8_target_for(qtype) if self.a8 else repack.target_for({qtype})

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([part.format.apply(part, x) for _, part in layer.parts], dim=-1)

    def stack_weight(self, layer: nn.Module) -> tuple[int, int, int] | str:
        """(WF_SPLIT, its table [parts, then per part its columns and [format, data, scale, bias 0]], 0)."""
        if layer.desc is None:
            table = [len(layer.parts)]
            for _, part in layer.parts:
                w = part.format.stack_weight(part)
                if isinstance(w, str):
                    return f"{part.prefix}: {w}"
                if not cpu_stack.runs_weight_format(w[0]):
                    return f"{part.prefix}: the C stack has no kernel for weight format {part.format.name} on this CPU"
                table += [part.out_features, *w, 0]
            layer.desc = torch.tensor(table, dtype=torch.int64)
        return C_SPLIT, layer.desc.data_ptr(), 0

    def weight_bytes(self, layer: nn.Module) -> int:
        if layer.weight is not None:  # not finished yet
            return sum(b.raw.numel() for b in layer.blocks.values())
        return sum(part.format.weight_bytes(part) for _, part in layer.parts)

    def label(self, layer: nn.Module) -> str:
        return f"{layer.kept} ({layer.targets})" if layer.kept else self.name


@register_weight_format("gguf-a8-split")
class KeptSplitA8(KeptSplit):
    a8 = True


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
                      plan: KernelPlan, a8: bool = False) -> Callable[[str], WeightFormat]:
    """prefix -> format: the first matching layer_formats rule, else the kept-blocks format its file
    types call for (a8: gguf-a8's, int8 activations), else `dense`."""
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
        types = per_layer.get(prefix, {None})
        target = repack.target_for(types)
        if target is None:
            return get(dense)
        if a8:
            targets = {a8_target_for(t) for t in types}
            if targets == {"w4a8", "w4a8-sym"}:  # int4's grid holds Q4_0 (m = -8 d) beside Q4_1 / Q4_K: one call
                targets = {"w4a8"}
            return get(f"gguf-{targets.pop()}" if len(targets) == 1 else "gguf-a8-split")
        return get("gguf-split" if len(types) > 1 else f"gguf-{target}")  # mixed types: each run its own format
    return pick
