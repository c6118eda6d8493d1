"""LoRA adapters over any base weight format (a feature: it plugs into the core through the runner's
`deltas` seam and ForwardContext.delta, never the other way round). request.py: what a caller names;
peft_files.py: a PEFT folder read and checked against the model before any tensor data is read;
adapter.py: its tensors mapped onto the model's Linears; manager.py: the adapters an engine holds and
each step's per-row additions."""
from ridgeline.lora.request import LoRARequest

__all__ = ["LoRARequest"]
