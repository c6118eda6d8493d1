"""`ridgeline bench quant` on a tiny model: every asked rung gets a row (bytes, three speeds, quality
against the reference), the table and the Pareto plot come out, and a bad rung is a clear error."""
import json

import pytest

from ridgeline.bench.quant import ladder
from ridgeline.bench.quant_plot import pareto
from ridgeline.cli import main
from ridgeline.errors import InvalidRequestError


def test_ladder_keeps_the_reference_first_and_names_unknown_rungs():
    assert list(ladder(["int4", "int8"], False)) == ["none", "int8", "int4"]
    assert ladder(None, True)["int4-sym"] == {"quantization": "int4", "quant_symmetric": True}
    assert "gguf" in ladder(None, True) and "gguf" not in ladder(None, False)
    with pytest.raises(InvalidRequestError, match="unknown rung 'gguf' for this model; rungs: none, int8"):
        ladder(["gguf"], False)


def test_pareto_front():
    pts = [(1.0, 1e-6), (2.0, 0.01), (1.5, 0.05), (2.5, 0.02)]
    assert pareto(pts) == [0, 1, 3]  # (1.5, 0.05) is slower and worse than (2.0, 0.01)


def test_bench_quant_rows_table_and_plot(tiny_llama, tmp_path, capsys):
    out, png = tmp_path / "q.json", tmp_path / "q.png"
    assert main(["bench", "quant", "--model", str(tiny_llama), "--dtype", "float32", "--ladder", "int8,w4a8",
                 "--repeats", "1", "--output-len", "4", "--prefill-prompts", "2", "--prefill-len", "48",
                 "--batch", "4", "--window", "48", "--max-tokens", "192", "--prompts", "2", "--gen-tokens", "4",
                 "--no-progress", "--plot", str(png), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "decode b1" in text and "speed-up vs none: int8 decode" in text
    rows = json.loads(out.read_text())["rows"]
    assert [r["name"] for r in rows] == ["none", "int8", "w4a8"]
    assert rows[0]["kl"] is None and rows[0]["perplexity"] == rows[0]["ppl_ref"]
    for r in rows:
        assert r["decode_b1_tok_s"] > 0 and r["prefill_tok_s"] > 0 and r["decode_batch_tok_s"] > 0
    assert rows[1]["weight_bytes"] < rows[0]["weight_bytes"] * 0.3 and 0 <= rows[1]["kl"] < 0.1
    assert rows[2]["weight_formats"].startswith("w4a8") and rows[2]["agreement"] > 0.5
    assert png.stat().st_size > 1000
