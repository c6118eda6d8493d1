"""Engine TokenLogprobs in OpenAI's two shapes, chat (`content` list) and legacy completions, as
JSON text (json_body.Raw): a response of a million entries is then strings, not a million dicts
for the garbage collector to walk. Each token id's text is decoded and quoted once per response
(TokenTexts): neighbouring tokens' alternatives repeat a lot."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from ridgeline.engine.outputs import TokenLogprob
from ridgeline.serve.json_body import Raw
from ridgeline.weights.tokenizer import Tokenizer

_FLOOR = "-9999.0"  # JSON has no -Infinity; OpenAI clients expect a number


def _num(x: float) -> str:
    x = float(x)
    return repr(x) if math.isfinite(x) else _FLOOR  # repr: what json.dumps writes for a float


class TokenTexts:
    """Token id -> its text, quoted as JSON, and its chat entry's parts; decoded once. One per
    response or stream: it holds at most the ids that response names."""

    def __init__(self, tok: Tokenizer):
        self.tok = tok
        self._texts: dict[int, tuple[str, int]] = {}
        self._entry: dict[int, tuple[str, str]] = {}

    def _text(self, token_id: int) -> str:
        return self.tok.decode([token_id], skip_special_tokens=False)

    def quoted(self, token_id: int) -> tuple[str, int]:
        """(the text as a JSON string, its length in characters)"""
        found = self._texts.get(token_id)
        if found is None:
            text = self._text(token_id)
            found = self._texts[token_id] = (json.dumps(text, ensure_ascii=False), len(text))
        return found

    def entry(self, token_id: int) -> tuple[str, str]:
        """A chat entry {"token", "logprob", "bytes"} around its logprob: (before, after)."""
        parts = self._entry.get(token_id)
        if parts is None:
            raw = list(self._text(token_id).encode("utf-8"))
            parts = self._entry[token_id] = ('{"token":' + self.quoted(token_id)[0] + ',"logprob":',
                                             ',"bytes":' + json.dumps(raw, separators=(",", ":")))
        return parts


def chat_logprobs(texts: TokenTexts, lps: list[TokenLogprob] | None) -> Raw | None:
    """{"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}], "refusal": null}"""
    if lps is None:
        return None
    content = []
    for lp in lps:
        before, after = texts.entry(lp.token_id)
        top = []
        for t, v in lp.top:
            b, a = texts.entry(t)
            top.append(f"{b}{_num(v)}{a}}}")
        content.append(f'{before}{_num(lp.logprob)}{after},"top_logprobs":[{",".join(top)}]}}')
    return Raw('{"content":[' + ",".join(content) + '],"refusal":null}')


@dataclass
class LegacyLogprobs:
    """The legacy block's four lists, each item already JSON text; join() appends another block."""
    tokens: list[str] = field(default_factory=list)
    token_logprobs: list[str] = field(default_factory=list)
    top_logprobs: list[str] = field(default_factory=list)
    text_offset: list[str] = field(default_factory=list)

    def join(self, other: LegacyLogprobs) -> LegacyLogprobs:
        return LegacyLogprobs(*(getattr(self, k) + getattr(other, k) for k in _LEGACY_KEYS))

    def raw(self) -> Raw:
        return Raw("{" + ",".join(f'"{k}":[' + ",".join(getattr(self, k)) + "]" for k in _LEGACY_KEYS) + "}")


_LEGACY_KEYS = ("tokens", "token_logprobs", "top_logprobs", "text_offset")


def _legacy(texts: TokenTexts, ids: list[int], lps: list[TokenLogprob | None], text_offset: int) -> LegacyLogprobs:
    block = LegacyLogprobs()
    for token_id, lp in zip(ids, lps):
        q, length = texts.quoted(token_id)
        block.tokens.append(q)
        block.text_offset.append(str(text_offset))
        text_offset += length
        if lp is None:  # the prompt's first token: nothing before it to condition on
            block.token_logprobs.append("null")
            block.top_logprobs.append("null")
            continue
        block.token_logprobs.append(_num(lp.logprob))
        top = {texts.quoted(t)[0]: _num(v) for t, v in lp.top}  # equal texts are one key, the last value
        block.top_logprobs.append("{" + ",".join(f"{k}:{v}" for k, v in top.items()) + "}")
    return block


def prompt_logprobs_block(texts: TokenTexts, prompt_ids: list[int], lps: list[TokenLogprob | None]) -> LegacyLogprobs:
    """The prompt's tokens in the legacy shape (echo + logprobs): the first has no logprob (null)."""
    return _legacy(texts, prompt_ids, lps, 0)


def join_logprobs(first: LegacyLogprobs | None, second: LegacyLogprobs | None) -> Raw | None:
    """The echoed prompt's block then the completion's, as JSON (None if neither)."""
    return as_raw(second if first is None else first if second is None else first.join(second))


def as_raw(block: LegacyLogprobs | None) -> Raw | None:
    return None if block is None else block.raw()


def completion_logprobs(texts: TokenTexts, lps: list[TokenLogprob] | None,
                        text_offset: int) -> LegacyLogprobs | None:
    """text_offset: characters of text before the first of these tokens."""
    if lps is None:
        return None
    return _legacy(texts, [lp.token_id for lp in lps], lps, text_offset)
