"""Mutated headers of a tiny GGUF file (written with gguf-py's GGUFWriter), each loaded the way Ridgeline
opens a .gguf, in children under a 4 GiB address-space limit: every file loads or is refused with a
ModelLoadError; none crashes, raises anything else, runs out of memory or hangs.

The mutations are targeted (every header count and length set huge, off by one or zero; every value type
swapped; each tensor's name length, dimension count, dimensions, type and offset broken; truncations at
every field) plus seeded random byte edits, the same on every run. Each child takes a share of them, so
process start-up is paid twice, not once per file.
"""
from __future__ import annotations

import json
import os
import random
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T, GGUFReader, GGUFWriter, quants

from test_gguf import CHAT, MERGES, tiny_vocab

CHILD = Path(__file__).with_name("gguf_fuzz_child.py")
ADDRESS_SPACE = 4 << 30
CHILDREN = 2
DEADLINE_S = 600  # a safety net: a child that has not finished by then hangs
SEED = 20240611
HIDDEN, HEADS, KV_HEADS, FFN, LAYERS = 64, 4, 2, 128, 2
LAYER = [("attn_q", (HIDDEN, HIDDEN), T.Q4_0), ("attn_k", (KV_HEADS * 16, HIDDEN), T.F16),
         ("attn_v", (KV_HEADS * 16, HIDDEN), T.Q8_0), ("attn_output", (HIDDEN, HIDDEN), T.F32),
         ("ffn_gate", (FFN, HIDDEN), T.Q4_1), ("ffn_up", (FFN, HIDDEN), T.Q8_0), ("ffn_down", (HIDDEN, FFN), T.Q4_0)]
# tensors whose index entries get targeted edits (all of them get truncations and random edits)
TARGETED_TENSORS = ("token_embd.weight", "output_norm.weight", "blk.0.attn_q.weight", "blk.0.attn_k.weight",
                    "blk.1.ffn_down.weight")
HUGE = (2**64 - 1, 2**63, 2**40, 2**32)


