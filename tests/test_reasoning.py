"""Reasoning sections: the splitter gives the same (reasoning, answer) whatever the chunking, with the
markers as text or as tokens, a section the prompt opened or one the reply opens, and hands the answer
on to the tool-call parser with its special ids; a constraint placed after the section holds only after
it; through the server, chat_template_kwargs and reasoning_effort reach the template (or are a 400
naming them), reasoning_content comes apart from content, streamed and not alike."""
from __future__ import annotations

import json

import httpx
import llguidance as llg
import pytest
from conftest import _byte_tokenizer
from hypothesis import given, settings
from hypothesis import strategies as st

from ridgeline.structured_params import StructuredOutputs
from ridgeline.tool_calls.formats import HERMES
from ridgeline.tool_calls.parser import ToolCallParser
from ridgeline.tool_calls.reasoning import (MAGISTRAL, THINK, ReasoningSplitter, detect_reasoning, opens_reasoning,
                                            with_reasoning)
from ridgeline.tool_calls.reply import ReplyParser

IDS = {"<think>": 300, "</think>": 301, "<tool_call>": 302, "</tool_call>": 303, "<|end|>": 304}


def _pieces(text: str, by_id: bool) -> list[tuple[list[int], str]]:
    """text as (ids, text) pieces: a marker that is a token is its own piece carrying its id."""
    out, i = [], 0
    while i < len(text):
        hit = next((m for m in IDS if by_id and text.startswith(m, i)), None)
        if hit:
            out.append(([IDS[hit]], hit))
            i += len(hit)
        else:
            out.append(([], text[i]))
            i += 1
    return out


def split(text: str, opened: bool, by_id: bool, cuts: list[int] | None = None, tools: bool = False):
    specials = {i: m for m, i in IDS.items()} if by_id else {}
    tool_parser = ToolCallParser(HERMES, {i: m for m, i in IDS.items() if "tool" in m or m == "<|end|>"}
                                 if by_id else {}) if tools else None
    forward = set(tool_parser.specials.values()) if tool_parser else set()
    p = ReplyParser(ReasoningSplitter(THINK, specials, opened, forward), tool_parser)
    pieces = _pieces(text, by_id)
    groups, last = [], 0
    for c in sorted(set(cuts or [])) + [len(pieces)]:
        if c > last:
            groups.append(pieces[last:c])
            last = c
    for g in groups:
        p.feed([i for ids, _ in g for i in ids], "".join(t for _, t in g))
    p.finish()
    return "".join(p.reasoning_text) or None, "".join(p.content) or None, [(c.name, c.arguments) for c in p.calls]


CASES = [  # (reply, opened) -> (reasoning, content)
    (("I should add.</think>\n\nIt is 3.", True), ("I should add.", "It is 3.")),
    (("<think>hmm</think>\nHello", False), ("hmm", "Hello")),
    (("  <think>hmm</think>Hello", False), ("hmm", "Hello")),
    (("Hello <think>not a section</think>", False), (None, "Hello <think>not a section</think>")),
    (("never closed", True), ("never closed", None)),
    (("<think>cut off", False), ("cut off", None)),
    (("<thin", False), (None, "<thin")),
    (("plain answer", False), (None, "plain answer")),
    (("a</think>b</think>c", True), ("a", "b</think>c")),
]


@pytest.mark.parametrize("by_id", [False, True])
@pytest.mark.parametrize("case,want", CASES)
def test_sections_split(case, want, by_id):
    assert split(*case, by_id=by_id)[:2] == want


@settings(max_examples=60, deadline=None)
@given(case=st.sampled_from(CASES), by_id=st.booleans(), cuts=st.lists(st.integers(0, 60), max_size=8))
def test_any_chunking_gives_the_same_split(case, by_id, cuts):
    (text, opened), _ = case
    assert split(text, opened, by_id, cuts) == split(text, opened, by_id)


def test_a_marker_typed_as_text_after_the_token_ids_is_text():
    # the ids say one </think> token came; the second "</think>" is plain text inside the answer
    p = ReasoningSplitter(THINK, {301: "</think>"}, True)
    thought, answer, _ = p.feed([301], "a</think>b</think>c")
    thought2, answer2, _ = p.finish()
    assert (thought + thought2, answer + answer2) == ("a", "b</think>c")


