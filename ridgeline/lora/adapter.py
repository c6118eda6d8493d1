"""A PEFT adapter's tensors mapped onto the model's Linears: for each Linear it touches, pieces (first output
row, rows, A [r, in], B [rows, r], the scale), bf16 tensors kept as stored (exact), others as fp32. q/k/v and gate/up are fused in this engine, so a
q_proj adapter is a piece of qkv_proj's rows, and B's rows take the same permutation the base rows took when
they loaded (q/k rows interleaved for rotary); a checkpoint's own fused projection (Phi-3's qkv_proj) splits
B by the same rows. Shapes are checked from the file's header before any data is read: an adapter made for
another base model is refused with the mismatch named."""
from __future__ import annotations

import re
from dataclasses import dataclass

import torch
from torch import nn

from ridgeline.errors import InvalidRequestError
from ridgeline.layers.linear import Linear
from ridgeline.lora.peft_files import PeftFiles
from ridgeline.models.loader import FUSED, map_name

_KEY = re.compile(r"(?:base_model\.model\.)?(?P<module>.+)\.lora_(?P<ab>[AB])(?:\.[A-Za-z0-9_-]+)?\.weight")


@dataclass
class Piece:
    row: int  # first output row of the Linear this piece adds to
    rows: int
    A: torch.Tensor  # [r, in_features], bf16 as stored or fp32
    B: torch.Tensor  # [rows, r], likewise
    scale: float  # lora_alpha / r (or / sqrt(r), rsLoRA)


def _bad(name: str, msg: str) -> InvalidRequestError:
    return InvalidRequestError(f"LoRA adapter {name!r}: {msg}", "lora_request")


def _pairs(peft: PeftFiles) -> dict[str, dict[str, str]]:
    """module path -> {"A": key, "B": key}"""
    out: dict[str, dict[str, str]] = {}
    for key in peft.tensors:
        m = _KEY.fullmatch(key)
        if m is None:
            what = "embeddings" if "lora_embedding" in key else "a tensor that is not a LoRA A or B weight"
            raise _bad(peft.name, f"{key}: {what} (adapters on embeddings are not supported yet)"
                       if what == "embeddings" else f"{key}: {what}")
        out.setdefault(m["module"], {})[m["ab"]] = key
    if not out:
        raise _bad(peft.name, "its safetensors file holds no LoRA weights")
    for module, ab in out.items():
        if set(ab) != {"A", "B"}:
            raise _bad(peft.name, f"{module} has lora_{''.join(ab)} without lora_{'B' if 'A' in ab else 'A'}")
    return out


def map_adapter(peft: PeftFiles, model: nn.Module, max_rank: int) -> dict[str, list[Piece]]:
    """Linear prefix -> its pieces. Checks every name and shape first, then reads the tensors."""
    modules = dict(model.named_modules())
    plan: list[tuple[Linear, str, str, list[tuple[str, int, int]]]] = []  # (linear, A key, B key, [(name, row, n)])
    for module, ab in sorted(_pairs(peft).items()):
        last = module.rpartition(".")[2]
        if ".experts." in module or last in ("experts", "router", "gate") and "mlp" in module:
            raise _bad(peft.name, f"{module}: adapters on mixture-of-experts layers are not supported yet")
        if last in ("lm_head", "embed_tokens"):
            raise _bad(peft.name, f"{module}: adapters on the {'LM head' if last == 'lm_head' else 'embeddings'} "
                                  "are not supported yet")
        if last in FUSED:  # the checkpoint's own fused projection: its sub-projections' names
            subs = [module.rpartition(".")[0] + "." + s for s in FUSED[last]]
        else:
            subs = [module]
        target, shard = map_name(model, subs[0] + ".weight")
        owner = modules.get((target or "").rpartition(".")[0])
        if not isinstance(owner, Linear):
            raise _bad(peft.name, f"it targets {module}, which this model does not have (an adapter for another "
                                  "base model?)")
        a, b = peft.tensors[ab["A"]], peft.tensors[ab["B"]]
        r = a.shape[0] if len(a.shape) == 2 else -1
        if not 1 <= r <= max_rank:
            raise _bad(peft.name, f"{module}: rank {r} is outside [1, {max_rank}] (--max-lora-rank)")
        if a.shape != (r, owner.in_features):
            raise _bad(peft.name, f"{module}.lora_A is {list(a.shape)}; this model's {module} takes "
                                  f"{owner.in_features} inputs (an adapter for another base model?)")
        spans = []
        for sub in subs:
            t, sh = map_name(model, sub + ".weight")
            if t != target:
                raise _bad(peft.name, f"{module}: its projections load into different layers")
            row, n = owner.shard_rows(sh) if sh is not None else (0, owner.out_features)
            spans.append((sub, row, n))
        rows = sum(n for _, _, n in spans)
        if b.shape != (rows, r):
            raise _bad(peft.name, f"{module}.lora_B is {list(b.shape)}; this model's {module} has {rows} outputs "
                                  f"(want [{rows}, {r}]: an adapter for another base model?)")
        plan.append((owner, ab["A"], ab["B"], spans))
    out: dict[str, list[Piece]] = {}
    for owner, ka, kb, spans in plan:
        A, B = peft.read(ka), peft.read(kb)
        if not (torch.isfinite(A.float()).all() and torch.isfinite(B.float()).all()):
            raise _bad(peft.name, f"{ka.rpartition('.lora_')[0]}: its weights hold values that are not finite")
        start = 0
        for sub, row, n in spans:
            part = model.transform_weight(sub + ".weight", B[start:start + n]).contiguous()
            out.setdefault(owner.prefix, []).append(Piece(row, n, A.contiguous(), part, peft.scale(A.shape[0])))
            start += n
    return out
