"""How an embedding is read from the model's final (normed) hidden states [T, hidden] of one input: the last
token's (decoder embedding models: E5-Mistral, Qwen3-Embedding, GTE-Qwen; vLLM's default for a decoder), the
mean over the tokens, or the first token's (CLS). `--pooling auto` takes a sentence-transformers folder's
choice (`modules.json` naming a Pooling module, its `config.json`'s pooling_mode_*), else the last token."""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from ridgeline.errors import ModelLoadError

if TYPE_CHECKING:  # the flags' choices load without torch (serve --help)
    import torch

MODES = ("last", "mean", "cls")
SETTINGS = ("auto", *MODES)
_ST_KEYS = {"pooling_mode_lasttoken": "last", "pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls"}


def _sentence_transformers(folder: Path) -> str | None:
    """The pooling a sentence-transformers folder declares, or None (not such a folder)."""
    try:
        modules = json.loads((folder / "modules.json").read_text())
    except (OSError, ValueError):
        return None
    pooling = next((m for m in modules if isinstance(m, dict) and str(m.get("type", "")).endswith(".Pooling")), None)
    if pooling is None:
        return None
    try:
        cfg = json.loads((folder / str(pooling.get("path", "1_Pooling")) / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{folder}: modules.json names a Pooling module whose config.json cannot be read "
                             f"({e})") from None
    on = [mode for key, mode in _ST_KEYS.items() if cfg.get(key)]
    others = [k for k, v in cfg.items() if k.startswith("pooling_mode_") and v and k not in _ST_KEYS]
    if others or len(on) != 1:
        raise ModelLoadError(f"{folder}: the pooling this model was trained with ({', '.join(others + on) or 'none'}) "
                             f"is not one Ridgeline computes ({', '.join(MODES)}); pass --pooling to choose one")
    return on[0]


def pooling_of(setting: str, folder: str | Path | None) -> str:
    """The pooling mode for --pooling `setting` (auto: the folder's, else last)."""
    if setting != "auto":
        if setting not in MODES:
            raise ValueError(f"pooling: one of {', '.join(SETTINGS)}, got {setting!r}")
        return setting
    found = _sentence_transformers(Path(folder)) if folder is not None else None
    return found or "last"


def pool(hidden: torch.Tensor, mode: str) -> torch.Tensor:
    """hidden [T, H] -> [H] fp32."""
    if mode == "last":
        return hidden[-1].float()
    if mode == "cls":
        return hidden[0].float()
    return hidden.float().mean(dim=0)