@pytest.mark.parametrize("by_id", [False, True])
def test_the_answer_goes_on_to_the_tool_call_parser(by_id):
    end = "<|end|>" if by_id else ""  # an end-of-turn token: dropped
    reply = 'let me call it</think>\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>' + end
    thought, content, calls = split(reply, True, by_id, tools=True)
    assert thought == "let me call it" and calls == [("f", '{"x": 1}')] and content is None
    thought, content, calls = split('<tool_call> inside thinking</think>ok', True, by_id, tools=True)
    assert calls == [] and content == "ok"


def test_formats_are_found_in_templates():
    assert detect_reasoning("{{ '<think>\\n' }}...{{ '</think>' }}") is THINK
    assert detect_reasoning("[THINK] ... [/THINK]") is MAGISTRAL
    assert detect_reasoning("{{ messages }}") is None and detect_reasoning(None) is None
    assert opens_reasoning(THINK, "user: hi\nassistant: <think>\n")
    assert not opens_reasoning(THINK, "assistant: <think>\n\n</think>\n\n")
    assert not opens_reasoning(THINK, "assistant: ")


def _walk(grammar: str, text: str, specials: bool):
    tok = _byte_tokenizer()
    if specials:
        tok.add_special_tokens(["<think>", "</think>"])
    lt = llg.LLTokenizer(tok.to_str(), n_vocab=tok.get_vocab_size(), eos_token=[tok.token_to_id("</s>")])
    m = llg.LLMatcher(lt, grammar, log_level=0)
    assert not m.is_error(), m.get_error()
    ids = tok.encode(text, add_special_tokens=False).ids
    n = next((k for k, t in enumerate(ids) if not m.consume_token(t)), len(ids))
    return n == len(ids) and m.is_accepting(), tok


@pytest.mark.parametrize("specials", [False, True])
def test_a_constraint_holds_after_the_section(specials):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
              "additionalProperties": False}
    tok = _byte_tokenizer()
    if specials:
        tok.add_special_tokens(["<think>", "</think>"])
    ids = {m: tok.token_to_id(m) for m in ("<think>", "</think>")} if specials else {}
    opened = with_reasoning(StructuredOutputs(json=schema), THINK, ids, True).grammar
    assert _walk(opened, 'free {{ text</think>\n\n{"a":1}', specials)[0]
    assert not _walk(opened, '{"a":1}', specials)[0]  # still inside the section: not complete
    assert not _walk(opened, 'x</think>{"a":"no"}', specials)[0]
    optional = with_reasoning(StructuredOutputs(choice=["yes", "no"]), THINK, ids, False).grammar
    assert _walk(optional, "<think>hmm</think>yes", specials)[0] and _walk(optional, "no", specials)[0]
    assert not _walk(optional, "maybe", specials)[0]


def test_other_kinds_after_an_opened_section_are_refused():
    from ridgeline.errors import InvalidRequestError
    with pytest.raises(InvalidRequestError, match="guided_regex: a regex cannot be enforced after a reasoning"):
        with_reasoning(StructuredOutputs(regex="a+", field="guided_regex"), THINK, {}, True)


# ---- through the server ---------------------------------------------------------------------------
TEMPLATE = ("{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
            "{% if add_generation_prompt %}<s>assistant\n"
            "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n"
            "{% else %}<think>\n{% endif %}{% endif %}")


@pytest.fixture(scope="module")
def think_server(tmp_path_factory):
    from conftest import SERVER_OPTS, make_tiny_model
    from ridgeline.config import EngineConfig
    from ridgeline.engine.llm_engine import LLMEngine
    from ridgeline.serve.app import build_app
    from ridgeline.serve.server import ServerThread
    from ridgeline.serve.state import ServerSettings
    folder = make_tiny_model(tmp_path_factory.mktemp("tiny-think"), "llama", max_position_embeddings=1024)
    tok = _byte_tokenizer()
    tok.add_tokens(["<think>", "</think>"])  # added, not special (as Qwen3's)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "chat_template": TEMPLATE, "add_bos_token": False}))
    engine = LLMEngine(EngineConfig.from_kwargs(str(folder), progress=False, **{**SERVER_OPTS,
                                                                                 "kv_cache_memory": "8MiB"}))
    with ServerThread(build_app(engine, ServerSettings("tiny", quiet=True))) as s:
        s.end_think = tok.token_to_id("</think>")
        yield s