def write_tiny_llama(path: Path, meta: dict | None = None, raw: tuple = (), types: dict | None = None) -> None:
    """A 2-layer llama (hidden 64, 4 heads over 2 KV heads, a 280-token byte-level BPE vocabulary), its
    matrices in a mix of Q4_0, Q4_1, Q8_0, F16 and F32. meta: GGUFWriter.add_<name> -> the value to write
    instead (None: leave the key out); raw: (key, value, GGUFValueType) to add as well; types: layer
    tensor kind (attn_q, ...) -> the GGML type to store it in instead."""
    rng = np.random.default_rng(0)
    tokens, token_types = tiny_vocab()
    w = GGUFWriter(str(path), "llama")
    values = {"block_count": LAYERS, "context_length": 256, "embedding_length": HIDDEN, "feed_forward_length": FFN,
              "head_count": HEADS, "head_count_kv": KV_HEADS, "rope_freq_base": 10000.0, "layer_norm_rms_eps": 1e-5,
              "tokenizer_model": "gpt2", "tokenizer_pre": "smollm", "token_list": tokens, "token_types": token_types,
              "token_merges": MERGES, "bos_token_id": 1, "eos_token_id": 2, "add_bos_token": False,
              "chat_template": CHAT, **(meta or {})}
    for name, value in values.items():
        if value is not None:
            getattr(w, f"add_{name}")(value)
    for key, value, vtype in raw:
        w.add_key_value(key, value, vtype)

    def add(name, m, qtype):
        if qtype == T.Q8_1:  # a GGML type gguf-py cannot quantize (and the engine does not load): zero blocks
            block, size = GGML_QUANT_SIZES[qtype]
            w.add_tensor(name, np.zeros((m.shape[0], m.shape[1] // block * size), np.uint8), raw_dtype=qtype)
            return
        w.add_tensor(name, quants.quantize(m, qtype), raw_dtype=None if qtype in (T.F32, T.F16) else qtype)

    add("token_embd.weight", rng.standard_normal((len(tokens), HIDDEN)).astype(np.float32) * 0.05, T.Q8_0)
    add("output_norm.weight", np.ones(HIDDEN, np.float32), T.F32)
    for i in range(LAYERS):
        for name, shape, qtype in LAYER:
            qtype = (types or {}).get(name, qtype)
            add(f"blk.{i}.{name}.weight", rng.standard_normal(shape).astype(np.float32) * 0.05, qtype)
        for norm in ("attn_norm", "ffn_norm"):
            add(f"blk.{i}.{norm}.weight", np.ones(HIDDEN, np.float32), T.F32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _layout(path: Path):
    """(metadata fields, tensor-index fields, data offset, alignment), read with gguf-py's own reader (so a
    mistake in ours cannot hide one): a field is (name, [(offset, size) of each of its parts], value types)."""
    r = GGUFReader(path)
    base = r.data.ctypes.data

    def parts(f):
        return [(int(p.ctypes.data - base), int(p.nbytes)) for p in f.parts]
    kvs = [(k, parts(f), [int(t) for t in f.types]) for k, f in r.fields.items() if not k.startswith("GGUF.")]
    tensors = [(t.name, parts(t.field), []) for t in r.tensors]
    return kvs, tensors, int(r.data_offset), int(r.alignment)


def _put(offset: int, fmt: str, value: int) -> dict:
    return {"edits": [[offset, struct.pack(fmt, value).hex()]]}


def _kv_mutations(name: str, parts, types) -> list[tuple[str, dict]]:
    (klen, _), _, (vtype, _) = parts[0], parts[1], parts[2]
    out = [(f"{name}: key length {v}", _put(klen, "<Q", v)) for v in (0, *HUGE, parts[1][1] + 1)]
    out += [(f"{name}: value type {t}", _put(vtype, "<I", t)) for t in (*range(14), 255, 2**32 - 1) if t != types[0]]
    if types[0] == 8:  # string: its length
        out += [(f"{name}: string length {v}", _put(parts[3][0], "<Q", v)) for v in (0, *HUGE, parts[4][1] + 1)]
    elif types[0] == 9:  # array: element type, count
        out += [(f"{name}: element type {t}", _put(parts[3][0], "<I", t)) for t in (*range(14), 2**32 - 1)
                if t != types[1]]
        out += [(f"{name}: array length {v}", _put(parts[4][0], "<Q", v)) for v in (0, 1, *HUGE, 2**61)]
    else:  # a scalar: values a size must not take
        off, size = parts[3]
        fmt = {1: "<B", 2: "<H", 4: "<I", 8: "<Q"}[size]
        values = {0, 1, 3, 2**(8 * size - 1), 2**(8 * size) - 1}
        out += [(f"{name}: value {v}", _put(off, fmt, v)) for v in sorted(values)]
    return out


def _tensor_mutations(name: str, parts, size: int) -> list[tuple[str, dict]]:
    (nlen, _), _, (ndims, _), (dims, dsize), (ttype, _), (toff, _) = parts
    out = [(f"{name}: name length {v}", _put(nlen, "<Q", v)) for v in (0, 64, 2**64 - 1)]
    out += [(f"{name}: {v} dims", _put(ndims, "<I", v)) for v in (0, 3, 5, 2**32 - 1)]
    for j in range(dsize // 8):
        out += [(f"{name}: dim {j} = {v}", _put(dims + 8 * j, "<Q", v)) for v in (0, 1, 3, 2**31 * 3, *HUGE)]
    out += [(f"{name}: type {v}", _put(ttype, "<I", v)) for v in (0, 1, 2, 3, 4, 8, 12, 14, 30, 41, 2**32 - 1)]
    out += [(f"{name}: offset {v}", _put(toff, "<Q", v)) for v in (1, 32 * 1000, size, 2**63, 2**64 - 32)]
    return out


def mutations(path: Path) -> list[dict]:
    data = path.read_bytes()
    kvs, tensors, data_offset, _ = _layout(path)
    found = [("unmutated", {})]
    found += [(f"tensor count {v}", _put(8, "<Q", v)) for v in (0, 1, 19, 21, *HUGE)]
    found += [(f"kv count {v}", _put(16, "<Q", v)) for v in (0, 1, 16, 18, *HUGE)]
    for name, parts, types in kvs:
        found += _kv_mutations(name, parts, types)
    for name, parts, _ in tensors:
        if name in TARGETED_TENSORS:
            found += _tensor_mutations(name, parts, len(data))
    cuts = {0, 4, 8, 16, 23, 24, data_offset - 1, data_offset, data_offset + 1, len(data) - 1}
    for _, parts, _ in kvs + tensors:
        for off, size in parts[:6]:
            cuts.update((off, off + 1, off + size - 1))
    rng = random.Random(SEED)
    cuts.update(rng.randrange(len(data)) for _ in range(40))
    found += [(f"truncated at {c}", {"truncate": c}) for c in sorted(cuts)]
    for i in range(200):  # random bytes in the header
        edits = [[rng.randrange(data_offset), bytes([rng.randrange(256)]).hex()] for _ in range(rng.randint(1, 4))]
        found.append((f"random header bytes {i}", {"edits": edits}))
    for i in range(40):  # a huge or zero 64-bit value anywhere in the header
        found.append((f"random 64-bit value {i}", _put(rng.randrange(data_offset - 8), "<Q",
                                                       rng.choice((0, *HUGE, 2**62 + 1)))))
    for i in range(20):  # tensor bytes
        edit = [rng.randrange(data_offset, len(data)), f"{rng.randrange(256):02x}"]
        found.append((f"random data bytes {i}", {"edits": [edit]}))
    return [{"id": i, "desc": desc, **m} for i, (desc, m) in enumerate(found)]


def _run_children(manifests: list[Path], env: dict) -> list[tuple[int | None, str, str]]:
    """(exit status or None on a timeout, stdout, stderr) of one child per manifest, run side by side."""
    procs = [subprocess.Popen([sys.executable, str(CHILD), str(m)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env) for m in manifests]
    out = []
    for p in procs:
        try:
            stdout, stderr = p.communicate(timeout=DEADLINE_S)
            out.append((p.returncode, stdout, stderr))
        except subprocess.TimeoutExpired:
            p.kill()
            stdout, stderr = p.communicate()
            out.append((None, stdout, stderr))
    return out


def _verdicts(stdout: str, by_id: dict) -> tuple[dict, list[str], dict]:
    """(id -> outcome line, failures, the final line)"""
    results, started, done = {}, None, {}
    for line in stdout.splitlines():
        rec = json.loads(line)
        if rec.get("start"):
            started = rec["id"]
        elif "outcome" in rec:
            results[rec["id"]], started = rec, None
        elif rec.get("done"):
            done = rec
    failures = [f"{by_id[i]['desc']}: {r['detail']}" for i, r in results.items() if r["outcome"] == "error"]
    if started is not None:
        failures.append(f"{by_id[started]['desc']}: the child died or hung while loading it")
    return results, failures, done


@pytest.mark.slow  # loads hundreds of mutated files in child processes
def test_mutated_gguf_headers_load_or_are_refused(tmp_path):
    base = tmp_path / "tiny.gguf"
    write_tiny_llama(base)
    muts = mutations(base)
    by_id = {m["id"]: m for m in muts}
    env = {**os.environ, "MALLOC_ARENA_MAX": "2", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")])}
    manifests = []
    for c in range(CHILDREN):
        work = tmp_path / f"work{c}"
        work.mkdir()
        m = {"address_space": ADDRESS_SPACE, "base": str(base), "work": str(work),
             "home": str(tmp_path / f"home{c}"), "mutations": muts[c::CHILDREN]}
        manifests.append(tmp_path / f"manifest{c}.json")
        manifests[-1].write_text(json.dumps(m))
    results, failures = {}, []
    for rc, stdout, stderr in _run_children(manifests, env):
        got, bad, done = _verdicts(stdout, by_id)
        results.update(got)
        failures += bad
        if rc != 0 or not done:
            failures.append(f"a child exited with {'a timeout' if rc is None else rc}: {stderr[-2000:]}")
        else:
            assert done["peak_rss"] < ADDRESS_SPACE
    assert not failures, "\n".join(failures[:20])
    assert len(results) == len(muts)
    outcomes = [r["outcome"] for r in results.values()]
    assert results[0]["outcome"] == "loaded", results[0]  # the file itself loads
    assert outcomes.count("refused") > len(muts) // 2 and outcomes.count("loaded") > 20
