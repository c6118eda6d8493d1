"""The `layer-skip` proposer: the target's first L layers, final norm and head draft on the target's
own KV cache. Greedy output is token for token the plain engine's through chunked prefill, prefix
caching and forced preemption, the target's KV books balance, a draft that is the whole target in
effect is (nearly) always accepted, and L outside [1, layers) is an error at start-up."""
from __future__ import annotations

import pytest
import torch

from conftest import make_tiny_model
from ridgeline import LLM, SamplingParams
from ridgeline.errors import InvalidRequestError
from test_multi_token_steps import OPTS, _params, _run, same_as_plain

BASE = dict(dtype="float32", kv_cache_memory="2MiB", progress=False)


@pytest.fixture(scope="module")
def four_layers(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny-4l"), "llama", seed=2, num_hidden_layers=4)


@pytest.fixture(scope="module")
def idle_top(tmp_path_factory):
    """Three layers, the last of which adds nothing to the residual stream (zero output projections):
    its first two layers, norm and head are the whole model."""
    import transformers
    folder = make_tiny_model(tmp_path_factory.mktemp("tiny-idle"), "llama", seed=3, num_hidden_layers=3)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        model.model.layers[2].self_attn.o_proj.weight.zero_()
        model.model.layers[2].mlp.down_proj.weight.zero_()
    model.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("opts", list(OPTS), ids=list(OPTS))
@pytest.mark.parametrize("layers", [1, 3])
def test_greedy_output_is_the_plain_engines(four_layers, layers, opts):
    kw = {**BASE, **OPTS[opts]}
    if opts == "preempt":  # as many tokens as the two-layer model's cache holds
        kw["kv_cache_memory"] = "144KiB"
    params = _params()
    plain = _run(LLM(str(four_layers), **kw), params)
    llm = LLM(str(four_layers), speculative_method="layer-skip", speculative_layers=layers,
              num_speculative_tokens=3, speculative_controller="off", **kw)
    assert f"first {layers} layers" in llm.info.summary()
    same_as_plain(llm, params, plain, opts)


def test_a_draft_that_is_the_target_in_effect_is_accepted(idle_top):
    """The draft reads the target's cache for the layers it runs: were that KV wrong (or the draft's
    own writes left behind), its guesses would part from the target's."""
    params = _params()
    plain = _run(LLM(str(idle_top), **BASE), params)
    llm = LLM(str(idle_top), speculative_method="layer-skip", speculative_layers=2, num_speculative_tokens=4,
              speculative_controller="off", **BASE)
    assert _run(llm, params) == plain
    stats = llm.engine.spec_stats
    assert stats.proposed > 20 and stats.accepted >= 0.9 * stats.proposed


def test_bad_layer_counts_are_start_up_errors(tiny_llama):
    for bad in (2, 5):  # the tiny model has 2 layers
        with pytest.raises(InvalidRequestError, match=r"speculative_layers must be in \[1, 1\]"):
            LLM(str(tiny_llama), speculative_method="layer-skip", speculative_layers=bad, **BASE)
    with pytest.raises(InvalidRequestError, match=">= 1"):
        LLM(str(tiny_llama), speculative_method="layer-skip", speculative_layers=0, **BASE)
    with pytest.raises(InvalidRequestError, match="needs speculative_layers"):
        LLM(str(tiny_llama), speculative_method="layer-skip", **BASE)
    with pytest.raises(InvalidRequestError, match="needs speculative_layers"):
        LLM(str(tiny_llama), speculative_method="ngram", speculative_layers=1, **BASE)


def test_command_line_flags_reach_the_config():
    from ridgeline.cli import build_parser, engine_kwargs
    from ridgeline.config import EngineConfig
    args = build_parser().parse_args(["generate", "hi", "--speculative-method", "layer-skip", "--speculative-layers", "9"])
    spec = EngineConfig.from_kwargs("m", **engine_kwargs(args)).speculative
    assert (spec.method, spec.speculative_layers) == ("layer-skip", 9)
    args = build_parser().parse_args(["serve", "--speculative-method", "eagle", "--draft-model", "/heads/x"])
    spec = EngineConfig.from_kwargs("m", **engine_kwargs(args)).speculative
    assert (spec.method, spec.draft_model) == ("eagle", "/heads/x")
    args = build_parser().parse_args(["generate", "hi", "--speculative-method", "none"])  # said explicitly: off
    spec = EngineConfig.from_kwargs("m", **engine_kwargs(args)).speculative
    assert spec.method is None and spec.methods == ()
    assert EngineConfig.from_kwargs("m", speculative_method="none").speculative.method is None


def test_a_kv_tier_keeps_blocks_the_drafts_grow_into(tiny_llama):
    """A cached block evicted to the CPU tier by a request's table growing for its drafts is stored
    before the drafts write their lookahead KV into it (the step would store it only after), so a
    later prefix hit from the tier gives the plain engine's output."""
    kw = dict(BASE, kv_cache_memory="64KiB", kv_offload="cpu", kv_offload_size="1MiB")
    first = "The meaning of life is " * 4  # its full blocks go to the prefix cache
    others = ["zz " * 10, "Hello hello hello hello", "abcdefghijklmnopqrstuvwxyz"]  # their growth evicts them
    params = SamplingParams(temperature=0, max_tokens=60, ignore_eos=True)

    def session(llm):
        outs = [llm.generate([p], params, use_tqdm=False)[0] for p in [first, *others, first]]
        assert outs[-1].num_tier_cached_tokens > 0  # the second `first` came from the tier
        eng = llm.engine
        eng.kv.check_integrity()
        assert eng.kv.num_free_blocks == eng.kv.num_usable_blocks
        return [o.outputs[0].token_ids for o in outs]

    plain = session(LLM(str(tiny_llama), **kw))
    for k in (3, 8):
        llm = LLM(str(tiny_llama), speculative_method="layer-skip", speculative_layers=1, num_speculative_tokens=k,
                  speculative_controller="off", **kw)
        assert session(llm) == plain