def _chat(server, stream=False, **kw):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 40, **kw}
    with httpx.Client(base_url=server.url, timeout=60) as c:
        if not stream:
            return c.post("/v1/chat/completions", json=body)
        parts = {"reasoning_content": "", "content": ""}
        with c.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    for ch in json.loads(line[6:])["choices"]:
                        for k in parts:
                            parts[k] += ch["delta"].get(k) or ""
        return parts


def test_reasoning_comes_apart_from_the_answer(think_server):
    for seed in range(20):  # a seed whose reply thinks a little, then answers
        bias = {"logit_bias": {str(think_server.end_think): 3.0}, "temperature": 1.0, "seed": seed}
        r = _chat(think_server, **bias)
        assert r.status_code == 200, r.text
        msg = r.json()["choices"][0]["message"]
        if msg.get("reasoning_content") and msg["content"]:
            break
    else:
        pytest.fail("no reply both thought and answered")
    assert msg["reasoning"] == msg["reasoning_content"]  # both names
    streamed = _chat(think_server, stream=True, **bias)
    assert streamed == {"reasoning_content": msg["reasoning_content"], "content": msg["content"] or ""}
    hidden = _chat(think_server, include_reasoning=False, **bias).json()["choices"][0]["message"]
    assert "reasoning_content" not in hidden and hidden["content"] == msg["content"]


