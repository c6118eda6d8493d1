"""The offline API validates like the server: SamplingParams is frozen and checks every value
against what the engine can hold; wrong types and invalid text anywhere raise InvalidRequestError
naming the field, never a bare TypeError / ValueError / AttributeError; nothing leaks."""
from __future__ import annotations

import dataclasses

import pytest

from ridgeline import LLM, SamplingParams
from ridgeline.errors import InvalidRequestError
from ridgeline.inputs import chat_messages, find_bad_text
from ridgeline.sampling_params import INT64_MAX, MAX_STOP_STRING_CHARS, MAX_STOP_STRINGS

BAD_PARAMS = [  # kwargs, param named
    ({"seed": 2**70}, "seed"),
    ({"seed": 10**5000}, "seed"),  # past the digits str() converts
    ({"seed": INT64_MAX, "n": 2}, "seed"),  # choice 1 would be seeded with seed + 1
    ({"seed": -(2**63) - 1}, "seed"),
    ({"seed": 1.5}, "seed"),
    ({"top_k": 2**70}, "top_k"),
    ({"top_k": -2}, "top_k"),
    ({"n": 2**70}, "n"),
    ({"n": True}, "n"),
    ({"max_tokens": 2**70 * -1}, "max_tokens"),
    ({"min_tokens": 2**70}, "min_tokens"),
    ({"stop_token_ids": [2**70]}, "stop_token_ids"),
    ({"stop_token_ids": [-1]}, "stop_token_ids"),
    ({"stop_token_ids": "12"}, "stop_token_ids"),
    ({"stop_token_ids": list(range(2000))}, "stop_token_ids"),
    ({"logprobs": 21}, "logprobs"),
    ({"logprobs": 2**70}, "logprobs"),
    ({"temperature": 1e39}, "temperature"),  # inf in float32
    ({"temperature": 10**400}, "temperature"),
    ({"temperature": float("inf")}, "temperature"),
    ({"repetition_penalty": 1e-300}, "repetition_penalty"),  # 0 in float32: a division by zero
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"min_p": "0.1"}, "min_p"),
    ({"stop": 5}, "stop"),
    ({"stop": [1]}, "stop"),
    ({"stop": b"x"}, "stop"),
    ({"stop": ["a"] * (MAX_STOP_STRINGS + 1)}, "stop"),
    ({"stop": ["a" * (MAX_STOP_STRING_CHARS + 1)]}, "stop"),
    ({"stop": ["ok", "\ud800"]}, "stop"),
    ({"ignore_eos": "yes"}, "ignore_eos"),
    ({"skip_special_tokens": 1}, "skip_special_tokens"),
    ({"include_stop_str_in_output": None}, "include_stop_str_in_output"),
    ({"logit_bias": [1, 2]}, "logit_bias"),
    ({"logit_bias": {"5": 1.0}}, "logit_bias"),
    ({"logit_bias": {-1: 1.0}}, "logit_bias"),
    ({"logit_bias": {5: 100.5}}, "logit_bias"),
    ({"logit_bias": {5: float("nan")}}, "logit_bias"),
    ({"logit_bias": {i: 1.0 for i in range(2000)}}, "logit_bias"),
    ({"best_of": 3}, "best_of"),
    ({"best_of": 2, "n": 1}, "best_of"),
]


@pytest.mark.parametrize("kwargs,param", BAD_PARAMS, ids=[f"{p}-{i}" for i, (_, p) in enumerate(BAD_PARAMS)])
def test_bad_sampling_params_name_the_field(kwargs, param):
    with pytest.raises(InvalidRequestError) as e:
        SamplingParams(**kwargs)
    assert e.value.param == param and str(e.value).startswith(param)
    str(e.value).encode("utf-8")  # the message itself is always valid text


def test_edges_of_the_ranges_are_accepted():
    SamplingParams(seed=INT64_MAX)
    SamplingParams(seed=INT64_MAX - 3, n=4)
    SamplingParams(seed=-(2**63), n=128)
    SamplingParams(top_k=INT64_MAX, top_p=0, min_p=1, logprobs=20, stop=["a" * MAX_STOP_STRING_CHARS] * 64)
    assert SamplingParams(best_of=3, n=3).n == 3
    assert SamplingParams(logit_bias={9: 100, 3: -100.0}).logit_bias == ((3, -100.0), (9, 100.0))


def test_sampling_params_are_frozen_and_replace_revalidates():
    p = SamplingParams(n=2, stop="x", stop_token_ids=[3], logit_bias={1: 2})
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.n = 0  # used to make generate() loop forever
    assert p.stop == ("x",) and p.stop_token_ids == (3,) and isinstance(hash(p), int)
    q = dataclasses.replace(p, n=3)
    assert (q.n, q.stop, q.logit_bias) == (3, ("x",), ((1, 2.0),)) and p.n == 2
    with pytest.raises(InvalidRequestError) as e:
        dataclasses.replace(p, n=0)
    assert e.value.param == "n"


def test_find_bad_text_walks_keys_and_nesting():
    assert find_bad_text({"a": [1, "ok", {"b": ["x", "\udfff"]}]}) == ("a.2.b.1", "\udfff", 0)
    assert find_bad_text({"ok": 1, "k\ud800": 2})[0] == "k\\ud800"  # shown escaped
    deep = "\ud800"
    for _ in range(5000):  # deeper than Python's recursion limit: the walk is iterative
        deep = [deep]
    assert find_bad_text({"x": deep})[0].startswith("x.0.0")
    assert find_bad_text({"prompt": list(range(10**5)), "text": "héllo ✓"}) is None


