"""An EAGLE head's folder: `config.json` (the head's shape, the target it was trained for, how it was
trained) and `head.safetensors` (its weights, and `vocab_ids` when it drafts over a reduced
vocabulary). The target is named by architecture, hidden size, vocabulary, layer count and a hash of
its embedding table (rounded to bf16, so an fp32 and a bf16 load of the same checkpoint agree): a
head loaded against another model is an error at start-up, never a silent run of useless drafts."""
from __future__ import annotations

import hashlib
import json
from importlib import resources
from pathlib import Path

import torch
from torch import nn

from ridgeline.errors import InvalidRequestError
from ridgeline.speculative.eagle_head import EagleHead, HeadConfig

FORMAT = "ridgeline-eagle-1"


def target_fingerprint(lm: nn.Module) -> dict:
    """lm: a loaded LlamaForCausalLM-like model (cfg, model.embed_tokens)."""
    cfg, emb = lm.cfg, lm.model.embed_tokens.weight
    bits = emb.detach().to("cpu", torch.float32).to(torch.bfloat16).view(torch.int16).contiguous()  # any device
    digest = hashlib.sha256(bits.numpy()).hexdigest()
    return {"architecture": cfg.architecture, "hidden_size": cfg.hidden_size, "vocab_size": cfg.vocab_size,
            "num_layers": cfg.num_layers, "embedding_sha256": digest}


def head_config_for(lm: nn.Module, intermediate_size: int | None = None) -> HeadConfig:
    cfg = lm.cfg
    return HeadConfig(cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                      intermediate_size or cfg.intermediate_size, cfg.rms_norm_eps, cfg.rope_theta)


def head_rows(lm: nn.Module, vocab_ids: torch.Tensor | None) -> torch.Tensor | None:
    """The target's LM head rows for vocab_ids, fp32 [len(ids), H]; None for the whole vocabulary
    (the head then calls the target's own compute_logits). A head tied to the embedding reads it; any
    other (repacked, quantized) is read back through itself: logits of the unit vectors."""
    if vocab_ids is None:
        return None
    dev = lm.model.embed_tokens.weight.device  # the rows come back on vocab_ids' device
    if lm.ties_head:
        return lm.model.embed_tokens.weight.detach()[vocab_ids.to(dev)].float().to(vocab_ids.device).contiguous()
    with torch.inference_mode():
        eye = torch.eye(lm.cfg.hidden_size, dtype=lm.model.act_dtype, device=dev)
        cols = lm.compute_logits(eye)[:, vocab_ids.to(dev)]  # [H, len(ids)]: column i is row i of the head
    return cols.T.float().to(vocab_ids.device).clone()


def save_head(folder: Path, head: EagleHead, target: dict, vocab_ids: torch.Tensor | None, training: dict,
              dtype: torch.dtype = torch.bfloat16) -> None:
    from safetensors.torch import save_file
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to(dtype).contiguous() for k, v in head.state_dict().items()}
    if vocab_ids is not None:
        tensors["vocab_ids"] = vocab_ids.to(torch.int64).contiguous()
    save_file(tensors, str(folder / "head.safetensors"))
    (folder / "config.json").write_text(json.dumps(
        {"format": FORMAT, "head": head.cfg.to_dict(), "target": target, "training": training}, indent=2) + "\n")


def shipped_head(lm: nn.Module) -> Path | None:
    """The folder under ridgeline/speculative/heads/ of a head trained for this target, if one is shipped."""
    heads = resources.files("ridgeline.speculative") / "heads"
    if not heads.is_dir():
        return None
    mine = None
    for folder in sorted(heads.iterdir(), key=lambda f: f.name):
        path = folder / "config.json"
        if not path.is_file():
            continue
        theirs = json.loads(path.read_text()).get("target", {})
        if all(theirs.get(k) == getattr(lm.cfg, k, None) for k in ("architecture", "hidden_size", "vocab_size",
                                                                     "num_layers")):
            mine = mine or target_fingerprint(lm)  # the embedding hash only for plausible heads
            if theirs == mine:
                return Path(str(folder))
    return None


def load_head(folder: str | Path | None, lm: nn.Module) -> tuple[EagleHead, torch.Tensor | None, dict]:
    """-> (the head in fp32, eval mode; vocab_ids or None; its config). folder None: the head shipped
    for this target. Refuses a head trained for another target."""
    from safetensors.torch import load_file
    if folder is None:
        folder = shipped_head(lm)
        if folder is None:
            raise InvalidRequestError("speculative_method 'eagle' needs draft_model (a head trained for the target "
                                      "by `ridgeline train-draft`): no head is shipped for this model", "draft_model")
    folder = Path(folder)
    path = folder / "config.json"
    if not path.is_file() or not (folder / "head.safetensors").is_file():
        raise InvalidRequestError(f"{folder} is not an EAGLE head folder (config.json and head.safetensors, as "
                                  "`ridgeline train-draft` writes)", "draft_model")
    config = json.loads(path.read_text())
    if config.get("format") != FORMAT:
        raise InvalidRequestError(f"{folder}: unknown head format {config.get('format')!r}", "draft_model")
    mine = target_fingerprint(lm)
    theirs = config["target"]
    diff = [k for k in mine if theirs.get(k) != mine[k]]
    if diff:
        raise InvalidRequestError(f"the EAGLE head in {folder} was trained for another model (it differs in "
                                  f"{', '.join(diff)}): train one for this model with `ridgeline train-draft`",
                                  "draft_model")
    tensors = load_file(str(folder / "head.safetensors"))
    vocab_ids = tensors.pop("vocab_ids", None)
    head = EagleHead(HeadConfig(**config["head"]))
    head.load_state_dict({k: v.float() for k, v in tensors.items()})
    return head.eval(), vocab_ids, config