def test_a_schema_holds_after_the_reasoning(think_server):
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["n"], "additionalProperties": False}
    for seed in range(20):
        r = _chat(think_server, max_tokens=80, temperature=1.0, seed=seed,
                  logit_bias={str(think_server.end_think): 3.0},
                  response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": schema}})
        assert r.status_code == 200, r.text
        c = r.json()["choices"][0]
        if c["finish_reason"] == "stop" and c["message"].get("reasoning_content"):
            break
    else:
        pytest.fail("no reply finished its reasoning")
    assert 0 <= json.loads(c["message"]["content"])["n"] <= 9  # the schema held after the section


@pytest.mark.parametrize("budget", [0, 5])
def test_a_thinking_budget_ends_the_section(think_server, budget):
    """The end marker is forced after `budget` tokens of reasoning (the fixture's </think> is a token)."""
    for field in ("thinking_token_budget", "max_reasoning_tokens"):
        r = _chat(think_server, max_tokens=30, temperature=1.0, seed=2, **{field: budget})
        assert r.status_code == 200, r.text
        msg = r.json()["choices"][0]["message"]
        assert len((msg.get("reasoning_content") or "").encode()) <= budget  # a byte a token here
        assert r.json()["usage"]["completion_tokens"] > budget + 1  # it went on to answer
    r = _chat(think_server, thinking_token_budget=3, max_reasoning_tokens=3)
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_reasoning_tokens"


def test_template_variables_reach_the_template(think_server):
    off = _chat(think_server, chat_template_kwargs={"enable_thinking": False}, max_tokens=8).json()
    assert "reasoning_content" not in off["choices"][0]["message"]  # the prompt closed the section
    assert off["choices"][0]["message"]["content"] is not None
    for body, param in (({"chat_template_kwargs": {"no_such_var": 1}}, "chat_template_kwargs"),
                        ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs"),
                        ({"chat_template_kwargs": [1]}, "chat_template_kwargs"),
                        ({"reasoning_effort": "high"}, "reasoning_effort"),
                        ({"reasoning_effort": "extreme"}, "reasoning_effort")):
        r = _chat(think_server, **body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (body, r.text)


def test_include_reasoning_false_without_a_reasoning_model_is_refused(tiny_server):
    for field, value in (("include_reasoning", False), ("thinking_token_budget", 4)):
        r = _chat(tiny_server, **{field: value})
        assert r.status_code == 400 and r.json()["error"]["param"] == field
    assert _chat(tiny_server).json()["choices"][0]["message"].get("reasoning_content") is None


def test_the_answer_keeps_the_tokens_it_forwards_and_drops_the_rest():
    specials = {301: "</think>", 302: "<tool_call>", 304: "<|end|>"}
    p = ReasoningSplitter(THINK, specials, True, forward={"<tool_call>"})
    thought, answer, ids = p.feed([301, 302, 304], "a</think>b<tool_call>c<|end|>")
    rest = p.finish()
    assert (thought, answer + rest[1], ids) == ("a", "b<tool_call>c", [302])


# ---------------------------------------------------------------- harmony (GPT-OSS)
HIDS = {"<|start|>": 400, "<|channel|>": 401, "<|message|>": 402, "<|end|>": 403, "<|return|>": 404, "<|call|>": 405}
HARMONY_REPLIES = [  # reply -> (reasoning, content)
    ("<|channel|>analysis<|message|>Add 1 and 2.<|end|><|start|>assistant<|channel|>final<|message|>It is 3.<|return|>",
     ("Add 1 and 2.", "It is 3.")),
    ("<|channel|>final<|message|>Hello there.<|return|>", (None, "Hello there.")),
    ("<|channel|>analysis<|message|>Use the tool.<|end|><|start|>assistant<|channel|>commentary to=functions.f "
     "<|message|>{\"x\": 1}<|call|>", ("Use the tool.", '{"x": 1}')),
    ("no harmony at all, 1 < 2", (None, "no harmony at all, 1 < 2")),
    ("<|channel|>analysis<|message|>still thinking", ("still thinking", None)),  # cut off by max_tokens
]


def harmony_split(text: str, cuts: list[int]):
    from ridgeline.tool_calls.reasoning import HARMONY, HarmonySplitter
    pieces, i = [], 0
    while i < len(text):
        hit = next((m for m in HIDS if text.startswith(m, i)), None)
        pieces.append(([HIDS[hit]], hit) if hit else ([], text[i]))
        i += len(hit) if hit else 1
    p = ReplyParser(HarmonySplitter(HARMONY, {i: m for m, i in HIDS.items()}, set()), None)
    last = 0
    for c in sorted(set(cuts)) + [len(pieces)]:
        if c > last:
            p.feed([i for ids, _ in pieces[last:c] for i in ids], "".join(t for _, t in pieces[last:c]))
            last = c
    p.finish()
    return "".join(p.reasoning_text) or None, "".join(p.content) or None


@pytest.mark.parametrize("reply,want", HARMONY_REPLIES)
@given(cuts=st.lists(st.integers(0, 120), max_size=6))
@settings(max_examples=25, deadline=None)
def test_harmony_channels_split_whatever_the_chunking(reply, want, cuts):
    """The analysis channel is the reasoning, final and commentary the answer; headers, recipients and markers
    are text of neither; a reply without harmony markers is the answer."""
    assert harmony_split(reply, cuts) == want


HARMONY_CALL_REPLIES = [  # reply -> (reasoning, content, calls)
    ("<|channel|>analysis<|message|>Use the tool.<|end|><|start|>assistant<|channel|>commentary to=functions.f "
     "<|constrain|>json<|message|>{\"x\": 1}<|call|>", ("Use the tool.", None, [("f", '{"x": 1}')])),
    ("<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"x\": 1}", (None, None, [("f", '{"x": 1}')])),
    ("<|channel|>commentary to=functions.f<|message|>{\"x\": 1}<|call|><|start|>assistant<|channel|>commentary "
     "to=functions.g<|message|>{\"y\": [2]}<|call|>", (None, None, [("f", '{"x": 1}'), ("g", '{"y": [2]}')])),
    ("<|channel|>analysis<|message|>hm<|end|><|start|>assistant<|channel|>final<|message|>No call needed.<|return|>",
     ("hm", "No call needed.", [])),
    ("<|channel|>commentary to=functions.f<|message|>not json<|call|>", (None, "not json", [])),  # kept as text
    ("<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant to=functions.f<|channel|>commentary json"
     "<|message|>{}<|call|>", (None, "Checking.", [("f", "{}")])),  # the recipient before the channel
]
HIDS_CALLS = {**HIDS, "<|constrain|>": 406}


def harmony_calls(text: str, cuts: list[int], max_calls=None, stream=False):
    from ridgeline.tool_calls.formats import HARMONY_CALLS
    from ridgeline.tool_calls.reasoning import HARMONY, HarmonySplitter
    pieces, i = [], 0
    while i < len(text):
        hit = next((m for m in HIDS_CALLS if text.startswith(m, i)), None)
        pieces.append(([HIDS_CALLS[hit]], hit) if hit else ([], text[i]))
        i += len(hit) if hit else 1
    specials = {i: m for m, i in HIDS_CALLS.items()}
    tools = ToolCallParser(HARMONY_CALLS, specials, max_calls=max_calls, stream_arguments=stream)
    p = ReplyParser(HarmonySplitter(HARMONY, specials, set(tools.specials.values()), calls=True), tools)
    events, last = [], 0
    for c in sorted(set(cuts)) + [len(pieces)]:
        if c > last:
            events += p.feed([i for ids, _ in pieces[last:c] for i in ids], "".join(t for _, t in pieces[last:c]))
            last = c
    events += p.finish()
    calls = [(c.name, c.arguments) for c in p.calls]
    assert [(e["tool_call"].name, e["tool_call"].arguments) for e in events if "tool_call" in e] == calls
    if stream:  # each call opens with its name, then its arguments in pieces that add up to them
        built: dict = {}
        for e in events:
            if "tool_call_start" in e:
                built[e["tool_call_start"].index] = [e["tool_call_start"].name, ""]
            elif "tool_call_arguments" in e:
                built[e["tool_call_arguments"]["index"]][1] += e["tool_call_arguments"]["arguments"]
        assert [tuple(v) for _, v in sorted(built.items())] == calls
    return "".join(p.reasoning_text) or None, "".join(p.content) or None, calls


@pytest.mark.parametrize("reply,want", HARMONY_CALL_REPLIES)
@given(cuts=st.lists(st.integers(0, 160), max_size=6))
@settings(max_examples=25, deadline=None)
def test_harmony_calls_come_from_messages_addressed_to_functions(reply, want, cuts):
    """With tools, a message to functions.NAME is a call (its body the arguments, ended by <|call|> or the
    reply's end), whatever the chunking: the events carry the calls the whole reply has."""
    assert harmony_calls(reply, cuts) == want


@pytest.mark.parametrize("reply,want", [r for r in HARMONY_CALL_REPLIES if "not json" not in r[0]])
@given(cuts=st.lists(st.integers(0, 160), max_size=6))
@settings(max_examples=25, deadline=None)
def test_constrained_harmony_calls_stream_their_arguments_in_pieces(reply, want, cuts):
    """Where a grammar writes the calls (stream_arguments), a call's arguments come as the reply writes them,
    whatever the chunking, and add up to the call the whole reply has."""
    assert harmony_calls(reply, cuts, stream=True) == want


def test_harmony_calls_stop_at_one_without_parallel_calls():
    two = HARMONY_CALL_REPLIES[2][0]
    assert harmony_calls(two, [], max_calls=1)[2] == [("f", '{"x": 1}')]


def test_harmony_is_found_in_its_template_and_needs_its_tokens():
    from types import SimpleNamespace
    from ridgeline.errors import InvalidRequestError
    from ridgeline.serve.reasoning import plan
    from ridgeline.tool_calls.reasoning import HARMONY
    template = ("{% for m in messages %}<|start|>{{ m['role'] }}<|message|>{{ m['content'] }}<|end|>{% endfor %}"
                "<|start|>assistant<|channel|>")
    assert detect_reasoning(template) is HARMONY and not opens_reasoning(HARMONY, "<|start|>assistant")
    body = SimpleNamespace(include_reasoning=None, thinking_token_budget=None, max_reasoning_tokens=None)
    as_text = SimpleNamespace(token_id=lambda m: None, special_ids=set())
    with pytest.raises(InvalidRequestError, match="harmony needs"):
        plan(HARMONY, as_text, None, None, body)
    tok = SimpleNamespace(token_id=HIDS.get, special_ids=set(HIDS.values()), id_to_token={v: k for k, v in HIDS.items()}.get)
    with pytest.raises(InvalidRequestError, match="thinking budget on harmony replies needs a constraint"):
        plan(HARMONY, tok, SimpleNamespace(structured=None), None,
             SimpleNamespace(include_reasoning=None, thinking_token_budget=8, max_reasoning_tokens=None))


@pytest.fixture(scope="module")
def harmony_server(tmp_path_factory):
    """The tiny GPT-OSS model with harmony's special tokens and a template that writes them."""
    from conftest import SERVER_OPTS
    from test_family_chat import family_chat_model
    from ridgeline.config import EngineConfig
    from ridgeline.engine.llm_engine import LLMEngine
    from ridgeline.serve.app import build_app
    from ridgeline.serve.server import ServerThread
    from ridgeline.serve.state import ServerSettings
    folder, tok = family_chat_model(tmp_path_factory.mktemp("tiny-harmony"), "gpt_oss")
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg["chat_template"] = ("{% for m in messages %}<|start|>{{ m['role'] }}<|message|>{{ m['content'] }}<|end|>"
                            "{% endfor %}{% if add_generation_prompt %}<|start|>assistant{% endif %}"
                            "{# replies: <|channel|>analysis ... #}")
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    engine = LLMEngine(EngineConfig.from_kwargs(str(folder), progress=False, max_model_len=256,
                                                **{**SERVER_OPTS, "kv_cache_memory": "8MiB"}))
    with ServerThread(build_app(engine, ServerSettings("tiny", quiet=True))) as s:
        s.marks = {m: tok.token_to_id(m) for m in ("<|start|>", "<|channel|>", "<|message|>", "<|end|>")}
        yield s


def test_harmony_replies_come_apart_streamed_and_not_alike(harmony_server):
    """Replies sampled with harmony's markers pushed up: no marker's text in either part, and the streamed
    reply splits as the whole one does."""
    bias = {str(i): 4.0 for i in harmony_server.marks.values()}
    for seed in range(6):
        kw = {"logit_bias": bias, "temperature": 1.0, "seed": seed}
        r = _chat(harmony_server, **kw)
        assert r.status_code == 200, r.text
        msg = r.json()["choices"][0]["message"]
        for part in (msg.get("reasoning_content") or "", msg["content"] or ""):
            assert not any(m in part for m in harmony_server.marks), (msg, part)
        assert _chat(harmony_server, stream=True, **kw) == {"reasoning_content": msg.get("reasoning_content") or "",
                                                            "content": msg["content"] or ""}


@pytest.fixture(scope="module")
def harmony_tools_server(tmp_path_factory):
    """The tiny GPT-OSS model with a harmony template that renders tools (tests/data/templates/harmony.jinja)."""
    from pathlib import Path
    from conftest import SERVER_OPTS
    from test_family_chat import family_chat_model
    from ridgeline.config import EngineConfig
    from ridgeline.engine.llm_engine import LLMEngine
    from ridgeline.serve.app import build_app
    from ridgeline.serve.server import ServerThread
    from ridgeline.serve.state import ServerSettings
    folder, tok = family_chat_model(tmp_path_factory.mktemp("tiny-harmony-tools"), "gpt_oss")
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg["chat_template"] = (Path(__file__).parent / "data" / "templates" / "harmony.jinja").read_text()
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    engine = LLMEngine(EngineConfig.from_kwargs(str(folder), progress=False, max_model_len=1024,
                                                **{**SERVER_OPTS, "kv_cache_memory": "8MiB"}))
    with ServerThread(build_app(engine, ServerSettings("tiny", quiet=True))) as s:
        yield s


HARMONY_TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city.",
                                                   "parameters": {"type": "object",
                                                                  "properties": {"city": {"type": "string"}}}}}]


