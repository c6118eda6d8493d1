"""What the engine's start-up decides before it builds anything, and the lines it prints: each layer's
weight format (a GGUF file's kept blocks, a GPTQ / AWQ or fp8 folder's own format, or the dense dtype),
the tensor- and pipeline-parallel layout gathered from every rank, and the speculation line."""
from __future__ import annotations

from ridgeline.config import EngineConfig
from ridgeline.layers.build_options import layer_format_rules
from ridgeline.models.registry import model_class
from ridgeline.weights import fp8_checkpoint, mxfp4_checkpoint
from ridgeline.weights.quant_checkpoint import folder_quantization
from ridgeline.formats.options import GGUF_ONLY, implied_rules as quant_implied_rules


def weight_formats(mc, quantization: str, folder, gguf_file, arch, dense: str, plan):
    """(layer prefix -> weight format, the tensors to load or None for the folder's safetensors, the
    quantization applied: a GPTQ / AWQ folder's own method under auto or none)."""
    if quantization in GGUF_ONLY:
        from ridgeline.gguf.load import kept_blocks  # reads the file: the gguf package loads only here
        packed = model_class(arch.architecture).packed
        return *kept_blocks(gguf_file, arch, packed, mc.layer_formats, dense, plan, a8=quantization == "gguf-a8"), \
            quantization
    quant, fmt = folder_quantization(folder, quantization, mc.quant_group_size, mc.quant_symmetric)
    default, rules = fmt or dense, mc.layer_formats + quant_implied_rules(quant)
    # an explicit none dequantizes an fp8 checkpoint; the default (auto) keeps it
    ckpt = fp8_checkpoint.checkpoint_formats(folder, dense) if mc.quantization == "auto" else None
    if ckpt is not None:  # an fp8 checkpoint keeps its fp8 weights (another quantization re-quantizes them)
        default, rules = ckpt[0], rules + ckpt[1]
    mx = mxfp4_checkpoint.checkpoint_rules(folder) if mc.quantization == "auto" else ()
    if mx:  # an MXFP4 checkpoint keeps its experts' blocks (none decodes them to floats)
        rules, quant = rules + mx, "mxfp4 (checkpoint)"
    return layer_format_rules(rules, default, plan), None, quant


def spec_line(config: EngineConfig, proposer=None) -> str | None:
    sc = config.speculative
    if sc.method is None:
        return None
    extra = ""
    if "ngram" in sc.methods:
        extra += f", n-grams {sc.ngram_max}..{sc.ngram_min}"
    if "layer-skip" in sc.methods:
        extra += f", the target's first {sc.speculative_layers} layers"
    if {"draft", "eagle"} & set(sc.methods):
        extra += f", draft model {sc.draft_model or 'shipped for this model'}" + (
            f" ({sc.draft_quantization})" if sc.draft_quantization != "none" else "")
    if len(sc.methods) > 1:
        extra += ", each request drafted by the first of them that proposes"
    k = ("k chosen per step by the goodput controller" if sc.speculative_controller == "on" else "k pinned")
    how = proposer.summary() if proposer is not None else None
    extra += f" [{how}]" if how else ""
    return f"{sc.method}: up to {sc.num_speculative_tokens} proposed tokens per request per step ({k}){extra}"

