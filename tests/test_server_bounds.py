"""What one request may make the server spend: --max-n, --max-logprob-entries (prompt logprobs
included), admission counted before tokenizing (a flood gets its 429 before the tokenizer runs),
text too long for any prompt that fits refused before the tokenizer sees it, and non-streamed
responses built on the executor, not the event loop. Each refusal names its limit."""
from __future__ import annotations

import threading

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from server_helpers import SAFETY_S

from ridgeline.cli import main
from ridgeline.config import EngineConfig
from ridgeline.engine.llm_engine import LLMEngine
from ridgeline.serve import chat, completions
from ridgeline.serve.app import build_app
from ridgeline.serve.server import ServerThread
from ridgeline.serve.state import ServerSettings

CHAT, CMPL = "/v1/chat/completions", "/v1/completions"


@pytest.fixture(scope="module")
def engine(tiny_llama):
    return LLMEngine(EngineConfig.from_kwargs(str(tiny_llama), progress=False, dtype="float32",
                                              kv_cache_memory="2MiB"))


@pytest.fixture(scope="module")
def server(engine):
    settings = ServerSettings("tiny", quiet=True, max_n=2, max_logprob_entries=100, max_waiting=4)
    with ServerThread(build_app(engine, settings)) as s:
        yield s


def post(server, route: str, **body) -> httpx.Response:
    base = {"model": "tiny", "temperature": 0, "ignore_eos": True}
    if route == CHAT:
        base["messages"] = [{"role": "user", "content": "hi"}]
    else:
        base["prompt"] = "hi"
    return httpx.post(server.url + route, json={**base, **body}, timeout=SAFETY_S)


def refused(r: httpx.Response, param: str, needle: str) -> dict:
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and needle in err["message"] and err["type"] == "invalid_request_error", err
    return err


def test_n_over_max_n_is_a_400_naming_the_flag(server):
    assert post(server, CMPL, n=2, max_tokens=2).status_code == 200
    refused(post(server, CMPL, n=3, max_tokens=2), "n", "--max-n")
    refused(post(server, CHAT, n=3, max_tokens=2), "n", "--max-n")


def test_logprob_entries_are_counted_before_anything_runs(server):
    # n x max_tokens x (1 + top): 2 x 10 x 5 = 100 is the limit exactly
    ok = post(server, CHAT, n=2, max_tokens=10, logprobs=True, top_logprobs=4)
    assert ok.status_code == 200 and all(len(c["logprobs"]["content"]) == 10 for c in ok.json()["choices"])
    err = refused(post(server, CHAT, n=2, max_tokens=11, logprobs=True, top_logprobs=4), "logprobs",
                  "--max-logprob-entries 100")
    assert "110" in err["message"] and err["code"] == "logprobs_limit_exceeded"
    # no max_tokens: what the context leaves counts
    refused(post(server, CHAT, logprobs=True, top_logprobs=0), "logprobs", "--max-logprob-entries")
    # echo: every choice repeats the prompt's 10 tokens and their alternatives: 2 x (1 + 10) x 5 = 110
    prompt = "abcdefghij"
    assert post(server, CMPL, prompt=prompt, echo=True, logprobs=4, max_tokens=1).status_code == 200
    refused(post(server, CMPL, prompt=prompt, echo=True, logprobs=4, max_tokens=1, n=2), "logprobs",
            "--max-logprob-entries")
    assert post(server, CHAT, n=2, max_tokens=200).status_code == 200  # no logprobs: no such limit