def test_harmony_tools_render_through_the_template_and_refuse_what_they_cannot_enforce(harmony_tools_server):
    plain = _chat(harmony_tools_server, max_tokens=2)
    auto = _chat(harmony_tools_server, max_tokens=2, tools=HARMONY_TOOLS)
    assert plain.status_code == auto.status_code == 200, auto.text
    # the template wrote the tools' namespace into the prompt
    assert auto.json()["usage"]["prompt_tokens"] > plain.json()["usage"]["prompt_tokens"] + 20
    history = [{"role": "user", "content": "Weather in Paris?"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "call_1", "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    r = _chat(harmony_tools_server, max_tokens=2, tools=HARMONY_TOOLS, messages=history)
    assert r.status_code == 200, r.text
    strict = [{**HARMONY_TOOLS[0], "function": {**HARMONY_TOOLS[0]["function"], "strict": True}}]
    r = _chat(harmony_tools_server, max_tokens=2, tools=strict)  # auto is constrained: strict is enforced
    assert r.status_code == 200, r.text
    r = _chat(harmony_tools_server, max_tokens=2, tools=strict, response_format={"type": "json_object"})
    assert r.status_code == 400 and "strict" in r.json()["error"]["message"], r.text  # nothing would enforce it


CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 6}}, "required": ["city"],
        "additionalProperties": False}
