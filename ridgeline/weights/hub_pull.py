"""`ridgeline pull` for Hugging Face hub ids, through `huggingface_hub` (its cache, its offline mode):

    org/repo               the repo's config, tokenizer and safetensors (an HF folder)
    org/repo:Q4_K_M        the one GGUF file of the repo whose name carries that quantization tag
    org/repo:file.gguf     that file (also org/repo/file.gguf)

The cached copy is used when the hub is unreachable (or HF_HUB_OFFLINE=1). Every file is verified against what
the hub recorded: a file kept by content hash (LFS: weights, GGUF) must have that sha256, and, when the hub is
reachable, the size and sha256 its metadata gives."""
from __future__ import annotations

import re
from pathlib import Path

from ridgeline.errors import ModelLoadError
from ridgeline.weights.pull import sha256_of

HUB_SPEC = re.compile(r"(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+?)(?:(?::|/)(?P<pick>[\w.+-]+))?")
FOLDER_PATTERNS = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt"]
_SHA256 = re.compile(r"[0-9a-f]{64}")


def is_hub_spec(spec: str) -> bool:
    return not Path(spec).expanduser().exists() and HUB_SPEC.fullmatch(spec) is not None


def _hub():
    try:
        import huggingface_hub
    except ImportError:  # pragma: no cover: a declared dependency
        raise ModelLoadError("huggingface_hub is not installed; pull needs it for hub ids") from None
    return huggingface_hub


def verify(path: Path, size: int | None = None, sha256: str | None = None) -> None:
    """A cached file against its content hash (the hub cache names an LFS blob by its sha256) and, where given,
    the hub's size and sha256. A mismatch is an error naming the file (the damaged copy stays in the hub cache
    for the user to remove, as the error says)."""
    blob = path.resolve()
    if size is not None and blob.stat().st_size != size:
        raise ModelLoadError(f"{path.name}: {blob.stat().st_size} bytes, the hub says {size}")
    want = sha256 or (blob.name if _SHA256.fullmatch(blob.name) else None)
    got = sha256_of(blob) if want is not None else None
    if got != want:
        raise ModelLoadError(f"{path.name}: sha256 {got} does not match {want} (a damaged download; "
                             "remove it from the hub cache and pull again)")


def _remote_files(hub, repo: str) -> dict[str, tuple[int | None, str | None]] | None:
    """name -> (size, sha256 for LFS files) from the hub, or None when it cannot be reached."""
    try:
        info = hub.model_info(repo, files_metadata=True, timeout=10)
    except Exception:
        return None
    return {s.rfilename: (s.size, getattr(s.lfs, "sha256", None) if s.lfs is not None else None)
            for s in info.siblings or ()}


def _local_files(hub, repo: str) -> list[str]:
    try:
        folder = Path(hub.snapshot_download(repo, local_files_only=True))
    except Exception:
        return []
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() or p.is_symlink())


def _pick_gguf(repo: str, pick: str, names: list[str]) -> str:
    ggufs = [n for n in names if n.lower().endswith(".gguf")]
    if pick.lower().endswith(".gguf"):
        if pick in ggufs or any(n.endswith("/" + pick) for n in ggufs):
            return next(n for n in ggufs if n == pick or n.endswith("/" + pick))
        raise ModelLoadError(f"{repo} has no file {pick!r}; its GGUF files: {', '.join(ggufs) or 'none'}")
    tag = re.compile(rf"(?<![A-Za-z0-9]){re.escape(pick)}(?![A-Za-z0-9])", re.IGNORECASE)
    hits = [n for n in ggufs if tag.search(Path(n).name) and "-of-" not in n]
    if len(hits) == 1:
        return hits[0]
    if not hits:
        raise ModelLoadError(f"{repo} has no GGUF file tagged {pick!r}; its GGUF files: {', '.join(ggufs) or 'none'}")
    raise ModelLoadError(f"{repo}: {pick!r} matches {', '.join(hits)}; name the file (org/repo:FILE.gguf)")


def pull_hub(spec: str, verify_cached: bool = True) -> Path:
    """A hub spec (above) -> the local GGUF file or HF folder, fetched into the hub cache once and verified.
    verify_cached False (a model resolved at start-up): a GGUF file already in the cache is not hashed again."""
    m = HUB_SPEC.fullmatch(spec)
    if m is None:
        raise ModelLoadError(f"{spec!r} is not a hub id (org/repo, org/repo:QUANT, org/repo:FILE.gguf)")
    hub, repo, pick = _hub(), m["repo"], m["pick"]
    remote = _remote_files(hub, repo)
    if pick is None:
        try:
            folder = Path(hub.snapshot_download(repo, allow_patterns=FOLDER_PATTERNS,
                                                local_files_only=remote is None))
        except Exception as e:
            raise _unreachable(repo, e) from None
        if not (folder / "config.json").is_file():
            raise ModelLoadError(f"{repo} has no config.json; for a GGUF repo name the file or tag (org/repo:Q4_K_M)")
        for p in sorted(folder.rglob("*")):
            if p.is_file():
                size, sha = (remote or {}).get(str(p.relative_to(folder)), (None, None))
                verify(p, size, sha)
        return folder
    names = sorted(remote) if remote is not None else _local_files(hub, repo)
    if not names:
        raise _unreachable(repo, None)
    name = _pick_gguf(repo, pick, names)
    cached = isinstance(hub.try_to_load_from_cache(repo, name), str)
    try:
        path = Path(hub.hf_hub_download(repo, name, local_files_only=remote is None))
    except Exception as e:
        raise _unreachable(repo, e) from None
    if verify_cached or not cached:
        size, sha = (remote or {}).get(name, (None, None))
        verify(path, size, sha)
    return path


def _unreachable(repo: str, e: Exception | None) -> ModelLoadError:
    why = f" ({type(e).__name__}: {str(e)[:200]})" if e is not None else ""
    return ModelLoadError(f"could not fetch {repo!r} from the Hugging Face hub and it is not in the hub cache{why}; "
                          "download it where the hub is reachable, or give a local folder or .gguf path")
