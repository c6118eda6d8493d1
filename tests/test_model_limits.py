"""What a model's files may claim: GGUF headers and metadata, config.json sizes and safetensors headers out
of range, inconsistent or past the end of the file are ModelLoadErrors naming the field and the value,
raised before anything is sized from them (test_gguf_fuzz.py throws mutations at the same checks)."""
from __future__ import annotations

import json
import shutil
import struct

import pytest
import torch
from gguf import GGMLQuantizationType as T, GGUFValueType as V

from ridgeline.errors import ModelLoadError
from ridgeline.gguf.convert import ensure_converted
from ridgeline.gguf.reader import read_gguf
from ridgeline.weights.hf_config import load_arch_config
from ridgeline.weights.safetensors_loader import weight_files
from test_gguf_fuzz import _layout, write_tiny_llama


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("RIDGELINE_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _refused(path, match: str) -> None:
    with pytest.raises(ModelLoadError, match=match) as e:
        ensure_converted(path, progress=False)
    assert str(path) in str(e.value)  # every message names the file


@pytest.mark.parametrize("meta, raw, match", [
    ({"block_count": 0}, (), r"llama\.block_count = 0 is out of range \(1 to 1024\)"),
    ({"block_count": 4096}, (), r"llama\.block_count = 4096 is out of range"),
    ({"block_count": None}, (("llama.block_count", "2", V.STRING),), r"llama\.block_count is str '2', not an integer"),
    ({"block_count": 3}, (), r"block_count is 3, but the file has tensors for 2 layers"),
    ({"head_count_kv": 3}, (), r"head_count = 4 is not a multiple of llama\.attention\.head_count_kv = 3"),
    ({"head_count": 0}, (), r"llama\.attention\.head_count = 0 is out of range"),
    ({"context_length": None}, (("llama.context_length", 2**40, V.UINT64),),
     r"llama\.context_length = 1099511627776 is out of range \(1 to 16777216\)"),
    ({"embedding_length": 96}, (), r"token_embd\.weight has shape \[280, 64\], but llama\.embedding_length is 96"),
    ({"feed_forward_length": 96}, (), r"blk\.0\.ffn_gate\.weight has shape \[128, 64\], but the metadata"),
    ({"rope_freq_base": float("inf")}, (), r"llama\.rope\.freq_base is float inf, not a finite number"),
    ({"bos_token_id": 10**6}, (), r"bos_token_id = 1000000 is past the vocabulary of 280 tokens"),
    ({"token_merges": ["Ġt"]}, (), r"tokenizer\.ggml\.merges: entry 0 'Ġt' is not two tokens"),
    ({"token_types": [1, 2, 3]}, (), r"tokenizer\.ggml\.token_type has 3 entries for 280 tokens"),
    ({"tokenizer_pre": None}, (("tokenizer.ggml.pre", ["a", "b"], V.ARRAY),),
     r"tokenizer\.ggml\.pre is list \['a', 'b'\], not a string"),
])
def test_metadata_out_of_range_or_of_the_wrong_type_is_named(tmp_path, home, meta, raw, match):
    path = tmp_path / "bad.gguf"
    write_tiny_llama(path, meta, raw)
    _refused(path, match)
    assert not (home / "converted").exists() or not any((home / "converted").iterdir())


def test_the_tiny_file_itself_converts(tmp_path, home):
    path = tmp_path / "ok.gguf"
    write_tiny_llama(path)
    cfg = load_arch_config(ensure_converted(path, progress=False))
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.vocab_size) == (2, 64, 4, 2, 280)


def _patched(tmp_path, at, fmt: str, value: int, name: str = "patched.gguf"):
    base = tmp_path / "base.gguf"
    write_tiny_llama(base)
    offset = at(*_layout(base))
    data = bytearray(base.read_bytes())
    data[offset:offset + struct.calcsize(fmt)] = struct.pack(fmt, value)
    (tmp_path / name).write_bytes(bytes(data))
    return tmp_path / name


