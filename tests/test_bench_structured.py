"""The structured bench workloads and `ridgeline bench structured`: prompts carry their schemas, the
cost rows compare the same prompts constrained and not, complete outputs validate, compile times
and pathological inputs are reported; `bench spec --workloads structured-forced --methods grammar`
ranks the corpus and keeps greedy output identical; `bench serve` sends each prompt's schema in the
endpoint's spelling and reads the server's event-loop probe."""
from __future__ import annotations

import json

import pytest

from ridgeline.bench.loadgen import LoadConfig, RequestSpec, loop_lag_delta, parse_prometheus, request_body
from ridgeline.bench.structured_workload import (MIX_EVERY, WORKLOADS, corpus_schemas, forced_share,
                                                 mixed_workload, structured_workload)
from ridgeline.bench.workloads import chat_workload
from ridgeline.cli import main
from ridgeline.weights.tokenizer import Tokenizer

ENGINE = ["--dtype", "float32", "--kv-cache-memory", "16MiB", "--max-model-len", "2048"]


@pytest.fixture(scope="module")
def long_llama(tmp_path_factory):
    """The tiny llama with room for a schema in the system prompt."""
    from conftest import make_tiny_model
    return make_tiny_model(tmp_path_factory.mktemp("tiny-llama-struct"), "llama", max_position_embeddings=2048)


def test_workloads_carry_their_schemas_deterministically(long_llama):
    tok = Tokenizer(long_llama)
    corpus = corpus_schemas()
    assert len(corpus) >= 40
    for name in WORKLOADS:
        a, b = structured_workload(name, tok, 6), structured_workload(name, tok, 8)
        assert [list(p) for p in a] == [list(p) for p in b[:6]]  # request i does not depend on the count
        for p in a:
            assert p.structured.kind == ("grammar" if name == "tools" else "json") and p.schema
    everyone = structured_workload("structured", tok, len(corpus))
    assert [p.schema for p in everyone] == list(corpus)
    assert json.loads(everyone[0].structured.json) == corpus[everyone[0].schema]
    mix = mixed_workload(chat_workload(tok, 9, 50, 200), tok)
    assert [getattr(p, "structured", None) is not None for p in mix] == [i % MIX_EVERY == 0 for i in range(9)]


def test_forced_share_replays_the_constraint(long_llama):
    from ridgeline.config import EngineConfig
    from ridgeline.engine.llm_engine import LLMEngine
    eng = LLMEngine(EngineConfig.from_kwargs(str(long_llama), progress=False, dtype="float32",
                                             kv_cache_memory="8MiB"))
    backend = eng.structured.backend
    (p,) = structured_workload("structured", eng.tokenizer, 1, only=["const_value"])
    c = backend.create(p.structured)
    out = []
    while not c.is_done and len(out) < 200:  # walk the first allowed token each time
        bits = int.from_bytes(c.allowed_mask(), "little")
        t = (bits & -bits).bit_length() - 1
        out.append(t)
        assert c.advance(t)
    forced, total = forced_share(backend, [p], [out])["const_value"]
    assert total == len(out) and 0 < forced <= total


