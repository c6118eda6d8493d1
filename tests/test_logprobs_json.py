"""The logprob blocks written as JSON text parse to exactly what the plain dict-building shapes
give (OpenAI's chat `content` list and the legacy four lists), non-finite logprobs floored,
partial-byte tokens and alternatives whose texts collide included; bodies splice them unquoted."""
from __future__ import annotations

import json
import math
import random

import pytest

from ridgeline.engine.outputs import TokenLogprob
from ridgeline.serve.json_body import Raw, dumps, object_bytes
from ridgeline.serve.logprobs import (TokenTexts, as_raw, chat_logprobs, completion_logprobs, join_logprobs,
                                      prompt_logprobs_block)
from ridgeline.weights.tokenizer import Tokenizer


def num(x):
    return x if math.isfinite(x) else -9999.0


@pytest.fixture(scope="module")
def tok(tiny_llama):
    return Tokenizer(tiny_llama)


def text(tok, t):
    return tok.decode([t], skip_special_tokens=False)


def reference_chat(tok, lps):
    def entry(t, v):
        s = text(tok, t)
        return {"token": s, "logprob": num(v), "bytes": list(s.encode("utf-8"))}
    return {"content": [{**entry(lp.token_id, lp.logprob), "top_logprobs": [entry(t, v) for t, v in lp.top]}
                        for lp in lps], "refusal": None}


def reference_legacy(tok, ids, lps, offset):
    tokens = [text(tok, t) for t in ids]
    offsets = []
    for s in tokens:
        offsets.append(offset)
        offset += len(s)
    return {"tokens": tokens, "token_logprobs": [None if lp is None else num(lp.logprob) for lp in lps],
            "top_logprobs": [None if lp is None else {text(tok, t): num(v) for t, v in lp.top} for lp in lps],
            "text_offset": offsets}


def sample(tok, count: int, seed: int) -> list[TokenLogprob]:
    rng = random.Random(seed)
    ids = list(range(tok.vocab_size))  # byte tokens: many decode to U+FFFD alone, so texts collide
    values = [-0.5, -1e-9, -123.25, -math.inf, math.nan, 0.0]
    return [TokenLogprob(rng.choice(ids), rng.choice(values) if rng.random() < 0.3 else -rng.random() * 10,
                         [(rng.choice(ids), -rng.random() * 20) for _ in range(rng.randrange(0, 6))])
            for _ in range(count)]


@pytest.mark.parametrize("seed", range(5))
def test_chat_and_legacy_blocks_parse_to_the_reference(tok, seed):
    lps = sample(tok, 40, seed)
    texts = TokenTexts(tok)
    assert json.loads(chat_logprobs(texts, lps)) == reference_chat(tok, lps)
    assert json.loads(as_raw(completion_logprobs(texts, lps, 7))) == reference_legacy(
        tok, [lp.token_id for lp in lps], lps, 7)
    prompt = [lp.token_id for lp in lps[:10]]
    scored = [None] + lps[1:10]
    echo = prompt_logprobs_block(texts, prompt, scored)
    joined = json.loads(join_logprobs(echo, completion_logprobs(texts, lps[10:], 3)))
    expected = {k: reference_legacy(tok, prompt, scored, 0)[k] + reference_legacy(
        tok, [lp.token_id for lp in lps[10:]], lps[10:], 3)[k] for k in joined}
    assert joined == expected
    assert chat_logprobs(texts, None) is None and join_logprobs(None, None) is None


def test_bodies_splice_raw_json_and_quote_everything_else():
    choice = {"index": 0, "text": 'a "quoted" é', "logprobs": Raw('{"x":[1,2]}'), "finish_reason": None}
    body = json.loads(object_bytes({"id": "x"}, iter([choice, {**choice, "index": 1}]), {"usage": {"n": 1}}))
    assert body == {"id": "x", "choices": [{**choice, "logprobs": {"x": [1, 2]}},
                                           {**choice, "index": 1, "logprobs": {"x": [1, 2]}}], "usage": {"n": 1}}
    assert json.loads(dumps({"a": [Raw("[1]"), {"b": Raw("null")}], "c": ["plain"]})) == \
        {"a": [[1], {"b": None}], "c": ["plain"]}
    with pytest.raises(ValueError):
        dumps({"nan": math.nan})  # never an invalid JSON body
