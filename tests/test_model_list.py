"""`ridgeline list` shows what the model cache holds (pulled aliases, converted GGUF folders and whether their
source is still there), `ridgeline rm` removes an alias with its converted folders, and never anything else."""
import json

from ridgeline.cli import main
from ridgeline.weights.pull import ALIASES, alias_path


def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RIDGELINE_HOME", str(tmp_path / "home"))
    gguf = alias_path("smollm2-135m")
    gguf.parent.mkdir(parents=True, exist_ok=True)
    gguf.write_bytes(b"GGUF" + b"\0" * 1000)
    root = gguf.parent.parent
    for name, source in (("a-1", gguf), ("b-2", tmp_path / "gone.gguf")):
        folder = root / "converted" / name
        folder.mkdir(parents=True)
        (folder / "gguf-source.json").write_text(json.dumps({"gguf": str(source), "size": 1, "mtime_ns": 1}))
        (folder / "config.json").write_text("{}")
    outside = tmp_path / "keep.gguf"
    outside.write_bytes(b"x")
    return gguf, root, outside


def test_list_and_rm(tmp_path, monkeypatch, capsys):
    gguf, root, outside = _cache(tmp_path, monkeypatch)
    assert main(["list"]) in (0, None)
    out = capsys.readouterr().out
    assert "smollm2-135m" in out and "pulled" in out and ALIASES["smollm2-135m"].description in out
    assert out.count(" converted ") == 2 and "gone.gguf" in out and "source missing" in out
    assert main(["rm", "smollm2-135m"]) in (0, None)
    removed = capsys.readouterr().out
    assert str(gguf) in removed and "a-1" in removed and "b-2" not in removed
    assert not gguf.exists() and not (root / "converted" / "a-1").exists() and (root / "converted" / "b-2").exists()
    assert main(["rm", "gone.gguf"]) in (0, None) and not (root / "converted" / "b-2").exists()
    assert outside.exists()  # a converted folder's source outside the cache is never touched
    assert main(["rm", "nothing-like-it"]) == 2
    assert "no cached model 'nothing-like-it'" in capsys.readouterr().err
    assert main(["list"]) in (0, None) and "is empty" in capsys.readouterr().out


def test_rm_refuses_a_model_a_live_process_holds(tmp_path, monkeypatch, capsys):
    """A process that resolved a model out of the cache holds it (in-use/<pid>.json): `rm` refuses it, naming the
    pid, until that process is gone or --force is given; a stale record (a dead pid) holds nothing."""
    import os
    import subprocess
    import sys

    from ridgeline.weights import in_use
    from ridgeline.weights.cache_dir import model_cache_dir

    gguf, root, outside = _cache(tmp_path, monkeypatch)
    folder = root / "converted" / "a-1"
    in_use.mark(folder, gguf, outside)  # this process: its own record, never a holder of itself
    own = json.loads((model_cache_dir() / "in-use" / f"{os.getpid()}.json").read_text())["paths"]
    assert str(outside.resolve()) not in own and str(gguf.resolve()) in own  # only the cache's paths
    assert in_use.holders(gguf) == []
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    try:
        for pid in (live.pid, dead.pid):
            (model_cache_dir() / "in-use" / f"{pid}.json").write_text(json.dumps({"pid": pid, "paths": own}))
        assert in_use.holders(gguf) == [live.pid] and in_use.holders(folder) == [live.pid]
        assert main(["list"]) in (0, None) and capsys.readouterr().out.count(f"in use by process {live.pid}") == 2
        assert main(["rm", "smollm2-135m"]) == 2
        err = capsys.readouterr().err
        assert f"in use by process {live.pid}" in err and "--force" in err
        assert gguf.exists() and folder.exists()  # nothing removed
        assert main(["rm", "gone.gguf"]) in (0, None)  # a model nobody holds goes
        live.kill()
        live.wait()
        assert in_use.holders(gguf) == []  # its process gone: the record is stale
        (model_cache_dir() / "in-use" / "1.json").write_text(json.dumps({"pid": 1, "paths": own}))  # init: alive
        assert in_use.holders(gguf) == [1] and main(["rm", "smollm2-135m"]) == 2
        capsys.readouterr()
        assert main(["rm", "--force", "smollm2-135m"]) in (0, None) and not gguf.exists()
    finally:
        live.kill()
