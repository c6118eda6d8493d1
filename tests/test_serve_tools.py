"""Tool calling through the server and the openai SDK on a tiny random model: with tool_choice
required or named the reply is calls whose arguments validate against the tool's schema, streamed and
non-streamed alike; tool-call history renders through the model's template; every way of asking wrong
is a 400 naming the field."""
from __future__ import annotations

import json

import httpx
import openai
import pytest
from jsonschema import Draft202012Validator

CHAT = "/v1/chat/completions"
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 6},
                                            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
           "required": ["city", "days"], "additionalProperties": False}
ADD = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                        "b": {"type": "boolean"}}, "required": ["a", "b"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather.", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "add", "parameters": ADD}}]
SCHEMAS = {"get_weather": WEATHER, "add": ADD}
USER = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def tools_server(tmp_path_factory):
    """A tiny Llama with room for the tools' description (the byte tokenizer spends a token a byte)."""
    from conftest import SERVER_OPTS, make_tiny_model
    from ridgeline.config import EngineConfig
    from ridgeline.engine.llm_engine import LLMEngine
    from ridgeline.serve.app import build_app
    from ridgeline.serve.server import ServerThread
    from ridgeline.serve.state import ServerSettings
    folder = make_tiny_model(tmp_path_factory.mktemp("tiny-tools"), "llama", max_position_embeddings=2048)
    engine = LLMEngine(EngineConfig.from_kwargs(str(folder), progress=False,
                                                **{**SERVER_OPTS, "kv_cache_memory": "16MiB"}))
    with ServerThread(build_app(engine, ServerSettings("tiny", quiet=True))) as s:
        yield s


@pytest.fixture(scope="module")
def client(tools_server):
    with httpx.Client(base_url=tools_server.url, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def sdk(tools_server):
    return openai.OpenAI(base_url=tools_server.url + "/v1", api_key="x", max_retries=0)


def _check(calls, allowed):
    assert calls
    for c in calls:
        assert c.function.name in allowed
        Draft202012Validator(SCHEMAS[c.function.name]).validate(json.loads(c.function.arguments))


def _streamed(sdk, pieces: dict | None = None, **kw):
    """A streamed reply as a client assembles it: a call's first delta has its id and name, the arguments
    are the concatenation of its deltas' (pieces: index -> how many argument deltas it came in)."""
    content, calls, finish = "", {}, None
    for chunk in sdk.chat.completions.create(stream=True, **kw):
        for ch in chunk.choices:
            content += ch.delta.content or ""
            for d in ch.delta.tool_calls or []:
                if d.id is not None:
                    assert d.index not in calls and d.function.name, d
                    calls[d.index] = (d.id, d.function.name, d.function.arguments or "")
                else:
                    assert d.function.name is None, d
                    cid, name, args = calls[d.index]
                    calls[d.index] = (cid, name, args + d.function.arguments)
                if pieces is not None and d.function.arguments:
                    pieces[d.index] = pieces.get(d.index, 0) + 1
            finish = ch.finish_reason or finish
    return content or None, [calls[i] for i in sorted(calls)], finish


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "add"}}])
@pytest.mark.parametrize("parallel", [True, False])
def test_constrained_calls_validate_streamed_or_not(sdk, choice, parallel):
    allowed = set(SCHEMAS) if choice == "required" else {"add"}
    for seed in range(3):
        kw = dict(model="tiny", messages=USER, tools=TOOLS, tool_choice=choice, parallel_tool_calls=parallel,
                  max_tokens=160, temperature=1.0, seed=seed)
        r = sdk.chat.completions.create(**kw)
        c = r.choices[0]
        assert c.finish_reason == "tool_calls", c
        _check(c.message.tool_calls, allowed)
        if not parallel:
            assert len(c.message.tool_calls) == 1
        pieces: dict = {}
        content, calls, finish = _streamed(sdk, pieces, **kw)
        assert finish == "tool_calls"
        assert [(n, a) for _, n, a in calls] == [(t.function.name, t.function.arguments)
                                                 for t in c.message.tool_calls]
        assert content == c.message.content
        # the grammar writes these calls: their arguments stream as they are written, not whole at the end
        assert all(pieces.get(i, 0) >= 2 for i, (_, _, a) in enumerate(calls) if len(a) > 8), pieces


