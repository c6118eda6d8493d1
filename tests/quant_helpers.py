"""Helpers of the GPTQ / AWQ tests: a tiny model with salient channels, a layer's loaded int4 values."""
from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ridgeline.layers.kernel_plan import TORCH_ONLY
from ridgeline.layers.linear import Linear
from ridgeline.models.loader import build_model
from ridgeline.layers.build_options import BuildOptions, layer_format_rules
from ridgeline.weights.quant_checkpoint import folder_quantization
from ridgeline.formats.options import implied_rules
from ridgeline.weights.hf_config import load_arch_config
from conftest import make_tiny_model


def salient_model(folder: Path, seed: int = 0) -> Path:
    """A tiny llama (hidden 128, intermediate 256, 2 layers) whose norms give a few input channels 10x
    the others, as trained models' do: the activations AWQ and GPTQ exploit."""
    make_tiny_model(folder, "llama", seed=seed, hidden_size=128, intermediate_size=256)
    path = folder / "model.safetensors"
    t = load_file(str(path))
    g = torch.Generator().manual_seed(seed)
    for name in t:
        if name.endswith("layernorm.weight"):
            t[name] = t[name] * torch.where(torch.rand(128, generator=g) < 0.06, 10.0, 1.0)
    save_file(t, str(path), metadata={"format": "pt"})
    return folder


def torch_only_model(folder: Path, quantization: str = "none"):
    """The folder built with torch's path (no kernels): a quantized Linear keeps its rtn.Int4Tensor."""
    cfg = load_arch_config(folder)
    quant, fmt = folder_quantization(folder, quantization, None, False)
    formats = layer_format_rules(implied_rules(quant), fmt or "f32", TORCH_ONLY)
    return build_model(cfg, folder, BuildOptions(TORCH_ONLY, torch.float32, torch.float32, "auto", formats),
                       torch.device("cpu"), 64)


def loaded_weight(layer: Linear) -> torch.Tensor:
    """[N, K] float32 the layer multiplies by, input columns in checkpoint order."""
    w = layer.quant.dequantize()
    if getattr(layer, "perm", None) is not None:
        w = w[:, torch.argsort(layer.perm)]
    return w
