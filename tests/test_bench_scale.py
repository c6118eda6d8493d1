"""`ridgeline bench scale`: the ladder's shapes are the published ones, rows that do not fit the disk or the
memory, or lack llama.cpp's tools, are skipped with the reason, llama-batched-bench's output is read in both
of its forms, and a tiny row runs end to end into the table, the JSON and the plot."""
from __future__ import annotations

import json

import pytest

from ridgeline.bench import scale
from ridgeline.bench.scale_models import SHAPES, write_checkpoint

GIB = 1 << 30


def test_shapes_have_their_published_parameter_counts():
    assert abs(SHAPES["llama-3.2-1b"].params - 1.236e9) < 0.01e9  # Llama-3.2-1B: 1.24 B, tied
    assert abs(SHAPES["qwen2.5-3b"].params - 3.086e9) < 0.01e9  # Qwen2.5-3B: 3.09 B, tied, q/k/v biases
    assert abs(SHAPES["llama-3.1-8b"].params - 8.030e9) < 0.01e9  # Llama-3.1-8B: 8.03 B
    assert abs(SHAPES["gemma-3-270m"].params - 268.1e6) < 0.1e6  # Gemma-3-270m: 268 M, tied, head_dim 256


def test_a_gemma_folder_keeps_its_vocabulary_and_a_qwen2_view_keeps_the_tokenizer(tmp_path):
    """Gemma's converter keeps the embedding rows its tokenizer names: the tokenizer is padded to the whole
    vocabulary. Qwen2's tokenizer class would bring its own pre-tokenizer: the converter's view loads
    tokenizer.json as written, and only the view's config differs."""
    from dataclasses import replace

    from transformers import AutoConfig, AutoTokenizer

    from ridgeline.bench.scale_models import converter_view, default_tokenizer
    gemma = replace(SHAPES["gemma-3-270m"], hidden=64, layers=6, ffn=128, head_size=32, vocab=50000)
    folder = write_checkpoint(gemma, tmp_path / "gemma", default_tokenizer())
    cfg = AutoConfig.from_pretrained(folder)
    assert cfg.head_dim == 32 and cfg.layer_types.count("full_attention") == 1 and cfg.sliding_window == 512
    tok = json.loads((folder / "tokenizer.json").read_text())
    ids = set(tok["model"]["vocab"].values()) | {a["id"] for a in tok["added_tokens"]}
    assert ids == set(range(50000))
    assert len(tok["model"]["vocab"]) + len(tok["added_tokens"]) >= 50000  # the rows the converter keeps
    assert converter_view(folder, gemma, tmp_path) == folder
    qwen = replace(SHAPES["qwen2.5-3b"], hidden=64, layers=1, heads=4, kv_heads=2, ffn=128)
    folder = write_checkpoint(qwen, tmp_path / "qwen", default_tokenizer())
    view = converter_view(folder, qwen, tmp_path)
    assert view != folder and json.loads((view / "config.json").read_text())["architectures"] == ["Qwen2ForCausalLM"]
    text = "\n \n\n 3333 I've ?\u6211\u60f3"
    want = AutoTokenizer.from_pretrained(default_tokenizer()).encode(text)
    assert AutoTokenizer.from_pretrained(view).encode(text) == want
    assert AutoTokenizer.from_pretrained(folder).encode(text) != want  # what the converter would otherwise hash


def test_rows_that_do_not_fit_or_lack_a_tool_are_skipped_with_the_reason():
    none = {"convert": None, "llama-quantize": None}
    rows, skipped = scale.plan_rows(["llama-3.2-1b"], None, none, 100 * GIB, 20 * GIB)
    assert rows == [] and len(skipped) == 4 and all("needs llama.cpp's convert" in s for s in skipped)
    tools = {"convert": "c", "llama-quantize": "q"}
    rows, skipped = scale.plan_rows(["llama-3.2-1b", "llama-3.1-8b"], None, tools, 100 * GIB, 8 * GIB)
    assert ("llama-3.2-1b", "f16") in rows and ("llama-3.1-8b", "q4_0") in rows  # 4.5 GB + 2 GiB margin fits
    assert not any(s.startswith("llama-3.1-8b") for s in skipped)
    rows, skipped = scale.plan_rows(["llama-3.1-8b"], ["f16"], tools, 100 * GIB, 8 * GIB)
    assert rows == [] and "GiB of memory" in skipped[0]  # 16 GB of F16 weights
    rows, skipped = scale.plan_rows(["llama-3.1-8b"], None, tools, 20 * GIB, 64 * GIB)
    # the bf16 folder (16 GB) and the F16 file a Q4 file is made from (16 GB) do not fit 20 GiB
    assert rows == [] and all("of disk" in s for s in skipped)
    rows, _ = scale.plan_rows(["llama-3.1-8b"], None, tools, 20 * GIB, 64 * GIB,
                              cached={"llama-3.1-8b-hf-bf16", "llama-3.1-8b-f16"})
    assert rows == [("llama-3.1-8b", "q4_0"), ("llama-3.1-8b", "q4_k_m")]  # made earlier: reused, not counted


