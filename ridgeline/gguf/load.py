"""What `--quantization gguf` hands model construction: a format per layer from the file's tensor
types, and the file's tensors (quantized matrices as blocks) to load in place of the converted folder's."""
from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from ridgeline.gguf.blocks import iter_gguf_tensors, tensor_types
from ridgeline.gguf.kept import gguf_format_rules, layer_types
from ridgeline.gguf.reader import read_gguf
from ridgeline.layers.kernel_plan import KernelPlan
from ridgeline.layers.weight_formats import WeightFormat
from ridgeline.weights.hf_config import ArchConfig


def kept_blocks(path: Path, arch: ArchConfig, packed: dict, rules: Sequence[tuple[str, str]], dense: str,
                plan: KernelPlan) -> tuple[Callable[[str], WeightFormat], Iterator]:
    """(prefix -> format, (name, tensor or blocks) iterator); the file is closed once the iterator ends.
    packed: the model class's fused projections (checkpoint name -> (fused name, shard))."""
    g = read_gguf(path)
    per_layer = layer_types(tensor_types(g), packed, arch.tie_word_embeddings)
    return gguf_format_rules(rules, per_layer, dense, plan), _tensors(g, arch)


def _tensors(g, arch: ArchConfig) -> Iterator:
    try:
        yield from iter_gguf_tensors(g, arch)
    finally:
        g.close()
