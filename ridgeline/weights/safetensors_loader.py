"""Read a Hugging Face folder's safetensors weights (single file or sharded with an index)."""
from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from safetensors import safe_open

from ridgeline.errors import ModelLoadError


def weight_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.exists():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (json.JSONDecodeError, KeyError) as e:
            raise ModelLoadError(f"{index} is not a valid safetensors index: {e}") from None
        files = [folder / n for n in names]
        missing = [str(f) for f in files if not f.exists()]
        if missing:
            raise ModelLoadError(f"weight files named in {index.name} are missing: {', '.join(missing)}")
        return files
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"no *.safetensors weights in {folder}")
    return files


def iter_tensors(folder: Path, skip: Callable[[str], bool] | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """skip(name) True: that tensor is not read at all (another rank's expert)."""
    for path in weight_files(folder):
        try:
            with safe_open(str(path), framework="pt") as f:
                for name in f.keys():
                    if skip is None or not skip(name):
                        yield name, f.get_tensor(name)
        except Exception as e:  # safetensors raises several types for a damaged header/body
            if isinstance(e, ModelLoadError):
                raise
            raise ModelLoadError(f"cannot read weights from {path} (missing, truncated or damaged?): {e}") from None