@pytest.fixture(scope="module")
def llm(tiny_llama):
    return LLM(str(tiny_llama), progress=False, dtype="float32", kv_cache_memory="1MiB")


BAD_PROMPTS = [5.0, None, b"hi", [1.5], [None], ["a", 1], ["a", [1, "x"]], ["a", [[1]]], [[]], {"prompt": "a"},
               "\ud800", ["fine", "x\udc00y"], [True, 1]]


@pytest.mark.parametrize("prompts", BAD_PROMPTS, ids=[repr(p)[:20] for p in BAD_PROMPTS])
def test_bad_prompts_raise_invalid_request_naming_them(llm, prompts):
    with pytest.raises(InvalidRequestError) as e:
        llm.generate(prompts, SamplingParams(max_tokens=2), use_tqdm=False)
    assert e.value.param == "prompts"
    assert not llm.engine.has_unfinished()


@pytest.mark.parametrize("params,param", [({"temperature": 0}, "sampling_params"),
                                          ([SamplingParams()] * 3, "sampling_params"),
                                          ("greedy", "sampling_params")])
def test_bad_sampling_params_argument(llm, params, param):
    with pytest.raises(InvalidRequestError) as e:
        llm.generate(["a", "b"], params, use_tqdm=False)
    assert e.value.param == param


def test_engine_checks_what_needs_the_model(llm):
    with pytest.raises(InvalidRequestError) as e:
        llm.generate("a", SamplingParams(logit_bias={llm.engine.arch.vocab_size: 5}), use_tqdm=False)
    assert e.value.param == "logit_bias" and str(llm.engine.arch.vocab_size) in str(e.value)
    edge = SamplingParams(seed=INT64_MAX - 1, n=2, top_k=2**62, max_tokens=4, ignore_eos=True)
    outs = llm.generate(["a", "b"], [edge, SamplingParams(seed=-(2**63), max_tokens=4, ignore_eos=True)],
                        use_tqdm=False)
    assert [len(c.token_ids) for o in outs for c in o.outputs] == [4, 4, 4]
    eng = llm.engine
    eng.kv.check_integrity()
    assert eng.kv.num_free_blocks == eng.kv.num_usable_blocks


def test_tiny_temperature_decodes_greedily(llm):
    greedy = llm.generate("once", SamplingParams(temperature=0, max_tokens=12, ignore_eos=True), use_tqdm=False)
    tiny = llm.generate("once", SamplingParams(temperature=1e-300, seed=3, max_tokens=12, ignore_eos=True),
                        use_tqdm=False)
    assert tiny[0].outputs[0].token_ids == greedy[0].outputs[0].token_ids


def test_logit_bias_offline(llm):
    base = llm.generate("abc", SamplingParams(temperature=0, max_tokens=6, ignore_eos=True), use_tqdm=False)[0]
    first = base.outputs[0].token_ids[0]
    forced = llm.generate("abc", SamplingParams(temperature=0.9, seed=1, max_tokens=6, ignore_eos=True,
                                                logit_bias={65: 100}), use_tqdm=False)[0]
    assert forced.outputs[0].token_ids == [65] * 6
    banned = llm.generate("abc", SamplingParams(temperature=0, max_tokens=6, ignore_eos=True,
                                                logit_bias={first: -100}), use_tqdm=False)[0]
    assert first not in banned.outputs[0].token_ids


BAD_MESSAGES = [  # messages, what the message names
    ([], "messages"),
    ("hi", "messages"),
    ([{"role": "user"}, "hi"], "messages.1"),
    ([{"role": "wizard", "content": "hi"}], "messages.0.role"),
    ([{"role": "user", "content": 5}], "messages.0.content"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], "messages.0.content"),
    ([{"role": "user", "content": [{"type": "text", "text": 3}]}], "messages.0.content"),
    ([{"role": "user", "content": "a\ud800"}], "messages.0.content"),
    ([{"role": "user", "content": [{"type": "text", "text": "\udc00"}]}], "messages.0.content.0.text"),
]


@pytest.mark.parametrize("messages,where", BAD_MESSAGES, ids=[w + str(i) for i, (_, w) in enumerate(BAD_MESSAGES)])
def test_chat_validates_messages_like_the_server(llm, messages, where):
    with pytest.raises(InvalidRequestError) as e:
        llm.chat(messages, SamplingParams(max_tokens=2), use_tqdm=False)
    assert e.value.param == "messages" and str(e.value).startswith(where)


def test_chat_accepts_text_parts_like_the_server(llm):
    params = SamplingParams(temperature=0, max_tokens=5)
    parts = [{"role": "developer", "content": [{"type": "text", "text": "be"}, {"type": "text", "text": "brief"}]},
             {"role": "user", "content": "hi"}, {"role": "assistant", "content": None}]
    plain = [{"role": "system", "content": "be\nbrief"}, {"role": "user", "content": "hi"},
             {"role": "assistant", "content": ""}]
    assert chat_messages(parts) == plain
    a, b = llm.chat([parts, plain], params, use_tqdm=False)
    assert a.prompt_token_ids == b.prompt_token_ids and a.outputs[0].token_ids == b.outputs[0].token_ids
