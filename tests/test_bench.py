"""`ridgeline bench`: deterministic workloads and consistent reports on a tiny random model (no timing asserts)."""
from __future__ import annotations

import json
import math
import os
import sys

import pytest

from ridgeline.bench import corpus
from ridgeline.bench.hf_baseline import subsample
from ridgeline.bench.workloads import (chat_workload, long_prompt_workload, make_workload,
                                       shared_prefix_workload)
from ridgeline.cli import main
from ridgeline.weights.tokenizer import Tokenizer

ENGINE = ["--dtype", "float32", "--kv-cache-memory", "16MiB", "--max-num-batched-tokens", "256"]


@pytest.fixture(scope="module")
def tok(tiny_llama):
    return Tokenizer(tiny_llama)


def test_corpus_is_varied():
    assert len(corpus.PASSAGES) >= 25 and len({t for t, _ in corpus.PASSAGES}) == len(corpus.PASSAGES)
    assert len(corpus.QUESTIONS) >= 30 and len(set(corpus.QUESTIONS)) == len(corpus.QUESTIONS)
    assert all("{text}" in t for t in corpus.TASKS)


@pytest.mark.parametrize("lo,hi", [(120, 300), (200, 260), (400, 900)])
def test_chat_workload_deterministic_and_in_range(tok, lo, hi):
    a = chat_workload(tok, 40, lo, hi, seed=3)
    assert a == chat_workload(tok, 40, lo, hi, seed=3)
    assert all(lo <= len(p) <= hi for p in a), sorted(map(len, a))
    assert len({tuple(p) for p in a}) == len(a)  # distinct prompts
    assert len({len(p) for p in a}) > len(a) // 4  # mixed lengths
    assert chat_workload(tok, 10, lo, hi, seed=3) == a[:10]  # request i does not depend on num_requests
    assert chat_workload(tok, 10, lo, hi, seed=4) != a[:10]


def test_chat_workload_renders_with_the_chat_template(tok):
    text = tok.decode(chat_workload(tok, 1, 150, 300, seed=0)[0], skip_special_tokens=False)
    assert text.startswith("<s>") and text.endswith("<s>assistant\n")


def test_chat_workload_rejects_impossible_ranges(tok):
    with pytest.raises(ValueError):
        chat_workload(tok, 1, 5, 10)  # shorter than the template around any question
    with pytest.raises(ValueError):
        chat_workload(tok, 1, 100, 50)


def test_long_prompt_and_shared_prefix_workloads(tok):
    long = long_prompt_workload(tok, 4, 1500, 2500, seed=1)
    assert all(1500 <= len(p) <= 2500 for p in long) and long == long_prompt_workload(tok, 4, 1500, 2500, seed=1)
    shared = shared_prefix_workload(tok, 12, prefix_len=1200, seed=0)
    common = len(os.path.commonprefix(shared))
    assert 700 <= common <= 1200
    assert len({tuple(p) for p in shared}) == 12
    assert all(len(p) - common < 150 for p in shared)  # short unique suffixes
    assert make_workload("shared-prefix", tok, 12, prefix_len=1200) == shared
    with pytest.raises(ValueError):
        make_workload("nope", tok, 1)


def test_subsample_is_evenly_spaced():
    assert subsample(10, None) == list(range(10)) == subsample(10, 50)
    assert subsample(256, 4) == [0, 64, 128, 192]


def _load(path):
    return json.loads(path.read_text())


