"""The layer contract (docs: design/layers), checked on every import in the package, at module level
and inside functions: core imports only core; a feature imports the core (and itself); a tool
imports the core, features and tools; entry points import anything. An arrow between two features
runs through a seam the design page lists. Shown failing on a planted upward import.

PENDING lists the arrows that still break the contract, each with where it is to go: the test fails
on any arrow not listed, and on a listed one that no longer exists (so the list only shrinks)."""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "ridgeline"
CORE, FEATURE, TOOL, ENTRY = 0, 1, 2, 3
LAYERS = {
    # core: the engine and what it is made of, the weight and KV formats, config, plans
    **dict.fromkeys(["engine", "runner", "models", "layers", "kernels", "weights", "gguf", "formats", "config",
                     "step_plan", "kv_spec", "errors", "inputs", "sampling_params", "utils", "cli_parser", "version",
                     "http"], CORE),
    # features: plug into the core through its seams
    **dict.fromkeys(["speculative", "distributed", "disagg", "router", "quant"], FEATURE),
    **dict.fromkeys(["bench", "advisor", "eval", "cache_report"], TOOL),
    **dict.fromkeys(["cli", "__main__", "serve", "entrypoints", "__init__"], ENTRY),
}
NAMES = {CORE: "core", FEATURE: "feature", TOOL: "tool", ENTRY: "entry point"}
# feature -> feature arrows through a declared seam (the design page lists each with its reason)
SEAMS: set[tuple[str, str]] = set()
# arrows that break the contract today, (from, to): what moves where to end each
PENDING = {
    ("config", "quant"): "quant/options.py (format names) moves into the core's formats",
    ("engine", "distributed"): "the parallel runtime becomes a registry the distributed package fills",
    ("engine", "quant"): "formats and checkpoint detection move into the core's formats; K-center calibration "
                         "becomes a KV-format hook",
    ("gguf", "quant"): "the kept-block formats build on the core's formats",
    ("kernels", "quant"): "the Triton kernel reads its layouts from the core's formats",
    ("layers", "distributed"): "expert parallelism's dispatch enters SparseMoE through a core interface",
    ("layers", "quant"): "the KV quantization formats move into the core",
    ("models", "quant"): "GGUF kept-block loading and formats move into the core",
    ("quant", "entrypoints"): "calibration runs the model through the runner's public interface, not LLM",
    ("quant", "eval"): "the held-out text moves into the core's data (eval and quant both read it)",
    ("speculative", "entrypoints"): "train-draft runs through the engine, its CLI moves to the entry points",
    ("speculative", "quant"): "the draft head's int4/int8 packing uses the core's formats",
    ("advisor", "__init__"): "the advisor's measured validations drive LLMEngine, not the offline API",
    ("bench", "cli"): "the benchmarks take the engine's flags from the core's option table, not the CLI",
    ("bench", "entrypoints"): "the benchmarks drive LLMEngine, not the offline API",
    ("bench", "serve"): "the serving benchmark starts servers as processes only",
    ("cache_report", "serve"): "the request log's reader moves beside its writer, below the entry points",
    ("eval", "cli"): "eval takes the engine's flags from the core's option table, not the CLI",
    ("eval", "entrypoints"): "eval drives LLMEngine, not the offline API",
}


def _layer(name: str) -> str:
    return name if name in LAYERS else "?"


def imports(root: Path = ROOT) -> dict[tuple[str, str], list[str]]:
    """(from package, to package) -> 'file:line' of every import between two top-level parts of the
    package (a subpackage, or a module directly under it), at module level or inside a function."""
    out: dict[tuple[str, str], list[str]] = defaultdict(list)
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        src = rel.parts[0].removesuffix(".py")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names] * (node.module == root.name)
            else:
                continue
            for t in targets:
                parts = t.split(".")
                if parts[0] != root.name or len(parts) < 2:
                    continue
                dst = parts[1] if (root / parts[1]).is_dir() or (root / f"{parts[1]}.py").is_file() else "__init__"
                if dst != src:
                    out[(src, dst)].append(f"{rel}:{node.lineno}")
    return out


def violations(edges) -> dict[tuple[str, str], str]:
    """Arrows that break the contract, with why."""
    bad = {}
    for (a, b) in edges:
        la, lb = LAYERS.get(a), LAYERS.get(b)
        if la is None or lb is None:
            bad[(a, b)] = f"{a if la is None else b} has no declared layer"
        elif lb > la and la != ENTRY:
            bad[(a, b)] = f"{a} ({NAMES[la]}) imports {b} ({NAMES[lb]})"
        elif la == lb == FEATURE and (a, b) not in SEAMS:
            bad[(a, b)] = "a feature imports another feature outside a declared seam"
    return bad


def test_every_import_keeps_the_layers():
    found = violations(imports())
    new = {k: f"{why} ({imports()[k][0]})" for k, why in found.items() if k not in PENDING}
    assert not new, "\n".join(f"{a} -> {b}: {why}" for (a, b), why in sorted(new.items()))
    stale = sorted(k for k in PENDING if k not in found)
    assert not stale, f"fixed, take them off PENDING: {stale}"


def test_the_check_fails_on_a_planted_upward_import(tmp_path):
    pkg = tmp_path / "ridgeline"
    (pkg / "engine").mkdir(parents=True)
    (pkg / "serve").mkdir()
    (pkg / "kv_spec.py").write_text("")
    (pkg / "engine" / "ok.py").write_text("from ridgeline.kv_spec import KVCacheSpec\n")
    (pkg / "serve" / "app.py").write_text("from ridgeline.engine.ok import x\n")
    assert violations(imports(pkg)) == {}
    (pkg / "engine" / "bad.py").write_text("def f():\n    from ridgeline.serve.app import x\n")  # inside a function
    assert violations(imports(pkg)) == {("engine", "serve"): "engine (core) imports serve (entry point)"}
    (pkg / "speculative").mkdir()
    (pkg / "engine" / "bad.py").write_text("import ridgeline.speculative.ngram\n")
    assert violations(imports(pkg)) == {("engine", "speculative"): "engine (core) imports speculative (feature)"}
    (pkg / "quant").mkdir()
    (pkg / "quant" / "x.py").write_text("from ridgeline.speculative import ngram\n")
    assert ("quant", "speculative") in violations(imports(pkg))