def test_batched_bench_output_is_read_as_jsonl_or_as_its_table():
    jsonl = '{"pp": 32, "tg": 32, "pl": 16, "speed_tg": 210.5}\n{"pp": 32, "tg": 32, "pl": 64, "speed_tg": 400.0}\n'
    assert scale.parse_batched(jsonl) == {16: 210.5, 64: 400.0}
    table = ("|    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |      T s |    S t/s |\n"
             "|-------|--------|------|--------|----------|----------|----------|----------|----------|----------|\n"
             "|    32 |     32 |   16 |   1024 |    1.000 |   512.00 |    2.000 |   256.00 |    3.000 |   341.33 |\n")
    assert scale.parse_batched(table) == {16: 256.0}


def test_bad_lists_are_refused_by_name():
    from ridgeline.errors import InvalidRequestError
    with pytest.raises(InvalidRequestError, match="--sizes: llama-70b"):
        scale._list("llama-70b", list(SHAPES), "sizes")
    with pytest.raises(InvalidRequestError, match="--formats: q3_k"):
        scale._list("q4_0,q3_k", scale.FORMATS, "formats")


def test_a_tiny_row_runs_into_the_table_json_and_plot(tmp_path, capsys):
    from ridgeline.cli import main
    out, png = tmp_path / "scale.json", tmp_path / "scale.png"
    rc = main(["bench", "scale", "--sizes", "tiny", "--batch-sizes", "3", "--prompt-len", "48", "--output-len", "8",
               "--work", str(tmp_path / "work"), "--json", str(out), "--plot", str(png)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "| tiny | hf-bf16" in text and "Size ladder: read" in text
    data = json.loads(out.read_text())
    row = data["rows"][0]["ridgeline"]
    assert row["decode_tok_per_s"] > 0 and row["prefill_tok_per_s"] > 0 and row["read_gb_per_s"] > 0
    assert set(row["batched_decode_tok_per_s"]) == {"3"} and data["ceilings"]["read_gb_per_s"] > 0
    assert png.stat().st_size > 1000
    assert write_checkpoint(SHAPES["tiny"], tmp_path / "work" / "tiny", tmp_path) == tmp_path / "work" / "tiny"  # reused


@pytest.mark.parametrize("fmt, qtype", [("q4_0", "Q4_0"), ("q8_0", "Q8_0")])
def test_the_a8_rows_run_the_file_with_int8_activations(tmp_path, monkeypatch, fmt, qtype):
    """--a8: a Q4_0 / Q8_0 file again under gguf-a8 (its blocks against int8 activations), every rate measured."""
    from gguf import GGMLQuantizationType as T
    from test_gguf_kept import write_gguf
    monkeypatch.setenv("RIDGELINE_HOME", str(tmp_path / "home"))
    path = tmp_path / f"{fmt}.gguf"
    write_gguf(path, {k: getattr(T, qtype) for k in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate",
                                                     "ffn_up", "ffn_down", "output")}, tied=False)
    row = scale.measure_ridgeline(path, fmt, 24, 4, [2], repeats=1, quantization=scale.A8[fmt])
    assert row["prefill_tok_per_s"] > 0 and row["decode_tok_per_s"] > 0 and row["batched_decode_tok_per_s"][2] > 0
    want = {"q4_0": "Q4_0 kept (w4a8-sym)", "q8_0": "Q8_0 kept (w8a8-g32)"}[fmt]
    assert scale.A8[fmt] == "gguf-a8" and want in row["weight_formats"], row["weight_formats"]
