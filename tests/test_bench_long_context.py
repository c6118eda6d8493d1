"""`ridgeline bench long-context` on a tiny model: the table, JSON, plot, llama-bench input, bad input."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from ridgeline.bench.long_context import llama_bench_rates, parse_lengths
from ridgeline.cli import main
from ridgeline.errors import InvalidRequestError
from ridgeline.measure.attn_profile import LayerShape, profile_prefill


def test_parse_lengths():
    assert parse_lengths("512, 64,max,99999", 999) == [64, 512, 999]
    for bad in ("", "abc", "-5", ","):
        with pytest.raises(InvalidRequestError):
            parse_lengths(bad, 1000)


def test_llama_bench_json(tmp_path):
    entries = [{"n_prompt": 512, "n_gen": 0, "n_depth": 0, "avg_ts": 1223.0},
               {"n_prompt": 0, "n_gen": 64, "n_depth": 4096, "avg_ts": 58.1},
               {"n_prompt": 0, "n_gen": 64, "n_depth": 4096, "avg_ts": 57.0},
               {"n_prompt": 8000, "n_gen": 0, "avg_ts": 325.0}, {"model": "no rate"}]
    path = tmp_path / "lb.json"
    path.write_text(json.dumps(entries))
    assert llama_bench_rates(str(path)) == {"pp": {512: 1223.0, 8000: 325.0}, "tg": {4096: 58.1}}
    path.write_text("{")
    with pytest.raises(InvalidRequestError, match="llama-bench"):
        llama_bench_rates(str(path))


def test_profile_counts_the_work_of_each_part():
    shape = LayerShape(64, 128, 4, 2, 16)
    p = profile_prefill(shape, 100, chunk=32, dtype=__import__("torch").float32)
    assert p.matmul_flops == 2 * 100 * (128 * 64 + 64 * 64 + 256 * 64 + 64 * 128)
    assert p.attention_flops == 4 * 4 * 16 * sum(range(1, 101))  # row i sees i + 1 keys
    assert 0 < p.attention_share < 1


def test_bench_long_context(tiny_llama, tmp_path, capsys, monkeypatch):
    from ridgeline.advisor import local_profile
    monkeypatch.setattr(local_profile, "local_hardware", lambda **kw: SimpleNamespace(bandwidth=20e9))
    lb = tmp_path / "lb.json"
    lb.write_text(json.dumps([{"n_prompt": 64, "n_gen": 0, "avg_ts": 900.0}]))
    out, png = tmp_path / "lc.json", tmp_path / "lc.png"
    assert main(["bench", "long-context", "--model", str(tiny_llama), "--dtype", "float32",
                 "--kv-cache-memory", "8MiB", "--lengths", "64,200,max", "--decode-tokens", "4", "--repeats", "1",
                 "--llama-bench", str(lb), "--plot", str(png), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "llama.cpp pp" in text and "900" in text
    res = json.loads(out.read_text())
    assert [r["length"] for r in res["rows"]] == [64, 200, 507]  # max_model_len - decode tokens - 1
    for r in res["rows"]:
        assert r["prefill_tok_per_s"] > 0 and r["decode_tok_per_s"] > 0 and 0 < r["attention_share_time"] < 1
    shares = [r["attention_share_flops"] for r in res["rows"]]
    assert shares == sorted(shares)
    assert png.stat().st_size > 1000


def test_crossover_from_the_profiled_curve(monkeypatch):
    """advise --validate reads n* off the measured attention share curve (log-interpolated at 50%)."""
    from ridgeline.measure import attn_profile
    monkeypatch.setattr(attn_profile, "profile_prefill",
                        lambda shape, n, *a: SimpleNamespace(attention_share=n / (n + 1000)))
    got = attn_profile.crossover_from_profile(None, [256, 512, 2048, 4096], 512, None, None)
    assert 950 < got < 1050
    assert attn_profile.crossover_from_profile(None, [64, 128], 512, None, None) is None
