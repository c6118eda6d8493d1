"""What model construction needs besides the architecture: decided once at engine start, passed down."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase

import torch

from ridgeline.errors import InvalidRequestError
from ridgeline.layers.expert_sharding import ExpertSharding
from ridgeline.layers.kernel_plan import KernelPlan
from ridgeline.layers.weight_formats import DENSE, WEIGHT_FORMATS, WeightFormat, create_weight_format
from ridgeline.layers import int_formats as _quant_formats  # noqa: F401  registers the quantized formats
from ridgeline.layers import fp_formats as _fp_formats  # noqa: F401  and the floating-point ones
from ridgeline.layers import prequantized as _prequantized  # noqa: F401  and the GPTQ / AWQ folders' formats


@dataclass(frozen=True)
class BuildOptions:
    plan: KernelPlan
    dtype: torch.dtype  # embeddings and dense weights
    act_dtype: torch.dtype  # activations, norm weights, biases
    attention_backend: str = "auto"
    weight_format: Callable[[str], WeightFormat] | None = None  # layer prefix -> its format; default dense `dtype`
    # tensor parallelism: this rank's distributed.comm.TPComm (its shard and process group); None: one process.
    # The modules are built from the rank's ArchConfig (distributed.shard.local_arch)
    tp: object | None = None
    experts: ExpertSharding | None = None  # expert parallelism: how sparse layers spread their experts (None: off)
    # pipeline parallelism: this process's distributed.stages.Stage; the model builds only its layers (the
    # embedding on the first stage, final norm and LM head on the last). None: every layer
    stage: object | None = None

    def format_for(self, prefix: str) -> WeightFormat:
        if self.weight_format is not None:
            return self.weight_format(prefix)
        return create_weight_format(DENSE[self.dtype], self.plan)


def layer_format_rules(rules: Sequence[tuple[str, str]], default: str,
                       plan: KernelPlan) -> Callable[[str], WeightFormat]:
    """prefix -> format: the first (glob, name) rule whose glob matches the layer's name, else `default`."""
    for _, name in rules:
        if name not in WEIGHT_FORMATS:
            raise InvalidRequestError(f"unknown weight format {name!r} in layer_formats; known: "
                                      f"{', '.join(sorted(WEIGHT_FORMATS))}", "layer_formats")
    formats = {name: create_weight_format(name, plan) for name in {default, *(n for _, n in rules)}}

    def pick(prefix: str) -> WeightFormat:
        return formats[next((n for glob, n in rules if fnmatchcase(prefix, glob)), default)]
    return pick
