"""Anthropic's Messages API through the `anthropic` SDK on a tiny random model: greedy replies equal the
OpenAI chat route's for the same conversation (text, tool calls, thinking, structured output), streamed and
non-streamed alike; stop sequences are reported; count_tokens counts the rendered prompt; every way of
asking wrong is a 400 in Anthropic's error shape naming the field; an abandoned stream frees its request;
the key guard answers Anthropic's 401."""
from __future__ import annotations

import asyncio
import json

import anthropic
import httpx
import openai
import pytest
from pydantic import BaseModel
from conftest import SERVER_OPTS, _byte_tokenizer, make_tiny_model
from jsonschema import Draft202012Validator
from server_helpers import StepGate, metric, wait_idle, wait_until

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 6},
                                            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
           "required": ["city", "days"], "additionalProperties": False}
ADD = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99}},
       "required": ["a"], "additionalProperties": False}
TOOLS = [{"name": "get_weather", "description": "Weather.", "input_schema": WEATHER},
         {"name": "add", "input_schema": ADD}]
OPENAI_TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather.",
                                                  "parameters": WEATHER}},
                {"type": "function", "function": {"name": "add", "parameters": ADD}}]
SCHEMAS = {"get_weather": WEATHER, "add": ADD}
USER = [{"role": "user", "content": "What is the weather in Paris?"}]
THINK_TEMPLATE = ("{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
                  "{% if add_generation_prompt %}<s>assistant\n"
                  "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n"
                  "{% else %}<think>\n{% endif %}{% endif %}")
KEY = "sk-anthropic-test"
T0 = {"temperature": 0}  # the SDK takes sampling fields as extra_body only


def _serve(folder, kv="16MiB", **settings):
    from ridgeline.config import EngineConfig
    from ridgeline.engine.llm_engine import LLMEngine
    from ridgeline.serve.app import build_app
    from ridgeline.serve.server import ServerThread
    from ridgeline.serve.state import ServerSettings
    engine = LLMEngine(EngineConfig.from_kwargs(str(folder), progress=False, **{**SERVER_OPTS, "kv_cache_memory": kv}))
    server = ServerThread(build_app(engine, ServerSettings("tiny", quiet=True, **settings)))
    server.engine = engine
    return server


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A tiny Llama with room for tools' descriptions (the byte tokenizer spends a token a byte)."""
    folder = make_tiny_model(tmp_path_factory.mktemp("tiny-anthropic"), "llama", max_position_embeddings=2048)
    with _serve(folder) as s:
        yield s


@pytest.fixture(scope="module")
def think_server(tmp_path_factory):
    folder = make_tiny_model(tmp_path_factory.mktemp("tiny-anthropic-think"), "llama", max_position_embeddings=1024)
    tok = _byte_tokenizer()
    tok.add_tokens(["<think>", "</think>"])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "chat_template": THINK_TEMPLATE, "add_bos_token": False}))
    with _serve(folder, kv="8MiB") as s:
        yield s


def _clients(server):
    return (anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0),
            openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0))


@pytest.fixture(scope="module")
def sdk(server):
    return _clients(server)


def _blocks(message) -> list[dict]:
    return [b.model_dump(exclude_none=True) for b in message.content]


def _same_streamed(client, **kw):
    """The non-streamed message, checked equal to what the SDK builds from the stream."""
    whole = client.messages.create(**kw)
    with client.messages.stream(**kw) as stream:
        streamed = stream.get_final_message()
    def unnamed(m):  # call ids are new on every reply
        return [{k: v for k, v in b.items() if k != "id"} for b in _blocks(m)]
    assert unnamed(streamed) == unnamed(whole)
    assert (streamed.stop_reason, streamed.stop_sequence) == (whole.stop_reason, whole.stop_sequence)
    assert streamed.usage.output_tokens == whole.usage.output_tokens
    total = whole.usage.input_tokens + whole.usage.cache_read_input_tokens
    assert streamed.usage.input_tokens + streamed.usage.cache_read_input_tokens == total
    assert whole.id.startswith("msg_") and whole.type == "message" and whole.role == "assistant"
    return whole