def _kv(key: str, part: int):
    return lambda kvs, tensors, data_offset, align: dict((k, p) for k, p, _ in kvs)[key][part][0]


def _tensor(name: str, part: int, extra: int = 0):
    return lambda kvs, tensors, data_offset, align: dict((k, p) for k, p, _ in tensors)[name][part][0] + extra


@pytest.mark.parametrize("at, fmt, value, match", [
    (lambda *_: 8, "<Q", 2**64 - 1, r"tensor count = 18446744073709551615 is out of range \(at most \d+ here\)"),
    (lambda *_: 16, "<Q", 2**40, r"metadata key-value count = 1099511627776 is out of range"),
    (_kv("tokenizer.ggml.tokens", 4), "<Q", 2**62, r"array length of tokenizer\.ggml\.tokens = 4611686018427387904"),
    (_kv("tokenizer.ggml.pre", 3), "<Q", 2**63, r"length of the string value of tokenizer\.ggml\.pre = 9223372036854775808"),
    (_kv("llama.block_count", 2), "<I", 13, r"metadata llama\.block_count has unknown value type 13"),
    (_kv("tokenizer.ggml.merges", 3), "<I", 9, r"array length of tokenizer\.ggml\.merges = \d+ is out of range"),
    (_tensor("blk.0.attn_q.weight", 0), "<Q", 64, r"length of the name of tensor 2 = 64 is out of range \(at most 63"),
    (_tensor("blk.0.attn_q.weight", 2), "<I", 5, r"tensor 'blk\.0\.attn_q\.weight' has 5 dimensions \(1 to 4\)"),
    (_tensor("blk.0.attn_q.weight", 3, 8), "<Q", 2**40, r"tensor 'blk\.0\.attn_q\.weight' \(\d+ bytes at byte \d+\) "
                                                         "runs past the end"),
    (_tensor("blk.0.attn_q.weight", 3), "<Q", 48, r"rows of 48 elements, not a multiple of Q4_0's block of 32"),
    (_tensor("blk.0.attn_q.weight", 4), "<I", 4, r"tensor 'blk\.0\.attn_q\.weight' has unknown GGML type id 4"),
    (_tensor("blk.0.attn_q.weight", 5), "<Q", 1, r"offset 1, not a multiple of the alignment 32"),
    (_tensor("blk.0.attn_q.weight", 5), "<Q", 0, r"overlaps tensor 'token_embd\.weight'"),
    (_tensor("token_embd.weight", 4), "<I", int(T.F32), r"tensor 'output_norm\.weight' .* overlaps tensor 'token_embd"),
])
def test_header_fields_are_checked_against_the_file(tmp_path, at, fmt, value, match):
    path = _patched(tmp_path, at, fmt, value)
    with pytest.raises(ModelLoadError, match=match):
        read_gguf(path).close()


def test_a_type_that_cannot_be_dequantized_is_named_not_a_buffer_error(tmp_path, home):
    path = tmp_path / "q8_1.gguf"
    write_tiny_llama(path, types={"ffn_up": T.Q8_1})
    _refused(path, r"blk\.0\.ffn_up\.weight' has GGML type Q8_1, which Ridgeline cannot dequantize")