def test_history_round_trips_through_the_template(sdk):
    """The tiny model's template renders no tools: the server writes the history itself."""
    msgs = [*USER, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                          "arguments": '{"city": "Paris", "days": 2}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    r = sdk.chat.completions.create(model="tiny", messages=msgs, tools=TOOLS, tool_choice="required", max_tokens=160)
    _check(r.choices[0].message.tool_calls, set(SCHEMAS))
    assert r.usage.prompt_tokens > 100  # the tools' description and the history are in the prompt


def test_auto_and_none_reply_with_text(sdk):
    for choice in ("auto", "none"):
        r = sdk.chat.completions.create(model="tiny", messages=USER, tools=TOOLS, tool_choice=choice, max_tokens=8)
        assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_auto_is_constrained_from_the_calls_marker(sdk, client):
    """auto: free text, each call constrained once its marker appears (a lazy grammar): the request runs
    constrained (the server's counters), and whatever calls it makes validate."""
    def choices():
        text = client.get("/metrics").text
        return float(next(ln.split()[1] for ln in text.splitlines()
                          if ln.startswith("ridgeline_structured_choices")))
    before = choices()
    for seed in range(4):
        r = sdk.chat.completions.create(model="tiny", messages=USER, tools=TOOLS, tool_choice="auto", max_tokens=24,
                                        temperature=1.0, seed=seed)
        for c in r.choices[0].message.tool_calls or []:
            _check([c], set(SCHEMAS))
    assert choices() == before + 4
    r = sdk.chat.completions.create(model="tiny", messages=USER, tools=TOOLS, tool_choice="none", max_tokens=4)
    assert choices() == before + 4  # none: not constrained


def _bad(client, body: dict, param: str, text: str):
    r = client.post(CHAT, json={"model": "tiny", "messages": USER, "max_tokens": 4, **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and text in err["message"], err


def test_bad_input_is_a_400_naming_the_field(client):
    _bad(client, {"tool_choice": "required"}, "tool_choice", "needs tools")
    _bad(client, {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
         "tool_choice", "not in tools")
    _bad(client, {"tools": TOOLS + TOOLS[:1]}, "tools", "two tools")
    _bad(client, {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "foo"}}}]},
         "tools", "tools[0].function.parameters")
    _bad(client, {"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "$ref": "https://example.com/s.json"}}}]}, "tools", "remote")
    _bad(client, {"tools": TOOLS, "messages": [*USER, {"role": "tool", "content": "x"}]}, "messages",
         "tool_call_id")
    _bad(client, {"tools": TOOLS, "messages": [*USER, {"role": "tool", "tool_call_id": "c9", "content": "x"}]},
         "messages", "matches no earlier")
    _bad(client, {"tools": [{"type": "function", "function": {"name": "f", "description": "<s>system"}}]},
         "tools", "special token")
    _bad(client, {"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
         "tool_choice", "response_format")


def test_the_corpus_tools_each_get_a_valid_call_streamed_or_not(sdk):
    """22 tool x prompt pairs (the corpus's function-calling schemas), tool_choice required and named in
    turn, one call each: every reply is a parsed call whose arguments validate, streamed and non-streamed
    identical."""
    from ridgeline.bench.structured_workload import corpus_schemas
    fns = {k.removeprefix("fn_"): v for k, v in corpus_schemas().items() if k.startswith("fn_")}
    assert len(fns) >= 10
    n = 0
    for name, schema in fns.items():
        tools = [{"type": "function", "function": {"name": name, "parameters": schema}}]
        for k, ask in enumerate((f"Please {name.replace('_', ' ')}.", "Do it now.")):
            choice = "required" if k == 0 else {"type": "function", "function": {"name": name}}
            kw = dict(model="tiny", messages=[{"role": "user", "content": ask}], tools=tools, tool_choice=choice,
                      parallel_tool_calls=False, max_tokens=300, temperature=0.8, seed=n)
            c = sdk.chat.completions.create(**kw).choices[0]
            assert c.finish_reason == "tool_calls" and len(c.message.tool_calls) == 1, (name, c)
            for call in c.message.tool_calls:
                assert call.function.name == name
                Draft202012Validator(schema).validate(json.loads(call.function.arguments))
            _, calls, finish = _streamed(sdk, **kw)
            assert finish == "tool_calls"
            assert [(nm, a) for _, nm, a in calls] == [(t.function.name, t.function.arguments)
                                                      for t in c.message.tool_calls]
            n += 1
    assert n >= 20


def test_strict_tools_are_enforced_where_the_format_is_constrained_and_refused_where_nothing_would(client):
    strict = [{**t, "function": {**t["function"], "strict": True}} for t in TOOLS]
    body = {"model": "tiny", "messages": USER, "max_tokens": 4, "tools": strict}
    assert client.post("/v1/chat/completions", json=body).status_code == 200  # generic format: auto is constrained
    r = client.post("/v1/chat/completions", json={**body, "response_format": {"type": "json_object"}})
    assert r.status_code == 400 and "strict" in r.json()["error"]["message"], r.text  # auto beside a response_format


def _template_server(tmp_path_factory, template: str):
    """A tiny Llama served with tests/data/templates/<template>.jinja as its chat template."""
    from pathlib import Path
    from conftest import SERVER_OPTS, make_tiny_model
    from ridgeline.config import EngineConfig
    from ridgeline.engine.llm_engine import LLMEngine
    from ridgeline.serve.app import build_app
    from ridgeline.serve.server import ServerThread
    from ridgeline.serve.state import ServerSettings
    folder = make_tiny_model(tmp_path_factory.mktemp(f"tiny-{template}"), "llama", max_position_embeddings=2048)
    cfg_path = folder / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text()) if cfg_path.exists() else {}
    cfg["chat_template"] = (Path(__file__).parent / "data" / "templates" / f"{template}.jinja").read_text()
    cfg_path.write_text(json.dumps(cfg))
    engine = LLMEngine(EngineConfig.from_kwargs(str(folder), progress=False,
                                                **{**SERVER_OPTS, "kv_cache_memory": "16MiB"}))
    return ServerThread(build_app(engine, ServerSettings("tiny", quiet=True)))


@pytest.fixture(scope="module")
def coder_sdk(tmp_path_factory):
    """A tiny Llama whose template writes Qwen3-Coder's XML calls (tests/data/templates/qwen3_coder.jinja)."""
    with _template_server(tmp_path_factory, "qwen3_coder") as s:
        yield openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0)


@pytest.fixture(scope="module")
def llama3_server(tmp_path_factory):
    """A tiny Llama whose template writes Llama 3.x JSON calls (tests/data/templates/llama3_json.jinja)."""
    with _template_server(tmp_path_factory, "llama3_json") as s:
        yield s


def test_llama3_auto_is_constrained_and_takes_strict_tools(llama3_server):
    """Llama 3.x JSON calls under auto: the reply runs constrained (a leading "{" is calls, the tag opens calls
    after text), so strict tools are enforced, not refused; whatever calls come validate, and parallel false
    keeps to one."""
    client = httpx.Client(base_url=llama3_server.url, timeout=120)
    sdk = openai.OpenAI(base_url=llama3_server.url + "/v1", api_key="x", max_retries=0)

    def choices():
        return float(next(ln.split()[1] for ln in client.get("/metrics").text.splitlines()
                          if ln.startswith("ridgeline_structured_choices")))
    strict = [{**t, "function": {**t["function"], "strict": True}} for t in TOOLS]
    before = choices()
    for seed in range(3):
        r = sdk.chat.completions.create(model="tiny", messages=USER, tools=strict, tool_choice="auto", max_tokens=24,
                                        temperature=1.0, seed=seed, parallel_tool_calls=False)
        calls = r.choices[0].message.tool_calls or []
        assert len(calls) <= 1
        if calls:
            _check(calls, set(SCHEMAS))
    assert choices() == before + 3


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "add"}}])
def test_xml_calls_are_constrained_streamed_or_not(coder_sdk, choice):
    """Qwen3-Coder's XML format: required and named calls are held to each tool's schema, read back typed."""
    allowed = set(SCHEMAS) if choice == "required" else {"add"}
    for seed in range(3):
        kw = dict(model="tiny", messages=USER, tools=TOOLS, tool_choice=choice, max_tokens=200, temperature=1.0,
                  seed=seed, parallel_tool_calls=False)
        c = coder_sdk.chat.completions.create(**kw).choices[0]
        assert c.finish_reason == "tool_calls", c
        _check(c.message.tool_calls, allowed)
        _, calls, finish = _streamed(coder_sdk, **kw)
        assert finish == "tool_calls"
        assert [(n, a) for _, n, a in calls] == [(t.function.name, t.function.arguments) for t in c.message.tool_calls]
    pattern = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "string", "pattern": "^a+$"}}}}}]
    with pytest.raises(openai.BadRequestError, match="pattern"):
        coder_sdk.chat.completions.create(model="tiny", messages=USER, tools=pattern, tool_choice="required",
                                          max_tokens=8)
