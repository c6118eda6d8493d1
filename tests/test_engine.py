"""Engine behaviour on a tiny model: sampling options, stops, n > 1, logprobs, bad input."""
from __future__ import annotations

import math

import pytest
import torch

from ridgeline import LLM, SamplingParams
from ridgeline.errors import InvalidRequestError, ModelLoadError, PromptTooLongError, UnsupportedArchitectureError

PROMPTS = ["Once upon a time", "The meaning of life is", "x"]


@pytest.fixture(scope="module")
def llm(tiny_llama):
    return LLM(str(tiny_llama), dtype="float32", kv_cache_memory="2MiB", max_num_batched_tokens=64)


def texts(outs):
    return [[c.text for c in o.outputs] for o in outs]


def test_seeded_sampling_is_reproducible_across_batch_compositions(llm):
    p = SamplingParams(temperature=1.0, top_p=0.9, seed=1234, max_tokens=20, ignore_eos=True)
    alone = llm.generate(PROMPTS[0], p, use_tqdm=False)[0].outputs[0].token_ids
    again = llm.generate(PROMPTS[0], p, use_tqdm=False)[0].outputs[0].token_ids
    unseeded = SamplingParams(temperature=1.0, max_tokens=20, ignore_eos=True)
    mixed = llm.generate([PROMPTS[1], PROMPTS[0], PROMPTS[2]], [unseeded, p, unseeded], use_tqdm=False)
    assert alone == again == mixed[1].outputs[0].token_ids
    other = llm.generate(PROMPTS[0], SamplingParams(temperature=1.0, seed=99, max_tokens=20, ignore_eos=True),
                         use_tqdm=False)[0].outputs[0].token_ids
    assert other != alone


def test_top_k_1_equals_greedy(llm):
    greedy = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True), use_tqdm=False)
    topk1 = llm.generate(PROMPTS, SamplingParams(temperature=1.5, top_k=1, max_tokens=16, ignore_eos=True),
                         use_tqdm=False)
    assert [o.outputs[0].token_ids for o in greedy] == [o.outputs[0].token_ids for o in topk1]


def test_n_samples_share_prompt_and_differ(llm):
    prompt = "abcdefghijklmnopqrstuvwxyz" * 2  # > 3 blocks of prompt to share
    out = llm.generate(prompt, SamplingParams(n=4, temperature=1.0, seed=7, max_tokens=12, ignore_eos=True),
                       use_tqdm=False)[0]
    assert [c.index for c in out.outputs] == [0, 1, 2, 3]
    assert all(len(c.token_ids) == 12 for c in out.outputs)
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1
    greedy = llm.generate(prompt, SamplingParams(n=3, temperature=0, max_tokens=12, ignore_eos=True),
                          use_tqdm=False)[0]
    single = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
                          use_tqdm=False)[0]
    assert all(c.token_ids == single.outputs[0].token_ids for c in greedy.outputs)
    llm.engine.kv.check_integrity()
    assert llm.engine.kv.num_free_blocks == llm.engine.kv.num_usable_blocks


def test_stop_strings_are_not_emitted_and_work_across_tokens(llm):
    base = llm.generate(PROMPTS[1], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True),
                        use_tqdm=False)[0].outputs[0]
    text = base.text
    assert len(text) > 6
    stop = text[3:6]  # spans several byte tokens
    out = llm.generate(PROMPTS[1], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, stop=[stop]),
                       use_tqdm=False)[0].outputs[0]
    assert out.text == text[:text.index(stop)]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    incl = llm.generate(PROMPTS[1], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, stop=stop,
                                                   include_stop_str_in_output=True), use_tqdm=False)
    assert incl[0].outputs[0].text == text[:text.index(stop) + len(stop)]


def test_stop_token_ids_and_max_tokens(llm):
    base = llm.generate(PROMPTS[0], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True),
                        use_tqdm=False)[0].outputs[0]
    assert base.finish_reason == "length" and len(base.token_ids) == 10
    tid = base.token_ids[4]
    out = llm.generate(PROMPTS[0], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True,
                                                  stop_token_ids=[tid]), use_tqdm=False)[0].outputs[0]
    first = base.token_ids.index(tid)
    assert out.token_ids == base.token_ids[:first + 1]
    assert out.finish_reason == "stop" and out.stop_reason == tid


def test_logprobs_match_log_softmax_of_the_model(llm, tiny_llama):
    import transformers
    ref = transformers.AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()
    out = llm.generate(PROMPTS[0], SamplingParams(temperature=0, max_tokens=3, logprobs=5, ignore_eos=True),
                       use_tqdm=False)[0]
    ids = out.prompt_token_ids + out.outputs[0].token_ids
    with torch.no_grad():
        lsm = torch.log_softmax(ref(torch.tensor([ids])).logits[0].float(), -1)
    for i, lp in enumerate(out.outputs[0].logprobs):
        row = lsm[len(out.prompt_token_ids) - 1 + i]
        assert lp.token_id == out.outputs[0].token_ids[i]
        assert math.isclose(lp.logprob, row[lp.token_id].item(), abs_tol=1e-3)
        assert [t for t, _ in lp.top] == row.topk(5).indices.tolist()


