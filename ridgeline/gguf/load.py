"""What a GGUF model hands model construction: under `--quantization gguf` a format per layer from the
file's tensor types and the file's tensors (quantized matrices as blocks); under any other quantization
the file's tensors decoded to float32 one at a time, for the layers' formats to take as a checkpoint's.
Either way the weights are read from the file in place (the converted folder holds none)."""
from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from ridgeline.gguf.blocks import GGUFBlocks, iter_gguf_tensors, tensor_types
from ridgeline.gguf.kept import gguf_format_rules, layer_types
from ridgeline.gguf.reader import read_gguf
from ridgeline.layers.kernel_plan import KernelPlan
from ridgeline.layers.weight_formats import WeightFormat
from ridgeline.weights.hf_config import ArchConfig


def kept_blocks(path: Path, arch: ArchConfig, packed: dict, rules: Sequence[tuple[str, str]], dense: str,
                plan: KernelPlan, a8: bool = False) -> tuple[Callable[[str], WeightFormat], Iterator]:
    """(prefix -> format, (name, tensor or blocks) iterator); the file is closed once the iterator ends.
    packed: the model class's fused projections (checkpoint name -> (fused name, shard)); a8: the blocks
    against int8 activations (`gguf-a8`)."""
    g = read_gguf(path)
    per_layer = layer_types(tensor_types(g), packed, arch.tie_word_embeddings)
    return gguf_format_rules(rules, per_layer, dense, plan, a8), _tensors(g, arch)


def dequantized_tensors(path: Path, arch: ArchConfig, skip: Callable[[str], bool] | None = None) -> Iterator:
    """(HF name, float32 tensor) for every tensor of the file, decoded one at a time as it is loaded:
    the values the converted folder's float32 safetensors would hold, without writing them. skip(name)
    True: that tensor is not decoded (another rank's expert, another stage's layer)."""
    g = read_gguf(path)
    for name, t in _tensors(g, arch):
        if skip is None or not skip(name):
            yield name, t.dequantize() if isinstance(t, GGUFBlocks) else t


def _tensors(g, arch: ArchConfig) -> Iterator:
    try:
        yield from iter_gguf_tensors(g, arch)
    finally:
        g.close()