def test_admission_counts_a_request_while_it_is_tokenized(server, engine):
    """A request held in the tokenizer holds its 3 sequences: the next one (2 more, over
    --max-waiting 4) is refused with 429 and never reaches the tokenizer."""
    tok = engine.tokenizer
    encode, entered, release, seen = tok.encode, threading.Event(), threading.Event(), []

    def held(text, *a, **k):
        seen.append(text)
        if text.startswith("HELD"):
            entered.set()
            assert release.wait(SAFETY_S)
        return encode(text, *a, **k)

    tok.encode = held
    try:
        done: list[httpx.Response] = []
        first = threading.Thread(target=lambda: done.append(post(server, CMPL, prompt="HELD", n=2, max_tokens=2)))
        second = threading.Thread(target=lambda: done.append(post(server, CMPL, prompt=["HELD", "x"], max_tokens=2)))
        first.start()
        assert entered.wait(SAFETY_S)  # 2 sequences held
        second.start()  # 2 more: 4, at the limit, admitted; its "HELD" waits too
        while sum(t.startswith("HELD") for t in seen) < 2:
            assert second.is_alive()
            threading.Event().wait(0.01)
        busy = post(server, CMPL, prompt="flood", max_tokens=2)
        assert busy.status_code == 429 and "--max-waiting 4" in busy.json()["error"]["message"]
        assert busy.headers["retry-after"] == "1" and "flood" not in seen  # refused before the tokenizer
        release.set()
        first.join(SAFETY_S)
        second.join(SAFETY_S)
        assert [r.status_code for r in done] == [200, 200]
        assert post(server, CMPL, prompt="flood", max_tokens=2).status_code == 200  # the hold is released
    finally:
        release.set()
        del tok.encode


def test_text_that_can_never_fit_is_refused_before_the_tokenizer(server, engine):
    tok = engine.tokenizer
    bound = server.app.state.ridgeline.text_bound
    assert bound.max_chars == engine.max_model_len * tok.max_bytes_per_token  # 512 x 4: `</s>` is the longest
    calls = []
    encode = tok.encode
    tok.encode = lambda text, *a, **k: calls.append(len(text)) or encode(text, *a, **k)
    try:
        err = refused(post(server, CMPL, prompt="x" * (bound.max_chars + 1), max_tokens=1), "prompt",
                      f"can never fit this model's context of {engine.max_model_len} tokens")
        assert err["code"] == "context_length_exceeded" and calls == []
        refused(post(server, CMPL, prompt=["ok", "y" * (bound.max_chars + 1)], max_tokens=1), "prompt", "never fit")
        assert calls == []
        long = post(server, CMPL, prompt="x" * bound.max_chars, max_tokens=1)  # within the bound: tokenized
        assert long.status_code == 400 and long.json()["error"]["code"] == "context_length_exceeded"
        assert calls == [bound.max_chars]
    finally:
        del tok.encode


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1, max_size=200))
def test_the_text_bound_never_refuses_a_prompt_that_fits(engine, text):
    """Tokens x max_bytes_per_token >= the text's UTF-8 bytes >= its characters, for any text."""
    tok = engine.tokenizer
    assert len(tok.encode(text)) * tok.max_bytes_per_token >= len(text.encode("utf-8", "surrogatepass"))


@pytest.mark.parametrize("route,module", [(CHAT, chat), (CMPL, completions)])
def test_non_streamed_bodies_are_built_off_the_event_loop(server, monkeypatch, route, module):
    threads = []
    build = module.object_bytes

    def recording(*a, **k):
        threads.append(threading.current_thread().name)
        return build(*a, **k)

    monkeypatch.setattr(module, "object_bytes", recording)
    lps = {"logprobs": True, "top_logprobs": 2} if route == CHAT else {"logprobs": 2}
    r = post(server, route, n=2, max_tokens=3, **lps)
    assert r.status_code == 200 and len(r.json()["choices"]) == 2
    assert r.headers["content-type"] == "application/json"
    [name] = threads
    assert name.startswith("ridgeline-tokenize")  # the server's executor, not the loop's thread


def test_the_limit_flags_are_documented_and_checked(capsys):
    with pytest.raises(SystemExit):
        main(["serve", "--help-all"])  # every flag; --help shows the common ones
    help_text = capsys.readouterr().out
    for flag in ("--max-n", "--max-logprob-entries", "--chat-template-timeout", "--chat-template-max-bytes"):
        assert flag in help_text
    for args, message in ((["--max-n", "129"], "--max-n must be in [1, 128]"),
                          (["--max-logprob-entries", "0"], "--max-logprob-entries must be >= 1"),
                          (["--chat-template-timeout", "0"], "--chat-template-timeout must be > 0"),
                          (["--chat-template-max-bytes", "0"], "--chat-template-max-bytes must be >= 1")):
        assert main(["serve", *args]) == 2
        assert message in capsys.readouterr().err