CITY_TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": CITY}},
              {"type": "function", "function": {"name": "noop", "parameters": {"type": "object", "properties": {},
                                                                              "additionalProperties": False}}}]


def _streamed_calls(server, **kw):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": True, **kw}
    reasoning, calls, finish, pieces = "", {}, None, {}
    with httpx.Client(base_url=server.url, timeout=60) as c, c.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for ch in json.loads(line[6:])["choices"]:
                    reasoning += ch["delta"].get("reasoning_content") or ""
                    for d in ch["delta"].get("tool_calls") or []:  # a call's head, then its arguments' pieces
                        if "id" in d:
                            calls[d["index"]] = [d["function"]["name"], d["function"]["arguments"]]
                        else:
                            calls[d["index"]][1] += d["function"]["arguments"]
                            pieces[d["index"]] = pieces.get(d["index"], 0) + 1
                    finish = ch["finish_reason"] or finish
    for i, (_, args) in calls.items():  # constrained harmony calls stream their arguments as they are written
        assert len(args) < 4 or pieces.get(i, 0) >= 2, (args, pieces)
    return reasoning or None, [tuple(c) for _, c in sorted(calls.items())], finish


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "noop"}}])
def test_harmony_required_and_named_calls_are_constrained_after_the_analysis(harmony_tools_server, choice):
    """tool_choice required / named on harmony: one grammar, the analysis message first (its text cut at the
    thinking budget), then a commentary message addressed to a tool whose body validates; streamed alike."""
    from jsonschema import Draft202012Validator
    allowed = {"get_weather", "noop"} if choice == "required" else {"noop"}
    seen_reasoning = False
    for seed in range(4):
        kw = dict(max_tokens=120, tools=CITY_TOOLS, tool_choice=choice, temperature=1.0, seed=seed,
                  thinking_token_budget=3)
        r = _chat(harmony_tools_server, **kw)
        assert r.status_code == 200, r.text
        c = r.json()["choices"][0]
        calls = c["message"].get("tool_calls") or []
        assert c["finish_reason"] == "tool_calls" and len(calls) == 1, c
        name, args = calls[0]["function"]["name"], calls[0]["function"]["arguments"]
        assert name in allowed
        Draft202012Validator(CITY if name == "get_weather" else CITY_TOOLS[1]["function"]["parameters"]).validate(
            json.loads(args))
        thought = c["message"].get("reasoning_content")
        seen_reasoning |= thought is not None
        assert len((thought or "").encode()) <= 3 * 4  # the budget's tokens at most (a token is at most 4 bytes)
        assert _streamed_calls(harmony_tools_server, **kw) == (thought, [(name, args)], "tool_calls")
    assert seen_reasoning, "no reply wrote an analysis message before its call"


