"""AWQ's four scaled pairs and its block-output search (quant/awq_block.py, quantize.fold_awq_layer).

The folded scales leave the float model's function unchanged, the v -> o pair included under
grouped-query attention (each v row's scale tied to the o columns of every query head reading it);
the block scorer's choice is never worse than round-to-nearest on the block output it scores; and
the sequential AWQ folder written by `quantize` beats round-to-nearest on held-out text."""
import shutil
from contextlib import contextmanager

import pytest
import torch
from safetensors.torch import save_file

from ridgeline.entrypoints.llm import LLM
from ridgeline.data import corpus
from ridgeline.quant import awq, awq_block, calibrate, sequential
from ridgeline.quant.quantize import QuantizeOptions, fold_awq_layer, quantize_folder
from ridgeline.weights.hf_config import load_arch_config
from ridgeline.weights.safetensors_loader import iter_tensors
from quant_helpers import salient_model

TOKENS = 1024


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    return salient_model(tmp_path_factory.mktemp("awqblock") / "src")


def _logits(folder) -> list[torch.Tensor]:
    llm = LLM(str(folder), dtype="float32", kv_cache_memory="8MiB", progress=False)
    ids = llm.tokenizer.encode(corpus.text("heldout"))
    return [llm.engine.prompt_logits(w) for w in corpus.windows(ids, 256, 1024)]


def fold_every_layer(src, opts: QuantizeOptions) -> tuple[dict, dict]:
    """The float checkpoint's tensors before and after AWQ's scales are folded into every layer."""
    arch = load_arch_config(src)
    assert arch.num_kv_heads < arch.num_heads  # v's rows are fewer than o's columns: the scales are tied
    stats = calibrate.capture(src, corpus.text("calibration"), TOKENS, progress=False)
    tensors = {n: t.float() for n, t in iter_tensors(src)}
    before = dict(tensors)
    for i in range(arch.num_layers):
        fold_awq_layer(tensors, stats, arch, opts, i)
    return before, tensors


def assert_same_function(src, tensors: dict, tmp_path) -> None:
    """A copy of src with these tensors gives src's logits on held-out windows."""
    out = tmp_path / "folded"
    shutil.copytree(src, out)
    save_file({n: t.contiguous() for n, t in tensors.items()}, str(out / "model.safetensors"), metadata={"format": "pt"})
    for a, b in zip(_logits(src), _logits(out)):
        assert torch.allclose(a, b, atol=2e-3, rtol=1e-3), float((a - b).abs().max())


@contextmanager
def layer0_scorer(src):
    """Layer 0's calibration statistics and its block scorer (512 scored tokens), closed after use."""
    runner = sequential.LayerRunner(src, corpus.text("calibration"), TOKENS, window=256, progress=False)
    try:
        yield runner.stats(0), awq_block.BlockScorer(runner, 0, 32, True, tokens=512)
    finally:
        runner.close()


def scored_groups(src):
    """Layer 0's two block-scored groups: (engine name, {checkpoint name: float weight})."""
    tensors = dict(iter_tensors(src))
    for engine_name, names in (("self_attn.qkv_proj", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
                               ("mlp.gate_up_proj", ("mlp.gate_proj", "mlp.up_proj"))):
        yield (f"model.layers.0.{engine_name}",
               {f"model.layers.0.{n}.weight": tensors[f"model.layers.0.{n}.weight"].float() for n in names})


def test_folded_scales_keep_the_float_function_with_grouped_query_attention(src, tmp_path):
    before, tensors = fold_every_layer(src, QuantizeOptions("awq", 4, 32, True))
    for i in range(load_arch_config(src).num_layers):  # every pair scaled (else the comparison proves nothing)
        for n in ("input_layernorm", "self_attn.v_proj", "post_attention_layernorm", "mlp.up_proj"):
            assert not torch.equal(tensors[f"model.layers.{i}.{n}.weight"], before[f"model.layers.{i}.{n}.weight"]), n
    assert_same_function(src, tensors, tmp_path)


def test_block_scored_scale_is_never_worse_than_round_to_nearest_on_its_block(src):
    with layer0_scorer(src) as (stats, scorer):
        for engine_name, weights in scored_groups(src):
            st = stats[engine_name]
            s, alpha, _ = scorer.search(engine_name, weights, st.mean_abs)
            best = scorer.error(engine_name, weights, s)
            assert best <= scorer.error(engine_name, weights, torch.ones_like(s))
            linear_s, _ = awq.search_scale(list(weights.values()), st.gram, st.mean_abs, 32, True)
            assert best <= scorer.error(engine_name, weights, linear_s)
            assert best > 0 and 0 <= alpha < 1


@pytest.mark.parametrize("duo", [False, True], ids=["plain", "duo"])
def test_sequential_awq_beats_rtn_on_held_out_text(src, tmp_path, duo):
    """Mean squared logit error against the float model, int4 sym g32, both written by `quantize`
    (AWQ with and without its duo candidates)."""
    out = {}
    for method in ("rtn", "awq"):
        out[method] = tmp_path / method
        quantize_folder(src, out[method], QuantizeOptions(method, 4, 32, True, calibration_tokens=TOKENS,
                                                          awq_duo=duo and method == "awq"), progress=False)
    ref = _logits(src)

    def error(method):
        return sum(float(((a - b) ** 2).mean()) for a, b in zip(ref, _logits(out[method]))) / len(ref)
    rtn, a = error("rtn"), error("awq")
    assert a < 0.9 * rtn, (a, rtn)
