"""A first start that takes seconds: the C kernels are built when the package installs (into the package,
loaded with no compiler on the path), a build for other sources or another CPU falls back to one compile
into the model cache (said on stderr), and `--version` / `--help` answer without loading torch."""
import os
import subprocess
import sys

import pytest

from ridgeline.kernels import build, cpu


def _python(code: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("argv", [["--version"], ["--help"], ["serve", "--help"], ["generate", "--help"],
                                  ["quantize", "--help"], ["train-draft", "--help"], ["advise", "--help"]])
def test_version_and_help_load_no_torch(argv):
    code = ("import sys\nfrom ridgeline.cli import main\ntry:\n    main(%r)\nexcept SystemExit:\n    pass\n"
            "print('loaded:', sorted(m for m in ('torch', 'numpy', 'fastapi', 'transformers') if m in sys.modules),"
            " file=sys.stderr)" % argv)
    proc = _python(code, dict(os.environ))
    assert "loaded: []" in proc.stderr, proc.stderr[-2000:]
    assert proc.stdout.strip(), proc.stderr[-2000:]  # it did answer


def test_the_installed_package_holds_this_cpus_kernels_and_needs_no_compiler(tmp_path):
    lib = build.packaged_library()
    assert lib is not None, (f"no build of these kernel sources for this CPU in {build.PACKAGED}: the install step "
                             "builds it (pip install -e .), or `python -m ridgeline.kernels.build` after editing them")
    env = {**os.environ, "PATH": str(tmp_path / "empty"), "CC": str(tmp_path / "no-cc"),
           "RIDGELINE_HOME": str(tmp_path / "home")}
    proc = _python("from ridgeline.kernels import cpu\nlib = cpu.lib()\nassert lib is not None, cpu.unavailable_reason()"
                   "\nprint(lib._name)", env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == str(lib) and "compiling" not in proc.stderr
    assert not (tmp_path / "home" / "kernels").exists()  # nothing compiled into the model cache


def test_without_a_packaged_build_the_kernels_compile_once_into_the_cache(tmp_path, monkeypatch, capsys):
    built, lib = [], build.packaged_library()
    if lib is None:
        pytest.skip("no packaged build to stand in for the compiler")

    def fake_compile(out, jobs=None):  # stands in for the compiler: the package's own build, copied
        built.append(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(lib.read_bytes())
        return out

    monkeypatch.setattr(build, "packaged_library", lambda: None)
    monkeypatch.setattr(build, "compile_library", fake_compile)
    monkeypatch.setenv("RIDGELINE_HOME", str(tmp_path / "home"))
    loaded = cpu._build()
    assert built == [tmp_path / "home" / "kernels" / lib.name] and loaded._name == str(built[0])
    assert "compiling the C kernels for this CPU" in capsys.readouterr().err
    cpu._build()  # the second start finds it: no second compile
    assert len(built) == 1


def test_the_key_names_the_sources_and_the_cpu(monkeypatch):
    k = build.key()
    monkeypatch.setattr(build, "cpu_flags", lambda: {"sse2"})
    assert build.key() != k and len(k) == 16