def test_text_equals_the_chat_routes_streamed_or_not(sdk):
    client, oai = sdk
    m = _same_streamed(client, model="tiny", max_tokens=24, extra_body={**T0, "top_k": 0}, system="Be brief.",
                       messages=[{"role": "user", "content": [{"type": "text", "text": "Hi",
                                                               "cache_control": {"type": "ephemeral"}}]}],
                       metadata={"user_id": "u1"}, service_tier="auto")
    r = oai.chat.completions.create(model="tiny", max_tokens=24, temperature=0,
                                    messages=[{"role": "system", "content": "Be brief."},
                                              {"role": "user", "content": "Hi"}])
    assert m.content[0].type == "text" and m.content[0].text == r.choices[0].message.content
    assert m.stop_reason == {"length": "max_tokens", "stop": "end_turn"}[r.choices[0].finish_reason]
    assert m.usage.output_tokens == r.usage.completion_tokens
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == r.usage.prompt_tokens
    count = client.messages.count_tokens(model="tiny", system="Be brief.", messages=[{"role": "user", "content": "Hi"}])
    assert count.input_tokens == r.usage.prompt_tokens


def test_a_stop_sequence_is_named(sdk):
    client, _ = sdk
    kw = dict(model="tiny", max_tokens=40, extra_body=T0, messages=[{"role": "user", "content": "Count"}])
    full = client.messages.create(**kw).content[0].text
    stop = next(full[i:i + 2] for i in range(4, len(full) - 2) if full[i:i + 2].strip() and full.find(full[i:i + 2]) == i)
    m = _same_streamed(client, stop_sequences=["never-there", stop], **kw)
    assert (m.stop_reason, m.stop_sequence) == ("stop_sequence", stop)
    assert m.content[0].text == full[:full.index(stop)]


def test_the_sse_events_come_in_anthropics_order(server):
    body = {"model": "tiny", "max_tokens": 8, "temperature": 0, "stream": True,
            "messages": [{"role": "user", "content": "Hi"}]}
    with httpx.stream("POST", server.url + "/v1/messages", json=body, headers={"anthropic-version": "2023-06-01"},
                      timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        frames = [f for f in r.read().decode().split("\n\n") if f]
    names = [f.split("\n")[0].removeprefix("event: ") for f in frames]
    assert all(json.loads(f.split("\n")[1].removeprefix("data: "))["type"] == n for f, n in zip(frames, names))
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    assert names[1] == "content_block_start" and names[-3] == "content_block_stop"
    assert set(names[2:-3]) == {"content_block_delta"}


@pytest.mark.parametrize("choice,allowed", [({"type": "any"}, {"get_weather", "add"}),
                                            ({"type": "tool", "name": "add", "disable_parallel_tool_use": True},
                                             {"add"})])
def test_tool_use_equals_the_chat_routes_and_round_trips(sdk, choice, allowed):
    client, oai = sdk
    m = _same_streamed(client, model="tiny", max_tokens=120, extra_body=T0, messages=USER, tools=TOOLS,
                       tool_choice=choice)
    assert m.stop_reason == "tool_use"
    calls = [b for b in m.content if b.type == "tool_use"]
    assert calls and {c.name for c in calls} <= allowed
    if choice.get("disable_parallel_tool_use"):
        assert len(calls) == 1
    for c in calls:
        Draft202012Validator(SCHEMAS[c.name]).validate(c.input)
    openai_choice = "required" if choice["type"] == "any" else {"type": "function", "function": {"name": "add"}}
    r = oai.chat.completions.create(model="tiny", max_tokens=120, temperature=0, messages=USER, tools=OPENAI_TOOLS,
                                    tool_choice=openai_choice, parallel_tool_calls=choice["type"] == "any")
    want = [(t.function.name, json.loads(t.function.arguments)) for t in r.choices[0].message.tool_calls]
    assert [(c.name, c.input) for c in calls] == want
    # the calls and their results back: the same conversation as the chat route's
    failed = calls[0].id  # its result is an error: the template reads it as ERROR_PREFIX + its text
    results = [{"type": "tool_result", "tool_use_id": c.id, "content": [{"type": "text", "text": "sunny"}],
                "is_error": c.id == failed} for c in calls]
    history = USER + [{"role": "assistant", "content": _blocks(m)}, {"role": "user", "content": results}]
    again = _same_streamed(client, model="tiny", max_tokens=16, extra_body=T0, messages=history, tools=TOOLS)
    chat_history = USER + [{"role": "assistant", "content": None,
                            "tool_calls": [{"id": c.id, "type": "function",
                                            "function": {"name": c.name, "arguments": json.dumps(c.input)}}
                                           for c in calls]}]
    chat_history += [{"role": "tool", "tool_call_id": c.id, "content": ("Error: " if c.id == failed else "") + "sunny"}
                     for c in calls]
    r = oai.chat.completions.create(model="tiny", max_tokens=16, temperature=0, messages=chat_history,
                                    tools=OPENAI_TOOLS)
    got = [(b.type, getattr(b, "text", None) or getattr(b, "name", None)) for b in again.content]
    want = ([("text", r.choices[0].message.content)] if r.choices[0].message.content else [])
    want += [("tool_use", t.function.name) for t in r.choices[0].message.tool_calls or []]
    assert got == want
    count = client.messages.count_tokens(model="tiny", messages=history, tools=TOOLS)
    assert count.input_tokens == r.usage.prompt_tokens


def test_structured_output_holds(sdk):
    client, oai = sdk
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["n"], "additionalProperties": False}
    m = _same_streamed(client, model="tiny", max_tokens=40, extra_body=T0, messages=[{"role": "user", "content": "n?"}],
                       output_config={"format": {"type": "json_schema", "schema": schema}})
    assert 0 <= json.loads(m.content[0].text)["n"] <= 9
    r = oai.chat.completions.create(model="tiny", max_tokens=40, temperature=0, messages=[{"role": "user",
                                                                                          "content": "n?"}],
                                    response_format={"type": "json_schema", "json_schema": {"name": "output",
                                                                                            "schema": schema}})
    assert m.content[0].text == r.choices[0].message.content

    class N(BaseModel):
        ok: bool  # a bounded value: the reply fits in max_tokens
    parsed = client.messages.parse(model="tiny", max_tokens=40, messages=[{"role": "user", "content": "n?"}],
                                   output_format=N, extra_body=T0)  # the SDK sends N's schema as output_config
    assert isinstance(parsed.parsed_output, N)


