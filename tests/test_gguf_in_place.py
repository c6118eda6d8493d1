"""A GGUF model's weights are read from the file in place: the converted folder holds config, tokenizer and
a link to the file, never a float copy of the weights, whatever the quantization. Every quantization reads
the values the float32 copy would hold, and a folder whose file has changed is an error."""
import os

import pytest
import torch
from safetensors.torch import load_file

from ridgeline import LLM, SamplingParams
from ridgeline.errors import ModelLoadError
from ridgeline.gguf.convert import ensure_converted
from ridgeline.gguf.load import dequantized_tensors
from ridgeline.weights.hf_config import load_arch_config
from test_gguf import write_tiny_gguf

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("RIDGELINE_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture(params=["llama", "qwen2"])
def tiny(request, tmp_path):
    path = tmp_path / f"tiny-{request.param}.gguf"
    write_tiny_gguf(path, arch=request.param)
    return path


def _size(folder) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def _tokens(llm) -> list[int]:
    return list(llm.generate([[1, 5, 9, 3, 7]], GREEDY, use_tqdm=False)[0].outputs[0].token_ids)


@pytest.mark.parametrize("quantization", ["gguf", "none", "int8"])
def test_loading_writes_no_weight_copy(tiny, home, quantization):
    llm = LLM(str(tiny), dtype="float32", kv_cache_memory="4MiB", quantization=quantization, progress=False)
    assert len(_tokens(llm)) == 8
    folder = llm.info.model_folder
    files = {f.name for f in folder.iterdir()}
    assert not any(n.endswith(".safetensors") for n in files), files
    # config, tokenizer and the link: a small fraction of the file (the float32 copy would be ~2x it)
    assert _size(home) < 0.5 * tiny.stat().st_size, (_size(home), tiny.stat().st_size)


def test_the_file_read_in_place_holds_the_float_copys_values(tiny, home):
    folder = ensure_converted(tiny, progress=False)
    streamed = dict(dequantized_tensors(tiny, load_arch_config(folder)))
    saved = load_file(ensure_converted(tiny, progress=False, weights=True) / "model.safetensors")
    assert sorted(streamed) == sorted(saved)
    for name, w in saved.items():
        assert streamed[name].dtype == torch.float32 and torch.equal(streamed[name], w), name


def test_none_from_the_file_decodes_as_from_the_float_copy(tiny, home):
    in_place = LLM(str(tiny), dtype="float32", kv_cache_memory="4MiB", quantization="none", progress=False)
    want = _tokens(in_place)
    folder = ensure_converted(tiny, progress=False, weights=True)  # now the folder has its safetensors
    copy = LLM(str(folder), dtype="float32", kv_cache_memory="4MiB", quantization="none", progress=False)
    assert _tokens(copy) == want


def test_the_converted_folder_loads_alone_and_refuses_a_changed_file(tiny, home):
    folder = ensure_converted(tiny, progress=False)
    want = _tokens(LLM(str(tiny), dtype="float32", kv_cache_memory="4MiB", quantization="none", progress=False))
    assert _tokens(LLM(str(folder), dtype="float32", kv_cache_memory="4MiB", progress=False)) == want
    st = tiny.stat()
    os.utime(tiny, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    with pytest.raises(ModelLoadError, match="has changed since"):
        LLM(str(folder), dtype="float32", kv_cache_memory="4MiB", progress=False)
    tiny.unlink()
    with pytest.raises(ModelLoadError, match="cannot be read now"):
        LLM(str(folder), dtype="float32", kv_cache_memory="4MiB", progress=False)