def test_harmony_auto_is_constrained_messages_with_at_most_one_valid_call(harmony_tools_server):
    """tool_choice auto on harmony: one grammar, the analysis message, commentary preambles, then either a
    call whose body validates against its tool's schema or the final answer; streamed alike."""
    from jsonschema import Draft202012Validator
    schemas = {"get_weather": CITY, "noop": CITY_TOOLS[1]["function"]["parameters"]}
    strict = [{**t, "function": {**t["function"], "strict": True}} for t in CITY_TOOLS]
    called = 0
    for seed in range(6):
        kw = dict(max_tokens=120, tools=strict, tool_choice="auto", temperature=1.0, seed=seed,
                  thinking_token_budget=3)
        r = _chat(harmony_tools_server, **kw)
        assert r.status_code == 200, r.text
        c = r.json()["choices"][0]
        calls = c["message"].get("tool_calls") or []
        assert len(calls) <= 1
        for call in calls:
            Draft202012Validator(schemas[call["function"]["name"]]).validate(json.loads(call["function"]["arguments"]))
            assert c["finish_reason"] == "tool_calls"
        want = [(t["function"]["name"], t["function"]["arguments"]) for t in calls]
        assert _streamed_calls(harmony_tools_server, **kw)[1:] == (want, c["finish_reason"])
        called += bool(calls)
    assert called, "no reply made a call"


def test_harmony_json_answer_is_the_final_channel_after_the_analysis(harmony_tools_server):
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["n"],
              "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}
    for seed in range(3):
        r = _chat(harmony_tools_server, max_tokens=60, temperature=1.0, seed=seed, response_format=fmt,
                  max_reasoning_tokens=2)
        assert r.status_code == 200, r.text
        msg = r.json()["choices"][0]["message"]
        assert 0 <= json.loads(msg["content"])["n"] <= 9, msg
    r = _chat(harmony_tools_server, max_tokens=8, structured_outputs={"regex": "a+"})
    assert r.status_code == 400 and "regex" in r.json()["error"]["message"], r.text  # not framed yet: refused
    r = _chat(harmony_tools_server, max_tokens=8, thinking_token_budget=2)
    assert r.status_code == 400 and "thinking budget" in r.json()["error"]["message"], r.text