def test_bench_structured_rows_and_compile(long_llama, tmp_path, capsys):
    out = tmp_path / "s.json"
    assert main(["bench", "structured", "--model", str(long_llama), *ENGINE, "--workloads",
                 "structured-permissive,structured", "--batch-sizes", "1,3", "--repeats", "2", "--requests", "3",
                 "--output-len", "160", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "compile: token table" in printed and "refused" in printed
    r = json.loads(out.read_text())
    assert [(x["workload"], x["batch"]) for x in r["rows"]] == [
        (w, b) for w in ("structured-permissive", "structured") for b in (1, 3)]
    for x in r["rows"]:
        assert x["free_decode_tok_s"] > 0 and x["constrained_decode_tok_s"] > 0 and x["ratio"] > 0
        assert x["valid"] == x["validated"] <= x["completed"] <= x["requests"]  # every complete output validates
        assert 0 <= x["forced_share"] <= 1 and x["mask_ms_per_step"] > 0
        assert x["same_tokens_full_head"] and x["masked_head_gain"] > 0
    fates = {p["input"]: p["fate"] for p in r["compile"]["pathological"]}
    assert fates["schema over 256 KiB (1 MB)"].startswith("refused")
    assert fates["schema nested 3000 deep"].startswith("refused")
    assert all(p["seconds"] < 2.0 or p["fate"].startswith("refused") for p in r["compile"]["pathological"])
    assert 0 < r["compile"]["corpus_median_s"] <= r["compile"]["corpus_max_s"]


def test_bench_structured_refuses_other_workloads(long_llama):
    with pytest.raises(SystemExit):
        main(["bench", "structured", "--model", str(long_llama), *ENGINE, "--workloads", "chat", "--repeats", "1"])


def test_bench_spec_grammar_on_the_forced_schemas(long_llama, tmp_path, capsys):
    out = tmp_path / "g.json"
    assert main(["bench", "spec", "--model", str(long_llama), *ENGINE, "--methods", "grammar",
                 "--workloads", "structured-forced", "--batch-sizes", "1,2", "--k", "4", "--no-controller",
                 "--repeats", "1", "--requests", "2", "--output-len", "48", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "forced-token share by schema" in printed and "structured-forced runs" in printed
    rows = json.loads(out.read_text())["rows"]
    assert [(x["batch"], x["setting"]) for x in rows] == [(1, "off"), (1, "grammar k=4"), (2, "off"),
                                                          (2, "grammar k=4")]
    assert all(x["same_output"] for x in rows)  # grammar drafts: greedy output unchanged
    assert all(x["accepted"] > 0 for x in rows if x["k"])


def test_the_tools_workload_constrains_calls_and_its_calls_validate(long_llama, tmp_path):
    from ridgeline.bench.structured_workload import tools_workload
    tok = Tokenizer(long_llama)
    ps = tools_workload(tok, 4)
    assert [p.structured.field for p in ps] == ["tools"] * 4 and all(len(p.tools) == 2 for p in ps)
    assert all(p.chat[0]["role"] == "user" for p in ps)  # what a client sends: the server adds the rest
    out = tmp_path / "t.json"
    assert main(["bench", "structured", "--model", str(long_llama), *ENGINE, "--workloads", "tools",
                 "--batch-sizes", "2", "--repeats", "1", "--requests", "2", "--output-len", "300",
                 "--grammar-drafts", "--json", str(out)]) == 0
    [row] = json.loads(out.read_text())["rows"]
    assert row["validated"] == row["completed"] == 2 and row["valid"] == 2  # one call each, valid arguments
    spec = RequestSpec([1], messages=ps[0].chat, tools=ps[0].tools)
    _, body = request_body(spec, LoadConfig("chat", "chat", "m", 8))
    assert body["tools"] == ps[0].tools and body["tool_choice"] == "required" and "response_format" not in body
    with pytest.raises(Exception, match="chat"):
        request_body(spec, LoadConfig("completions", "ids", "m", 8))


def test_serve_bench_sends_the_schema_in_each_endpoints_spelling():
    schema = {"type": "object"}
    spec = RequestSpec([1, 2], messages=[{"role": "user", "content": "x"}], schema=schema, schema_name="obj")
    path, body = request_body(spec, LoadConfig("chat", "chat", "m", 8))
    assert path.endswith("chat/completions")
    assert body["response_format"] == {"type": "json_schema",
                                       "json_schema": {"name": "obj", "schema": schema, "strict": True}}
    path, body = request_body(spec, LoadConfig("completions", "ids", "m", 8))
    assert body["structured_outputs"] == {"json": schema} and "response_format" not in body
    _, body = request_body(RequestSpec([1]), LoadConfig("completions", "ids", "m", 8))
    assert "structured_outputs" not in body and "response_format" not in body


def test_loop_lag_delta_reads_the_histogram():
    def scrape(count, over, total):
        return parse_prometheus(
            f'ridgeline_event_loop_lag_seconds_bucket{{le="0.05"}} {count - over}\n'
            f'ridgeline_event_loop_lag_seconds_bucket{{le="0.1"}} {count - over}\n'
            f'ridgeline_event_loop_lag_seconds_bucket{{le="+Inf"}} {count}\n'
            f"ridgeline_event_loop_lag_seconds_count {count}\nridgeline_event_loop_lag_seconds_sum {total}\n")
    d = loop_lag_delta(scrape(10, 1, 0.5), scrape(30, 3, 1.5))
    assert d == {"probes": 20, "late": 2, "late_s": 0.1, "mean_lag_s": pytest.approx(0.05)}
    assert loop_lag_delta({}, scrape(1, 0, 0)) is None
