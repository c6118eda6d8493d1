"""The placeholder a pipeline stage builds for a layer another stage holds: no weights, never run; it
keeps the layer numbering (and the C stack's rows) of the whole model."""
from __future__ import annotations

from torch import nn


class Elsewhere(nn.Module):
    """A layer another pipeline stage holds."""

    def __init__(self, index: int):
        super().__init__()
        self.index = index