# ---------------------------------------------------------------- config.json and safetensors
def _folder(tiny_llama, tmp_path, **changes):
    folder = tmp_path / "model"
    shutil.copytree(tiny_llama, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(changes)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


@pytest.mark.parametrize("changes, match", [
    ({"num_hidden_layers": "2"}, r"num_hidden_layers is str '2', not an integer"),
    ({"num_hidden_layers": 2.0}, r"num_hidden_layers is float 2\.0, not an integer"),
    ({"hidden_size": 10**9}, r"hidden_size = 1000000000 is out of range \(1 to 131072\)"),
    ({"vocab_size": 0}, r"vocab_size = 0 is out of range"),
    ({"num_key_value_heads": 3}, r"num_attention_heads = 4 is not a multiple of num_key_value_heads = 3"),
    ({"head_dim": 15}, r"head_dim = 15 is odd"),
    ({"max_position_embeddings": 2**40}, r"max_position_embeddings = 1099511627776 is out of range"),
    ({"rope_theta": "big"}, r"rope_theta is str 'big', not a finite number"),
    ({"rope_scaling": "yarn"}, r"rope_scaling is str, not an object"),
    ({"eos_token_id": [2, -1]}, r"eos_token_id is int -1, not a non-negative integer"),
    ({"sliding_window": 2**30}, r"sliding_window = 1073741824 is out of range"),
])
def test_config_sizes_are_checked_where_they_are_read(tiny_llama, tmp_path, changes, match):
    folder = _folder(tiny_llama, tmp_path, **changes)
    with pytest.raises(ModelLoadError, match=match) as e:
        load_arch_config(folder)
    assert str(folder / "config.json") in str(e.value)


def test_a_config_json_that_is_not_an_object_is_refused(tiny_llama, tmp_path):
    folder = _folder(tiny_llama, tmp_path)
    (folder / "config.json").write_text("[" * 100_000 + "]" * 100_000)  # deep enough to exhaust the parser's stack
    with pytest.raises(ModelLoadError, match="config.json is not"):
        load_arch_config(folder)


@pytest.mark.parametrize("changes, match", [
    ({"num_hidden_layers": 1000, "intermediate_size": 1 << 20}, "the config does not describe its weights"),
    ({"max_position_embeddings": 1 << 24}, r"16777216 positions of rotary tables .* \(lower --max-model-len\)"),
])
def test_a_config_far_larger_than_its_weights_is_refused_before_allocating(tiny_llama, tmp_path, monkeypatch,
                                                                         changes, match):
    from ridgeline import LLM
    folder = _folder(tiny_llama, tmp_path, **changes)
    monkeypatch.setattr(torch.nn.Module, "to_empty", lambda *a, **k: pytest.fail("allocated before the check"))
    with pytest.raises(ModelLoadError, match=match):
        LLM(str(folder), dtype="float32", kv_cache_memory="2MiB")


def _safetensors(folder, header: bytes, data: bytes = b"") -> None:
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + data)


@pytest.mark.parametrize("blob, match", [
    (struct.pack("<Q", 1 << 40) + b"{}", r"header length 1099511627776 is past the end of the file"),
    (struct.pack("<Q", 4) + b"{]}x", r"the safetensors header is not valid JSON"),
    (None, r"tensor 'w' has data_offsets \[0, 4096\] outside the file's 16 bytes of data"),
    (b"", r"tensor 'w' \(F32, shape \[2, 3\]\) needs 24 bytes, its data_offsets give 16"),
])
def test_safetensors_headers_are_checked_against_the_file(tiny_llama, tmp_path, blob, match):
    folder = _folder(tiny_llama, tmp_path)
    if blob is None:
        _safetensors(folder, json.dumps({"w": {"dtype": "F32", "shape": [1024], "data_offsets": [0, 4096]}}).encode(),
                     bytes(16))
    elif blob == b"":
        _safetensors(folder, json.dumps({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 16]}}).encode(),
                     bytes(16))
    else:
        (folder / "model.safetensors").write_bytes(blob)
    with pytest.raises(ModelLoadError, match=match):
        weight_files(folder)


@pytest.mark.parametrize("name, text, match", [
    ("tokenizer.json", '{"model": {"type": "BPE", "vocab": 3}}', r"tokenizer\.json cannot be read as a tokenizer"),
    ("tokenizer_config.json", "{not json", r"tokenizer_config\.json is not valid JSON"),
    ("tokenizer_config.json", "[1, 2]", r"tokenizer_config\.json is not a JSON object"),
])
def test_a_damaged_tokenizer_is_a_model_load_error(tiny_llama, tmp_path, name, text, match):
    from ridgeline.weights.tokenizer import Tokenizer
    folder = _folder(tiny_llama, tmp_path)
    (folder / name).write_text(text)
    with pytest.raises(ModelLoadError, match=match):
        Tokenizer(folder)
