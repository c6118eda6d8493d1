"""Engine TokenLogprobs in OpenAI's two shapes: chat (`content` list) and legacy completions."""
from __future__ import annotations

import math

from ridgeline.engine.outputs import TokenLogprob
from ridgeline.weights.tokenizer import Tokenizer

_FLOOR = -9999.0  # JSON has no -Infinity; OpenAI clients expect a number


def _num(x: float) -> float:
    return x if math.isfinite(x) else _FLOOR


def token_text(tok: Tokenizer, token_id: int) -> str:
    return tok.decode([token_id], skip_special_tokens=False)


def _entry(tok: Tokenizer, token_id: int, logprob: float) -> dict:
    text = token_text(tok, token_id)
    return {"token": text, "logprob": _num(logprob), "bytes": list(text.encode("utf-8"))}


def chat_logprobs(tok: Tokenizer, lps: list[TokenLogprob] | None) -> dict | None:
    if lps is None:
        return None
    content = [{**_entry(tok, lp.token_id, lp.logprob),
                "top_logprobs": [_entry(tok, t, v) for t, v in lp.top]} for lp in lps]
    return {"content": content, "refusal": None}


def prompt_logprobs_block(tok: Tokenizer, prompt_ids: list[int], lps: list[TokenLogprob | None]) -> dict:
    """The prompt's tokens in the legacy shape (echo + logprobs): the first has no logprob (null)."""
    tokens = [token_text(tok, t) for t in prompt_ids]
    offsets, at = [], 0
    for t in tokens:
        offsets.append(at)
        at += len(t)
    return {"tokens": tokens, "token_logprobs": [None if lp is None else _num(lp.logprob) for lp in lps],
            "top_logprobs": [None if lp is None else {token_text(tok, t): _num(v) for t, v in lp.top} for lp in lps],
            "text_offset": offsets}


def join_logprobs(first: dict | None, second: dict | None) -> dict | None:
    if first is None or second is None:
        return first or second
    return {k: first[k] + second[k] for k in first}


def completion_logprobs(tok: Tokenizer, lps: list[TokenLogprob] | None, text_offset: int) -> dict | None:
    """text_offset: characters of text before the first of these tokens."""
    if lps is None:
        return None
    tokens = [token_text(tok, lp.token_id) for lp in lps]
    offsets = []
    for t in tokens:
        offsets.append(text_offset)
        text_offset += len(t)
    return {"tokens": tokens, "token_logprobs": [_num(lp.logprob) for lp in lps],
            "top_logprobs": [{token_text(tok, t): _num(v) for t, v in lp.top} for lp in lps],
            "text_offset": offsets}
