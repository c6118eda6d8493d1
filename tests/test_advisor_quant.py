"""`ridgeline advise quant`: memory and predicted speed per weight format from the roofline, quality from
the one measured table (advisor/quant_quality.py) that the console shows too."""
from __future__ import annotations

import json

import pytest

from ridgeline.advisor.quant_quality import MEASURED, REFERENCE_PPL
from ridgeline.cli import main


def run(capsys, *argv) -> dict:
    assert main(["advise", "quant", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_quant_table_memory_speed_and_quality(capsys):
    out = run(capsys, "--model", "Llama-3.1-8B", "--hardware", "H100", "--concurrency", "1")
    speed, quality = out["sections"]["quant_speed"]["values"], out["sections"]["quant_quality"]["values"]
    assert speed["weights_int4"]["value"] == speed["weights_bf16"]["value"] / 4
    assert speed["speedup_bf16"]["value"] == 1
    # batch-1 decode is bandwidth-bound: fewer bytes per weight, faster steps
    assert speed["speedup_int4"]["value"] > speed["speedup_int8"]["value"] > 1
    for q in MEASURED:
        assert quality[f"ppl_{q.name}"]["value"] == pytest.approx((q.perplexity / REFERENCE_PPL - 1) * 100)
        assert quality[f"ppl_{q.name}"]["numbers"] == f"{q.perplexity:.3f} / {REFERENCE_PPL:.3f} - 1"


def test_quant_text_shows_formulas(capsys):
    assert main(["advise", "quant", "--model", "Qwen2.5-7B", "--hardware", "L4"]) == 0
    out = capsys.readouterr().out
    assert "params * B/param" in out and "t(bf16) / t(int4)" in out and "ppl / ppl(bf16) - 1" in out
    assert "top-1 agreement" in out


def test_quant_bad_input_is_one_line(capsys):
    assert main(["advise", "quant", "--model", "Llama-3.1-8B", "--weights", "int3"]) == 2
    assert "unknown precision" in capsys.readouterr().err
