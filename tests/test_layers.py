"""The layer contract (docs: design/layers), checked on every import in the package, at module level
and inside functions: core imports only core; a feature imports the core (and itself); a tool
imports the core, features and tools; entry points import anything. An arrow between two features
runs through a seam the design page lists. Shown failing on a planted upward import.

PENDING lists the arrows that still break the contract, each with where it is to go: the test fails
on any arrow not listed, and on a listed one that no longer exists (so the list only shrinks).

No two packages import each other, directly or round a loop (tools and entry points included, which
the layers alone allow): the package graph has no cycle. PENDING_CYCLES names the pairs still in
one, and shrinks the same way."""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "ridgeline"
CORE, FEATURE, TOOL, ENTRY = 0, 1, 2, 3
LAYERS = {
    # core: the engine and what it is made of, the weight and KV formats, config, plans
    **dict.fromkeys(["engine", "runner", "models", "layers", "kernels", "weights", "gguf", "formats", "data", "config",
                     "step_plan", "kv_spec", "kv_groups", "errors", "inputs", "sampling_params", "structured_params", "utils",
                     "cli_parser", "version", "http"], CORE),
    # features: plug into the core through its seams
    **dict.fromkeys(["speculative", "distributed", "disagg", "router", "quant", "structured", "tool_calls",
                     "lora"], FEATURE),
    **dict.fromkeys(["bench", "advisor", "eval", "cache_report", "measure"], TOOL),
    **dict.fromkeys(["cli", "__main__", "serve", "entrypoints", "__init__"], ENTRY),
}
NAMES = {CORE: "core", FEATURE: "feature", TOOL: "tool", ENTRY: "entry point"}
# feature -> feature arrows through a declared seam (the design page lists each with its reason)
SEAMS: set[tuple[str, str]] = set()
# arrows that break the contract today, (from, to): what moves where to end each
PENDING = {
}

# pairs of packages that still import each other, with what ends the cycle; the arrows between the
# two are left out of the cycle check, which fails once the two no longer lie on a cycle
PENDING_CYCLES = {
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


def cycles(edges, pending=frozenset()) -> list[list[str]]:
    """The strongly connected components of more than one package (each sorted), leaving out the
    arrows between the two packages of each pair in `pending` (Tarjan's algorithm)."""
    succ: dict[str, list[str]] = defaultdict(list)
    for a, b in edges:
        if frozenset({a, b}) not in pending:
            succ[a].append(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in succ[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while not comp or comp[-1] != v:
                comp.append(stack.pop())
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted({x for e in edges for x in e}):
        if v not in index:
            visit(v)
    return sorted(out)


def describe_cycles(edges, comps: list[list[str]]) -> str:
    """Each cycle's packages, then every arrow inside it with the file:line of each import."""
    lines = []
    for comp in comps:
        lines.append("cycle: " + ", ".join(comp))
        for (a, b), where in sorted(edges.items()):
            if a in comp and b in comp:
                lines.append(f"  {a} -> {b}: {', '.join(where)}")
    return "\n".join(lines)


def test_no_import_cycle_between_packages():
    edges = imports()
    found = cycles(edges, frozenset(PENDING_CYCLES))
    assert not found, "packages that import each other (all imports, module level and in functions):\n" + \
        describe_cycles(edges, found)
    together = [set(c) for c in cycles(edges)]
    stale = sorted(sorted(pair) for pair in PENDING_CYCLES if not any(pair <= c for c in together))
    assert not stale, f"no longer on a cycle, take them off PENDING_CYCLES: {stale}"


def test_the_cycle_check_fails_on_a_planted_cycle(tmp_path):
    pkg = tmp_path / "ridgeline"
    for name in ("bench", "advisor", "eval", "measure"):
        (pkg / name).mkdir(parents=True)
    (pkg / "measure" / "m.py").write_text("")
    (pkg / "advisor" / "a.py").write_text("from ridgeline.measure import m\n")
    (pkg / "bench" / "b.py").write_text("from ridgeline.advisor.a import x\nimport ridgeline.measure.m\n")
    assert cycles(imports(pkg)) == []
    (pkg / "advisor" / "v.py").write_text("def f():\n    from ridgeline.bench.b import y\n")  # inside a function
    edges = imports(pkg)
    assert cycles(edges) == [["advisor", "bench"]]
    text = describe_cycles(edges, cycles(edges))
    assert "advisor -> bench: advisor/v.py:2" in text and "bench -> advisor: bench/b.py:1" in text
    assert cycles(edges, frozenset({frozenset({"advisor", "bench"})})) == []  # a pending pair is left out
    (pkg / "advisor" / "v.py").write_text("")
    (pkg / "measure" / "m.py").write_text("import ridgeline.eval.e\n")  # round a loop of three
    (pkg / "eval" / "e.py").write_text("from ridgeline.bench import b\n")
    assert cycles(imports(pkg)) == [["advisor", "bench", "eval", "measure"]]  # bench -> advisor -> measure too


def private_imports(root: Path = ROOT) -> list[str]:
    """'file:line name' of every import of a _private name (or from a _private module) of another
    top-level part of the package."""
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        src = rel.parts[0].removesuffix(".py")
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                    and node.module.startswith(root.name + ".")):
                continue
            parts = node.module.split(".")
            if parts[1] == src:
                continue
            names = [a.name for a in node.names] + parts[2:]
            out += [f"{rel}:{node.lineno} {node.module}.{n}" for n in names
                    if n.startswith("_") and not n.startswith("__")]
    return out


def test_no_private_name_is_imported_across_packages(tmp_path):
    assert private_imports() == []
    pkg = tmp_path / "ridgeline"
    (pkg / "engine").mkdir(parents=True)
    (pkg / "bench").mkdir()
    (pkg / "engine" / "a.py").write_text("from ridgeline.engine.b import _mine\n")  # inside its package: fine
    (pkg / "bench" / "x.py").write_text("def f():\n    from ridgeline.engine.a import _secret, public\n")
    assert private_imports(pkg) == ["bench/x.py:2 ridgeline.engine.a._secret"]
