"""Where Ridgeline keeps pulled models and converted GGUF folders."""

from __future__ import annotations

import os
from pathlib import Path


def model_cache_dir() -> Path:
    """`$RIDGELINE_HOME` if set, else `~/.cache/ridgeline`; created on demand."""
    root = os.environ.get("RIDGELINE_HOME")
    path = Path(root).expanduser() if root else Path.home() / ".cache" / "ridgeline"
    path.mkdir(parents=True, exist_ok=True)
    return path