def test_chat_applies_template(llm):
    out = llm.chat([{"role": "user", "content": "hi"}], SamplingParams(temperature=0, max_tokens=4),
                   use_tqdm=False)[0]
    assert out.prompt.startswith("<s>user\nhi</s>")
    assert out.prompt_token_ids == llm.tokenizer.encode(out.prompt, add_special_tokens=False)


@pytest.mark.parametrize("kwargs,param", [
    ({"temperature": -0.1}, "temperature"), ({"top_p": -0.1}, "top_p"), ({"top_p": 1.5}, "top_p"),
    ({"max_tokens": 0}, "max_tokens"), ({"n": 0}, "n"), ({"temperature": float("nan")}, "temperature"),
    ({"top_k": -2}, "top_k"), ({"logprobs": 100}, "logprobs"), ({"max_tokens": "5"}, "max_tokens"),
])
def test_invalid_sampling_params(kwargs, param):
    with pytest.raises(InvalidRequestError) as e:
        SamplingParams(**kwargs)
    assert e.value.param == param and param in str(e.value)


def test_bad_prompts_fail_cleanly_and_leak_nothing(llm):
    eng = llm.engine
    with pytest.raises(InvalidRequestError, match="empty"):
        llm.generate("", SamplingParams())
    with pytest.raises(InvalidRequestError, match="token ids"):
        llm.generate([[1, 2, 10**6]], SamplingParams())
    too_long = [5] * (eng.max_model_len + 3)
    with pytest.raises(PromptTooLongError) as e:
        llm.generate([too_long], SamplingParams())
    assert str(eng.max_model_len) in str(e.value) and str(len(too_long)) in str(e.value)
    # a bad request in a batch: nothing is left behind and the next batch still runs
    with pytest.raises(InvalidRequestError):
        llm.generate(["fine", ""], SamplingParams(max_tokens=4))
    assert not eng.has_unfinished()
    out = llm.generate(["fine"], SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 4
    eng.kv.check_integrity()
    assert eng.kv.num_free_blocks == eng.kv.num_usable_blocks


def test_unknown_architecture_and_missing_files(tmp_path, tiny_llama):
    import json
    import shutil
    bad = tmp_path / "bad"
    shutil.copytree(tiny_llama, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["architectures"] = ["FancyNetForCausalLM"]
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedArchitectureError, match="LlamaForCausalLM"):
        LLM(str(bad))
    trunc = tmp_path / "trunc"
    shutil.copytree(tiny_llama, trunc)
    weights = trunc / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(ModelLoadError, match="model.safetensors"):
        LLM(str(trunc), dtype="float32")
    with pytest.raises(ModelLoadError, match="known aliases"):
        LLM("no-such-model-alias")
    with pytest.raises(ModelLoadError, match="does not exist"):
        LLM(str(tmp_path / "missing.gguf"))


def test_incremental_detokenizer_never_emits_broken_utf8(llm):
    from ridgeline.engine.detokenizer import Detokenizer
    tok = llm.tokenizer
    text = "héllo 🙂 世界 — ok"
    ids = tok.encode(text)
    assert len(ids) > len(text)  # byte-level: multi-byte characters span several tokens
    d = Detokenizer(tok, tok.encode("prompt "), SamplingParams())
    seen = []
    for t in ids:
        d.add(t)
        assert "\ufffd" not in d.text
        seen.append(d.text)
    assert d.text == text
    assert all(text.startswith(s) for s in seen)


def test_bfloat16_engine_agrees_with_float32_on_clear_choices(tiny_llama):
    """bf16 weights and KV cache (fp32 activations on a CPU): the tiny model's greedy choices have
    wide margins, so the first tokens match the fp32 engine's."""
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    f32 = LLM(str(tiny_llama), dtype="float32", kv_cache_memory="2MiB").generate(PROMPTS, params, use_tqdm=False)
    bf = LLM(str(tiny_llama), dtype="bfloat16", kv_cache_memory="2MiB")
    assert bf.engine.runner.kv[0].k.dtype == torch.bfloat16
    b16 = bf.generate(PROMPTS, params, use_tqdm=False)
    assert [o.outputs[0].token_ids[:2] for o in f32] == [o.outputs[0].token_ids[:2] for o in b16]


def _without(tmp_path, folder, tensor: str):
    """A copy of the model folder whose checkpoint lacks one tensor."""
    import shutil

    from safetensors.torch import load_file, save_file
    bad = tmp_path / "without"
    shutil.copytree(folder, bad)
    weights = load_file(bad / "model.safetensors")
    del weights[tensor]
    save_file(weights, bad / "model.safetensors")
    return bad


def test_a_missing_shard_of_a_fused_projection_is_reported(tmp_path, tiny_llama):
    bad = _without(tmp_path, tiny_llama, "model.layers.0.self_attn.q_proj.weight")
    with pytest.raises(ModelLoadError, match="qkv_proj.weight\\[shard 0\\]"):
        LLM(str(bad), dtype="float32")


def test_a_missing_embedding_table_is_reported_not_left_uninitialized(tmp_path, tiny_llama):
    """The embedding is built without a random init (the checkpoint fills it): a checkpoint without
    it must fail to load rather than run on whatever memory the table got."""
    bad = _without(tmp_path, tiny_llama, "model.embed_tokens.weight")
    with pytest.raises(ModelLoadError, match="embed_tokens"):
        LLM(str(bad), dtype="float32")
