"""Model architectures keyed by the HF `architectures` name: every supported one is the one decoder
class, its differences declared per family (weights/families.py) and per layer (models/layer_spec.py)."""
from __future__ import annotations

from torch import nn

from ridgeline.errors import UnsupportedArchitectureError
from ridgeline.models.llama import LlamaForCausalLM
from ridgeline.weights.families import FAMILIES, NOT_YET

ARCHITECTURES: dict[str, type[nn.Module]] = {name: LlamaForCausalLM for name in FAMILIES}


def model_class(architecture: str) -> type[nn.Module]:
    try:
        return ARCHITECTURES[architecture]
    except KeyError:
        why = f" ({NOT_YET[architecture]} is not supported yet)" if architecture in NOT_YET else ""
        raise UnsupportedArchitectureError(
            f"architecture {architecture!r} is not supported{why}; supported: {', '.join(sorted(ARCHITECTURES))}"
        ) from None
