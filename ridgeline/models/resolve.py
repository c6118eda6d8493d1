"""Resolve a model spec (local HF folder, .gguf file, built-in alias, hub id) to a HF-format folder."""
from __future__ import annotations

import re
from pathlib import Path

from ridgeline.errors import ModelLoadError

HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")  # owner/name on the Hugging Face hub


def resolve_model(spec: str, progress: bool = True) -> Path:
    return resolve_model_source(spec, progress)[0]


def resolve_model_source(spec: str, progress: bool = True) -> tuple[Path, Path | None]:
    """(HF-format folder, the .gguf file it was converted from or None): a GGUF model's blocks can be
    loaded from the file itself (`--quantization gguf`) while config and tokenizer come from the folder."""
    from ridgeline.weights.pull import ALIASES, pull

    path = Path(spec).expanduser()
    gguf = None
    if path.is_dir():
        if not (path / "config.json").exists():
            ggufs = sorted(path.glob("*.gguf"))
            if len(ggufs) != 1:
                raise ModelLoadError(f"{path} has no config.json (a Hugging Face folder needs one)")
            gguf = ggufs[0]
        else:
            return path, None
    elif _hub_pick(spec):  # org/repo:Q4_K_M, org/repo:FILE.gguf, org/repo/FILE.gguf
        from ridgeline.weights.hub_pull import pull_hub
        gguf = pull_hub(spec, verify_cached=False)  # `ridgeline pull` verifies; a start-up does not re-hash
    elif spec.endswith(".gguf"):
        if not path.exists():
            raise ModelLoadError(f"GGUF file {path} does not exist")
        gguf = path
    elif spec in ALIASES:
        gguf = pull(spec, progress=progress)
    if gguf is not None:
        folder = ensure_converted(gguf, progress=progress)
        from ridgeline.weights.in_use import mark
        mark(folder, gguf)  # `ridgeline rm` refuses what a live process holds
        return folder, gguf
    if HUB_ID.fullmatch(spec) and not path.exists():
        return _from_hub(spec), None
    raise ModelLoadError(
        f"cannot resolve model {spec!r}: not a folder, not a .gguf file, not a hub id, and not a "
        f"built-in alias (known aliases: {', '.join(sorted(ALIASES))})"
    )


def _hub_pick(spec: str) -> bool:
    """A hub id naming one GGUF file of its repo (not a local path)."""
    from ridgeline.weights.hub_pull import HUB_SPEC
    m = HUB_SPEC.fullmatch(spec)
    return m is not None and m["pick"] is not None and not Path(spec).expanduser().exists()


def ensure_converted(path: Path, progress: bool) -> Path:
    from ridgeline.gguf.convert import ensure_converted as convert  # gguf is imported only here
    return convert(path, progress=progress)


def _from_hub(repo_id: str) -> Path:
    try:
        from huggingface_hub import snapshot_download
    except ImportError:  # pragma: no cover
        raise ModelLoadError("huggingface_hub is not installed; give a local folder or .gguf path") from None
    patterns = ["*.json", "*.safetensors", "tokenizer*"]
    try:
        return Path(snapshot_download(repo_id, allow_patterns=patterns, local_files_only=True))
    except Exception:
        pass
    try:
        import huggingface_hub.constants as c

        c.HF_HUB_ETAG_TIMEOUT = 5
        c.HF_HUB_DOWNLOAD_TIMEOUT = 10
        return Path(snapshot_download(repo_id, allow_patterns=patterns, etag_timeout=5))
    except Exception as e:
        raise ModelLoadError(
            f"could not fetch {repo_id!r} from the Hugging Face hub ({type(e).__name__}: {str(e)[:200]}). "
            "If the hub is unreachable, download the model elsewhere and pass its local folder "
            "(config.json + *.safetensors + tokenizer.json) or a .gguf file path to --model."
        ) from None
