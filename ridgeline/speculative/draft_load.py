"""Loading the `draft` proposer's model: a second model with the target's tokenizer (`draft_model`
a path, hub id or alias), or the target's own weights (`draft_model="self"`), quantized or not
(`draft_quantization`). It runs on the target's device with its own kernel plan and weight formats;
a draft that cannot stand in for the target (another vocabulary or tokenizer, a shorter context) is
an error at start-up."""
from __future__ import annotations

from pathlib import Path

from torch import nn

from ridgeline.config import SpeculativeConfig
from ridgeline.engine.proposal import DraftTarget
from ridgeline.errors import InvalidRequestError
from ridgeline.weights.hf_config import ArchConfig


def load_draft_model(config: SpeculativeConfig, target: DraftTarget, vocab_size: int) -> tuple[ArchConfig, nn.Module]:
    from ridgeline.layers.kernel_plan import choose_kernels
    from ridgeline.layers.weight_formats import DENSE
    from ridgeline.models.loader import build_model
    from ridgeline.layers.build_options import BuildOptions, layer_format_rules
    from ridgeline.models.registry import model_class
    from ridgeline.formats import options as quant_options
    from ridgeline.weights.hf_config import load_arch_config
    from ridgeline.models.resolve import resolve_model

    folder = target.folder if config.draft_model == "self" else resolve_model(config.draft_model,
                                                                                progress=target.progress)
    arch = load_arch_config(folder)
    model_class(arch.architecture)
    if folder != target.folder:
        _check_same_tokenizer(folder, target.folder, arch.vocab_size, vocab_size)
    if arch.max_position_embeddings < target.max_len:
        raise InvalidRequestError(f"draft model {config.draft_model!r} holds {arch.max_position_embeddings} positions, "
                                  f"fewer than the target's max_model_len {target.max_len}; lower --max-model-len",
                                  "draft_model")
    q = config.draft_quantization
    plan = choose_kernels(target.device, target.dtype, target.act_dtype)
    formats = layer_format_rules(quant_options.implied_rules(q),
                                 quant_options.format_name(q, None, False) or DENSE[target.dtype], plan)
    opts = BuildOptions(plan, target.dtype, target.act_dtype, target.attention_backend, formats)
    return arch, build_model(arch, folder, opts, target.device, target.max_len)


def _check_same_tokenizer(draft: Path, target: Path, draft_vocab: int, target_vocab: int) -> None:
    """Drafts are token ids the target verifies: both must read ids the same way."""
    from ridgeline.weights.tokenizer import Tokenizer
    if draft_vocab != target_vocab:
        raise InvalidRequestError(f"the draft model's vocabulary has {draft_vocab} tokens and the target's "
                                  f"{target_vocab}: a draft model must share the target's tokenizer", "draft_model")
    a, b = Tokenizer(draft), Tokenizer(target)
    if a._tok.get_vocab(with_added_tokens=True) != b._tok.get_vocab(with_added_tokens=True):
        raise InvalidRequestError("the draft model's tokenizer maps tokens to other ids than the target's: a draft "
                                  "model must share the target's tokenizer", "draft_model")