def test_thinking_budget_and_disabled(think_server):
    client, oai = _clients(think_server)
    user = [{"role": "user", "content": "hi"}]
    m = _same_streamed(client, model="tiny", max_tokens=30, extra_body=T0, messages=user,
                       thinking={"type": "enabled", "budget_tokens": 5})
    r = oai.chat.completions.create(model="tiny", max_tokens=30, temperature=0, messages=user,
                                    extra_body={"thinking_token_budget": 5,
                                                "chat_template_kwargs": {"enable_thinking": True}})
    msg = r.choices[0].message.model_dump()
    assert m.content[0].type == "thinking" and m.content[0].thinking == msg["reasoning_content"]
    assert len(m.content[0].thinking.encode()) <= 5
    assert [b.text for b in m.content if b.type == "text"] == ([msg["content"]] if msg["content"] else [])
    off = _same_streamed(client, model="tiny", max_tokens=8, extra_body=T0, messages=user,
                         thinking={"type": "disabled"})
    assert all(b.type != "thinking" for b in off.content)
    hidden = client.messages.create(model="tiny", max_tokens=30, extra_body=T0, messages=user,
                                    thinking={"type": "enabled", "budget_tokens": 5, "display": "omitted"})
    assert [b.type for b in hidden.content] == [b.type for b in m.content if b.type != "thinking"]
    # an earlier turn's thinking block goes back as the assistant's reasoning
    history = user + [{"role": "assistant", "content": _blocks(m)}, {"role": "user", "content": "more"}]
    assert client.messages.create(model="tiny", max_tokens=4, messages=history).stop_reason
    with pytest.raises(anthropic.BadRequestError, match="thinking.budget_tokens"):
        client.messages.create(model="tiny", max_tokens=30, messages=user,
                               thinking={"type": "enabled", "budget_tokens": 30})


