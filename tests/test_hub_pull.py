"""`ridgeline pull` / `--model` with hub ids (weights/hub_pull.py), against huggingface_hub's own offline cache
layout (models--org--repo/{refs,blobs,snapshots}), never the network: a GGUF picked by its quantization tag or
name, an HF folder, each file verified against its content hash, and clear errors for what cannot be picked."""
import hashlib
import os

import huggingface_hub.constants
import pytest

from ridgeline.cli import main
from ridgeline.errors import ModelLoadError
from ridgeline.weights import hub_pull

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _repo(hub, repo, files, lfs=()):
    root = hub / ("models--" + repo.replace("/", "--"))
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(COMMIT)
    (root / "blobs").mkdir()
    snap = root / "snapshots" / COMMIT
    snap.mkdir(parents=True)
    for name, data in files.items():
        key = hashlib.sha256(data).hexdigest() if name in lfs else hashlib.sha1(data).hexdigest()
        (root / "blobs" / key).write_bytes(data)
        os.symlink(os.path.join("..", "..", "blobs", key), snap / name)
    return root


@pytest.fixture
def hub(tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("RIDGELINE_HOME", str(tmp_path / "home"))
    ggufs = {"tiny-Q4_K_M.gguf": b"GGUF q4km", "tiny-Q8_0.gguf": b"GGUF q8", "tiny-Q4_K_S.gguf": b"GGUF q4ks"}
    _repo(cache, "org/tiny-GGUF", {**ggufs, "README.md": b"# tiny"}, lfs=set(ggufs))
    _repo(cache, "org/tiny", {"config.json": b"{}", "tokenizer.json": b"{}", "model.safetensors": b"weights"},
          lfs={"model.safetensors"})
    return cache


def test_gguf_by_tag_and_by_name(hub):
    assert hub_pull.pull_hub("org/tiny-GGUF:Q4_K_M").read_bytes() == b"GGUF q4km"
    assert hub_pull.pull_hub("org/tiny-GGUF:q8_0").read_bytes() == b"GGUF q8"  # tags match in any case
    assert hub_pull.pull_hub("org/tiny-GGUF:tiny-Q4_K_S.gguf").read_bytes() == b"GGUF q4ks"
    assert hub_pull.pull_hub("org/tiny-GGUF/tiny-Q8_0.gguf").read_bytes() == b"GGUF q8"
    with pytest.raises(ModelLoadError, match="no GGUF file tagged 'Q5_K_M'.*tiny-Q4_K_M.gguf"):
        hub_pull.pull_hub("org/tiny-GGUF:Q5_K_M")
    with pytest.raises(ModelLoadError, match="no file 'other.gguf'"):
        hub_pull.pull_hub("org/tiny-GGUF:other.gguf")
    with pytest.raises(ModelLoadError, match="not in the hub cache"):
        hub_pull.pull_hub("org/absent:Q4_K_M")


def test_an_ambiguous_tag_asks_for_the_file(hub):
    _repo(hub, "org/two", {"a-Q4_0.gguf": b"a", "b-Q4_0.gguf": b"b"}, lfs={"a-Q4_0.gguf", "b-Q4_0.gguf"})
    with pytest.raises(ModelLoadError, match="matches a-Q4_0.gguf, b-Q4_0.gguf; name the file"):
        hub_pull.pull_hub("org/two:Q4_0")


def test_a_damaged_blob_is_refused(hub):
    blob = next((hub / "models--org--tiny-GGUF" / "blobs").glob(hashlib.sha256(b"GGUF q8").hexdigest()))
    blob.write_bytes(b"GGUF q8 but damaged")
    with pytest.raises(ModelLoadError, match="tiny-Q8_0.gguf: sha256 .* does not match"):
        hub_pull.pull_hub("org/tiny-GGUF:Q8_0")
    with pytest.raises(ModelLoadError, match="bytes, the hub says 3"):
        hub_pull.verify(hub_pull.pull_hub("org/tiny-GGUF:Q4_K_M"), size=3)


def test_an_hf_folder_through_the_cli(hub, capsys):
    assert main(["pull", "org/tiny"]) in (0, None)
    out = capsys.readouterr().out
    assert out.startswith("org/tiny: ") and COMMIT in out and "converted" not in out
    with pytest.raises(ModelLoadError, match="has no config.json; for a GGUF repo name the file or tag"):
        hub_pull.pull_hub("org/tiny-GGUF")
    assert hub_pull.is_hub_spec("org/tiny:Q4_K_M") and not hub_pull.is_hub_spec("smollm2-135m")


def test_model_specs_resolve_through_the_hub_cache(hub, monkeypatch):
    from ridgeline.models import resolve
    seen, hashed = [], []
    monkeypatch.setattr(resolve, "ensure_converted", lambda p, progress: seen.append(p) or p.parent)
    monkeypatch.setattr(hub_pull, "sha256_of", lambda p: hashed.append(p) or hashlib.sha256(p.read_bytes()).hexdigest())
    for spec in ("org/tiny-GGUF:Q4_K_M", "org/tiny-GGUF/tiny-Q4_K_M.gguf"):
        folder, gguf = resolve.resolve_model_source(spec, progress=False)
        assert gguf.read_bytes() == b"GGUF q4km" and folder == gguf.parent
    assert hashed == []  # a file already in the cache is not hashed again at every start
    hub_pull.pull_hub("org/tiny-GGUF:Q4_K_M")
    assert len(hashed) == 1  # `ridgeline pull` verifies it
    with pytest.raises(ModelLoadError, match="GGUF file .*missing.gguf does not exist"):
        resolve.resolve_model_source("missing.gguf")  # a plain file name stays a local path
