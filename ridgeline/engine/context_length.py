"""How long a sequence the engine accepts, and the RoPE scaling that gets it there.

`--rope-scaling` replaces the config's rope_scaling (original_max_position_embeddings defaults to the
model's max_position_embeddings, the length it was trained for). `--max-model-len` may go past the
length the model is meant to reach (its max_position_embeddings, or with an override the original
length x factor): the engine runs, with a warning, since quality past that length is not promised.
"""
from __future__ import annotations

import logging
from dataclasses import replace

from ridgeline.errors import InvalidRequestError
from ridgeline.layers.rope_scaling import context_limit
from ridgeline.weights.hf_config import ArchConfig, freeze_rope_scaling

log = logging.getLogger("ridgeline.engine")


def with_rope_override(arch: ArchConfig, override: dict | None) -> ArchConfig:
    if not override:
        return arch
    if arch.head_dim < 4 or arch.head_dim % 2:
        raise InvalidRequestError(f"rope_scaling: {arch.architecture} has head_dim {arch.head_dim}, "
                                  "which rotary scaling cannot apply to", "rope_scaling")
    scaling = {"original_max_position_embeddings": arch.max_position_embeddings, **override}
    return replace(arch, rope_scaling=freeze_rope_scaling(scaling))


def context_length(arch: ArchConfig, requested: int | None, override: bool) -> int:
    """max_model_len: the request, or the length the model is meant to reach; a warning past it."""
    limit = context_limit(arch.rope_scaling_dict, arch.max_position_embeddings, override)
    if requested is None:
        return limit
    if requested > limit:
        how = "with this RoPE scaling" if override else "(--rope-scaling extends a model's context)"
        log.warning("max_model_len %d exceeds the %d tokens %s is meant to reach %s; quality past %d tokens "
                    "is not guaranteed", requested, limit, arch.architecture, how, limit)
    return requested