BAD = [  # (body changes, the name the 400's message starts with or holds)
    ({"max_tokens": None}, "max_tokens"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "image"),
    ({"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]}, "document"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "a", "colour": 1}]}]}, "colour"),
    ({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}, "prefill"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "web_search_20250305"),
    ({"tools": [{"name": "a", "input_schema": {"type": "object"}, "defer_loading": True}]}, "defer_loading"),
    ({"tool_choice": {"type": "tool"}}, "tool_choice.name"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "a", "citations": [{}]}]}]}, "citations"),
    ({"system": [{"type": "text", "text": "a", "citations": [{}]}]}, "citations"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c",
                                                  "content": [{"type": "image", "source": {}}]}]}]}, "image"),
    ({"temperature": 1.5}, "temperature"),
    ({"stop_sequences": "x"}, "stop_sequences"),
    ({"thinking": {"type": "enabled", "budget_tokens": 4}}, "thinking.budget_tokens"),  # no reasoning section
    ({"thinking": {"type": "between_tools"}}, "between_tools"),
    ({"output_config": {"format": {"type": "regex"}}}, "output_config.format"),
    ({"container": "c1"}, "container"),
    ({"no_such_field": 1}, "no_such_field"),
]


@pytest.mark.parametrize("change,name", BAD)
def test_bad_input_is_a_400_in_anthropics_shape(server, change, name):
    body = {"model": "tiny", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}], **change}
    body = {k: v for k, v in body.items() if v is not None}
    r = httpx.post(server.url + "/v1/messages", json=body, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error", err
    assert name in err["error"]["message"], err


def test_the_sdk_raises_its_typed_errors(sdk):
    client, _ = sdk
    with pytest.raises(anthropic.BadRequestError, match="image"):
        client.messages.create(model="tiny", max_tokens=8, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}])
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="other", max_tokens=8, messages=USER)
    with pytest.raises(anthropic.BadRequestError, match="no_such"):
        with client.messages.stream(model="tiny", max_tokens=8, messages=USER, extra_body={"no_such": 1}) as s:
            s.get_final_message()


def test_the_key_guard_answers_anthropics_401(tmp_path_factory):
    folder = make_tiny_model(tmp_path_factory.mktemp("tiny-anthropic-key"), "llama")
    with _serve(folder, kv="2MiB", api_key=KEY) as s:
        with pytest.raises(anthropic.AuthenticationError) as e:
            anthropic.Anthropic(base_url=s.url, api_key="wrong", max_retries=0).messages.create(
                model="tiny", max_tokens=2, messages=USER)
        assert e.value.body["error"]["type"] == "authentication_error"
        ok = anthropic.Anthropic(base_url=s.url, api_key=KEY, max_retries=0)  # sent as x-api-key
        assert ok.messages.create(model="tiny", max_tokens=2, messages=USER).usage.output_tokens >= 1


def test_an_abandoned_stream_frees_its_request(server):
    url = server.url
    aborted = metric(url, "ridgeline_requests_total", 'status="abort"')
    body = {"model": "tiny", "max_tokens": 1000, "stream": True, "messages": USER}

    async def stream_then_leave(gate: StepGate) -> float:
        async with httpx.AsyncClient(base_url=url, timeout=60) as c:
            r = await c.send(c.build_request("POST", "/v1/messages", json=body), stream=True)
            lines = r.aiter_lines()
            assert await anext(lines) == "event: message_start"
            while metric(url, "ridgeline_num_requests_running") < 1:
                await asyncio.to_thread(gate.step)
            await asyncio.to_thread(gate.step)  # a token more: it holds KV blocks, far from done
            used = metric(url, "ridgeline_kv_cache_blocks_used")
            await r.aclose()
            return used

    with StepGate(server.app) as gate:
        assert asyncio.run(stream_then_leave(gate)) >= 1
        wait_until(lambda: metric(url, "ridgeline_requests_total", 'status="abort"') == aborted + 1)
    wait_idle(url)
    assert not server.engine.has_unfinished()
    server.engine.kv.check_integrity()


def test_an_error_mid_stream_is_an_error_event():
    from ridgeline.http.errors import ApiError
    from ridgeline.serve.anthropic import _error_events
    from ridgeline.serve.anthropic_stream import event_frame
    from ridgeline.serve.generate import sse_response

    class Job:
        closed = None

        def close(self, status=499):
            self.closed = self.closed or status

    async def events():
        yield {"type": "message_start", "message": {}}
        raise ApiError(503, "the server is shutting down")

    async def body(response):
        return [part async for part in response.body_iterator]

    job = Job()
    frames = asyncio.run(body(sse_response(job, events(), frame=event_frame, on_error=_error_events, done=None)))
    assert frames[0].startswith("event: message_start\n")
    assert frames[1] == ('event: error\ndata: {"type":"error","error":{"type":"overloaded_error",'
                         '"message":"the server is shutting down"}}\n\n')
    assert len(frames) == 2 and job.closed == 503