def test_bench_throughput_reports_consistent_numbers(tiny_llama, tok, tmp_path, capsys):
    out = tmp_path / "t.json"
    rc = main(["bench", "throughput", "--model", str(tiny_llama), *ENGINE, "--num-requests", "6",
               "--min-prompt", "120", "--max-prompt", "240", "--output-len", "8", "--hf-requests", "2",
               "--hf-batch", "4", "--no-progress", "--json", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "Ridgeline / HF one-at-a-time" in printed and "Ridgeline / HF batch-4" in printed
    assert "measured on 2 of 6 requests" in printed
    r = _load(out)
    prompts = chat_workload(tok, 6, 120, 240, seed=0)
    assert r["workload"]["prompt_tokens"] == sum(map(len, prompts))
    assert r["engine"]["dtype"] == "float32" and r["machine"]["cpu"]
    rl, one, batch = r["results"]
    assert [x["name"] for x in r["results"]] == ["Ridgeline", "HF one-at-a-time", "HF batch-4"]
    assert (rl["requests"], rl["output_tokens"], rl["prompt_tokens"]) == (6, 48, sum(map(len, prompts)))
    assert (one["requests"], one["output_tokens"], one["subsampled"]) == (2, 16, True)
    assert one["prompt_tokens"] == len(prompts[0]) + len(prompts[3])
    assert (batch["requests"], batch["output_tokens"], batch["subsampled"]) == (6, 48, False)
    assert batch["extra"]["padded_prompt_tokens"] >= batch["prompt_tokens"]
    params = r["engine"]["num_params"]
    for x in r["results"]:
        assert x["elapsed"] > 0
        assert math.isclose(x["output_tok_per_s"], x["output_tokens"] / x["elapsed"])
        assert math.isclose(x["total_tok_per_s"], (x["prompt_tokens"] + x["output_tokens"]) / x["elapsed"])
        assert math.isclose(x["gflop_per_s"], 2 * params * x["total_tok_per_s"] / 1e9)
    ratio = r["ratios"]["Ridgeline / HF batch-4"]["output_tok_per_s"]
    assert math.isclose(ratio, rl["output_tok_per_s"] / batch["output_tok_per_s"])
    agree = r["greedy_agreement"]
    assert agree["requests"] == 2 and 0 <= agree["mean_matching_prefix"] <= 1


def test_bench_throughput_without_baseline(tiny_llama, tmp_path):
    out = tmp_path / "t.json"
    assert main(["bench", "throughput", "--model", str(tiny_llama), *ENGINE, "--num-requests", "3",
                 "--workload", "shared-prefix", "--prefix-len", "300", "--output-len", "4",
                 "--baseline", "none", "--no-progress", "--json", str(out)]) == 0
    r = _load(out)
    assert [x["name"] for x in r["results"]] == ["Ridgeline"] and r["ratios"] == {}
    assert r["results"][0]["output_tokens"] == 12


def test_bench_decode_reports_consistent_numbers(tiny_llama, tmp_path, capsys):
    out = tmp_path / "d.json"
    assert main(["bench", "decode", "--model", str(tiny_llama), *ENGINE, "--prompt-len", "150",
                 "--output-len", "8", "--repeats", "1", "--json", str(out)]) == 0
    assert "Ridgeline / HF" in capsys.readouterr().out
    r = _load(out)
    assert 135 <= r["prompt_tokens"] <= 165
    for side in ("ridgeline", "hf"):
        d = r[side]
        assert d["decode_tokens"] == 8 and d["decode_s"] > 0 and d["ttft_s"] > 0
        assert math.isclose(d["weight_gb_per_s"], r["engine"]["weight_bytes_per_token"] * d["decode_tok_per_s"] / 1e9)
    untied_embedding = 384 * 64  # the tiny llama's input embedding: a lookup, not a full read
    assert r["engine"]["weight_bytes_per_token"] == (r["engine"]["num_params"] - untied_embedding) * 4
    assert math.isclose(r["ratio"], r["ridgeline"]["decode_tok_per_s"] / r["hf"]["decode_tok_per_s"])
    stolen = r["ridgeline"]["all_cpu_stolen"]  # the hypervisor's share of the CPUs per run (None: not known)
    assert len(stolen) == 1 and (stolen[0] is None or 0 <= stolen[0] <= 1)


@pytest.mark.parametrize("bench", [
    ["decode", "--prompt-len", "60", "--output-len", "4", "--repeats", "1"],
    ["throughput", "--num-requests", "2", "--min-prompt", "60", "--max-prompt", "90", "--output-len", "4",
     "--hf-requests", "1", "--hf-batch", "2", "--no-progress"],
])
def test_bench_without_transformers_reports_ridgeline_then_how_to_get_the_baseline(tiny_llama, tmp_path, capsys,
                                                                                  monkeypatch, bench):
    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` now raises ImportError
    out = tmp_path / "b.json"
    assert main(["bench", *bench, "--model", str(tiny_llama), *ENGINE, "--json", str(out)]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert any(line.startswith("Ridgeline ") for line in lines)  # its row of the table
    assert not any(line.startswith(("HF", "Ridgeline / HF")) for line in lines)
    last = text.strip().splitlines()[-2]  # before the wall time
    assert last.startswith("no HF baseline") and "pip install transformers" in last
    r = _load(out)
    assert r["baseline_skipped"] and r["machine"]["transformers"] is None
    rows = r.get("results") or [r["ridgeline"]]
    assert len(rows) == 1 and (rows[0].get("output_tokens") or rows[0]["decode_tokens"]) > 0
