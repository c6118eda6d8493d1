"""The incremental detokenizer's work per token is bounded: tokens that never complete a UTF-8
character (a client can force them with logit_bias on byte tokens) or that show no text (skipped
special tokens) are held for at most MAX_PENDING tokens, then emitted as U+FFFD / nothing, so the
windows it decodes never grow with the output. Ordinary text, stop strings and streaming are as before."""
from __future__ import annotations

import pytest

from ridgeline.engine.detokenizer import MAX_PENDING, Detokenizer
from ridgeline.sampling_params import SamplingParams
from ridgeline.weights.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tok(tiny_llama) -> Tokenizer:
    return Tokenizer(tiny_llama)


class Counting:
    """The tokenizer, recording the length of every window decoded."""

    def __init__(self, tok: Tokenizer):
        self.tok, self.windows = tok, []

    def decode(self, ids, skip_special_tokens=True):
        self.windows.append(len(ids))
        return self.tok.decode(ids, skip_special_tokens)


def lead_byte_token(tok: Tokenizer) -> int:
    """The byte token 0xE4, which starts a 3-byte UTF-8 character: repeated, none ever completes."""
    first, *rest = tok.encode("\u4e2d", add_special_tokens=False)
    assert len(rest) == 2 and tok.decode([first] * 3) == "\ufffd" * 3
    return first


@pytest.mark.parametrize("kind", ["incomplete", "invisible"])
def test_windows_stay_bounded_when_the_text_never_completes(tok, kind):
    counting = Counting(tok)
    d = Detokenizer(counting, tok.encode("prompt "), SamplingParams())
    token = lead_byte_token(tok) if kind == "incomplete" else tok.eos_id  # </s> is skipped: no text
    streamed = ""
    for i in range(2000):
        d.add(token)
        streamed += d.take(False)
    assert max(counting.windows) <= 2 * MAX_PENDING  # without the bound: the window reaches 2000 tokens
    if kind == "incomplete":  # every byte came out, as a replacement character, a few tokens late
        assert set(streamed) == {"\ufffd"} and 2000 - MAX_PENDING <= len(streamed) <= 2000
    else:
        assert streamed == ""


def test_text_after_a_run_of_broken_bytes_comes_through(tok):
    d = Detokenizer(tok, [], SamplingParams())
    for _ in range(3 * MAX_PENDING):
        d.add(lead_byte_token(tok))
    for t in tok.encode(" and then plain text", add_special_tokens=False):
        d.add(t)
    text = d.take(True)
    assert text.endswith(" and then plain text") and set(text[:-20]) == {"\ufffd"}


def test_multibyte_text_and_stop_strings_stream_as_before(tok):
    text = "héllo 🙂 世界 — ok, and STOP here"
    ids = tok.encode(text, add_special_tokens=False)
    for stop, expected in ((None, text), ("STOP", text[:text.index("STOP")]), ("界 —", text[:text.index("界")])):
        d = Detokenizer(tok, tok.encode("prompt "), SamplingParams(stop=stop))
        streamed, stopped = "", False
        for t in ids:
            stopped = d.add(t)
            chunk = d.take(stopped)
            assert "\ufffd" not in chunk
            streamed += chunk
            if stopped:
                break
        assert streamed == expected and stopped == (stop is not None)
        assert d.text == expected
