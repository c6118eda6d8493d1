"""`ridgeline bench spec` on a tiny random model: the code-editing workload, the sweep's rows, the
model beside them and the plot (no timing asserts)."""
from __future__ import annotations

import json
import math

import pytest

from ridgeline.bench.spec_runs import expected_tokens
from ridgeline.bench.workloads import make_workload
from ridgeline.cli import main
from ridgeline.weights.tokenizer import Tokenizer

@pytest.fixture(scope="module")
def long_llama(tmp_path_factory):
    """The tiny llama with room for the code-editing prompts (a passage in bytes)."""
    from conftest import make_tiny_model
    return make_tiny_model(tmp_path_factory.mktemp("tiny-llama-long"), "llama", max_position_embeddings=2048)


ENGINE = ["--dtype", "float32", "--kv-cache-memory", "16MiB", "--max-num-batched-tokens", "512"]


@pytest.mark.parametrize("name, asks", [("code-edit", "`"), ("text-edit", "\"")])
def test_edit_workloads_are_deterministic_and_ask_to_repeat_the_prompt(tiny_llama, name, asks):
    tok = Tokenizer(tiny_llama)
    a = make_workload(name, tok, 6, seed=1)
    assert a == make_workload(name, tok, 6, seed=1)
    assert make_workload(name, tok, 3, seed=1) == a[:3]  # request i does not depend on the count
    assert make_workload(name, tok, 6, seed=2) != a
    assert len(set(map(tuple, a))) == 6
    text = tok.decode(a[0], skip_special_tokens=False)
    assert asks in text.lower() and len(a[0]) > 100, text
    if name == "code-edit":
        assert "def " in text or "class " in text


def test_expected_tokens():
    assert expected_tokens(0.0, 4) == 1
    assert expected_tokens(1.0, 4) == 5
    assert math.isclose(expected_tokens(0.5, 2), 1 + 0.5 + 0.25)


def test_bench_spec_rows_model_and_plot(long_llama, tmp_path, capsys):
    out, png = tmp_path / "s.json", tmp_path / "s.png"
    assert main(["bench", "spec", "--model", str(long_llama), *ENGINE, "--batch-sizes", "1,2", "--k", "2,3",
                 "--output-len", "12", "--ignore-eos", "--repeats", "2", "--requests", "2", "--json", str(out),
                 "--plot", str(png)]) == 0
    printed = capsys.readouterr().out
    assert "speed-up" in printed and " NO" not in printed
    r = json.loads(out.read_text())
    rows = r["rows"]
    settings = ["off", "ngram k=2", "ngram k=3", "ngram ctrl<=3"]
    assert [(x["workload"], x["batch"], x["setting"]) for x in rows] == [
        (w, b, s) for w in ("code-edit", "chat") for b in (1, 2) for s in settings]
    for x in rows:
        assert x["same_output"]  # greedy: every setting emits the same tokens
        assert x["decode_tok_s"] > 0 and len(x["all_decode_tok_s"]) == 2
        if x["k"] == 0:
            assert x["speedup"] == pytest.approx(1.0)
        if "c" in x:
            assert 0 <= x["acceptance"] <= 1 and x["drafted"] >= x["accepted"]
            assert math.isclose(x["E"], expected_tokens(x["acceptance"], x["k_mean"]))
            assert math.isclose(x["model_speedup"], x["E"] / (1 + x["c"] * x["k_mean"]))
    assert png.stat().st_size > 1000 and png.read_bytes()[:4] == b"\x89PNG"


def test_bench_spec_rejects_bad_lists(tiny_llama):
    with pytest.raises(SystemExit):
        main(["bench", "spec", "--model", str(tiny_llama), "--k", "0"])


def test_bench_spec_compares_layer_counts(long_llama, tmp_path):
    out = tmp_path / "s.json"
    assert main(["bench", "spec", "--model", str(long_llama), *ENGINE, "--methods", "layer-skip:1,ngram",
                 "--workloads", "chat", "--batch-sizes", "1", "--requests", "2", "--k", "2", "--no-controller",
                 "--output-len", "8",
                 "--ignore-eos", "--repeats", "1", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [x["setting"] for x in rows] == ["off", "layer-skip:1 k=2", "off", "ngram k=2"]
    assert all(x["same_output"] for x in rows) and rows[1]["drafted"] > 0


def test_bench_spec_samples_at_a_temperature(long_llama, tmp_path, capsys):
    out = tmp_path / "s.json"
    assert main(["bench", "spec", "--model", str(long_llama), *ENGINE, "--workloads", "chat", "--batch-sizes", "2",
                 "--requests", "2", "--k", "2", "--no-controller", "--output-len", "8", "--ignore-eos", "--repeats", "1",
                 "--temperature", "0.8", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "temperature 0.8" in printed and "greedy" not in printed
    r = json.loads(out.read_text())
    assert r["temperature"] == 0.8 and [x["same_output"] for x in r["rows"]] == [None, None]
    assert r["rows"][1]["drafted"] > 0
    with pytest.raises(SystemExit):
        main(["bench", "spec", "--model", str(long_llama), "--temperature", "-1"])
