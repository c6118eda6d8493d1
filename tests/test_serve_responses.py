"""OpenAI's Responses API (POST /v1/responses) through the openai SDK on tiny random models: the reply
equals the chat route's for the same conversation (greedy), streamed events rebuild the whole response,
function calls round trip, text.format holds, reasoning comes apart (and goes back in), bad input is a
400 naming this API's field, an abandoned stream frees its request, and the key guard covers the route."""
from __future__ import annotations

import json

import httpx
import openai
import pytest
from jsonschema import Draft202012Validator

from server_helpers import StepGate, metric, wait_idle, wait_until

ROUTE = "/v1/responses"
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 6},
                                            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
           "required": ["city", "days"], "additionalProperties": False}
TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather.", "parameters": WEATHER, "strict": True}]
CHAT_TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather.",
                                                "parameters": WEATHER, "strict": True}}]
THINK_TEMPLATE = ("{% for m in messages %}<s>{{ m['role'] }}\n{% if m.get('reasoning_content') %}<think>"
                  "{{ m['reasoning_content'] }}</think>{% endif %}{{ m['content'] or '' }}</s>\n{% endfor %}"
                  "{% if add_generation_prompt %}<s>assistant\n{% if reasoning_effort is defined %}effort "
                  "{{ reasoning_effort }}\n{% endif %}<think>\n{% endif %}")


def _server(folder, **settings):
    from conftest import SERVER_OPTS
    from ridgeline.config import EngineConfig
    from ridgeline.engine.llm_engine import LLMEngine
    from ridgeline.serve.app import build_app
    from ridgeline.serve.server import ServerThread
    from ridgeline.serve.state import ServerSettings
    engine = LLMEngine(EngineConfig.from_kwargs(str(folder), progress=False,
                                                **{**SERVER_OPTS, "kv_cache_memory": "16MiB"}))
    thread = ServerThread(build_app(engine, ServerSettings("tiny", quiet=True, **settings)))
    thread.engine = engine
    return thread


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from conftest import make_tiny_model
    folder = make_tiny_model(tmp_path_factory.mktemp("tiny-responses"), "llama", max_position_embeddings=2048)
    with _server(folder) as s:
        yield s


@pytest.fixture(scope="module")
def think_server(tmp_path_factory):
    """A tiny Llama whose template opens a <think> section (reading reasoning_content and reasoning_effort)."""
    from conftest import _byte_tokenizer, make_tiny_model
    folder = make_tiny_model(tmp_path_factory.mktemp("tiny-responses-think"), "llama", max_position_embeddings=1024)
    tok = _byte_tokenizer()
    tok.add_tokens(["<think>", "</think>"])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "chat_template": THINK_TEMPLATE, "add_bos_token": False}))
    with _server(folder) as s:
        s.end_think = tok.token_to_id("</think>")
        yield s


def _sdk(server, key="x"):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0)


@pytest.fixture(scope="module")
def sdk(server):
    return _sdk(server)


def _shape(output) -> list[dict]:
    """Output items without their ids (which differ between two runs)."""
    items = [item.model_dump(exclude_none=True) if hasattr(item, "model_dump") else dict(item) for item in output]
    return [{k: v for k, v in item.items() if k not in ("id", "call_id", "parsed_arguments")} for item in items]


def _usage(r) -> tuple:
    """The token counts (cached_tokens aside: a repeated prompt hits the prefix cache)."""
    u = r.usage
    return u.input_tokens, u.output_tokens, u.total_tokens, u.output_tokens_details.reasoning_tokens


def _streamed(sdk, **kw):
    """The events of a streamed create, checked for order; returns (events, terminal response)."""
    events = list(sdk.responses.create(stream=True, **kw))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"]
    assert events[-1].type in ("response.completed", "response.incomplete")
    return events, events[-1].response


def test_text_equals_the_chat_routes_streamed_or_not(sdk):
    conv = [{"role": "user", "content": "Tell me a story."}]
    chat = sdk.chat.completions.create(model="tiny", messages=[{"role": "system", "content": "Be brief."}, *conv],
                                       max_tokens=12, temperature=0)
    r = sdk.responses.create(model="tiny", instructions="Be brief.", input=conv, max_output_tokens=12, temperature=0,
                             metadata={"run": "1"}, store=True, user="u1")
    assert r.output_text == chat.choices[0].message.content
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.output[0].type == "message" and r.output[0].status == "incomplete"
    assert (r.usage.input_tokens, r.usage.output_tokens) == (chat.usage.prompt_tokens, chat.usage.completion_tokens)
    assert r.usage.total_tokens == chat.usage.total_tokens and r.usage.output_tokens_details.reasoning_tokens == 0
    assert r.metadata == {"run": "1"} and r.model_extra["store"] is False and r.instructions == "Be brief."
    assert r.id.startswith("resp_") and r.output[0].id.startswith("msg_")
    events, final = _streamed(sdk, model="tiny", instructions="Be brief.", input=conv, max_output_tokens=12,
                              temperature=0)
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == r.output_text
    assert final.status == "incomplete" and _shape(final.output) == _shape(r.output)
    assert _usage(final) == _usage(r)
    # a string input is one user message; parts are text
    parts = [{"role": "user", "content": [{"type": "input_text", "text": "Tell me "}, {"type": "input_text",
                                                                                       "text": "a story."}]}]
    one = sdk.responses.create(model="tiny", input="Tell me a story.", max_output_tokens=6, temperature=0)
    chat = sdk.chat.completions.create(model="tiny", messages=conv, max_tokens=6, temperature=0)
    assert one.output_text == chat.choices[0].message.content
    assert sdk.responses.create(model="tiny", input=parts, max_output_tokens=6, temperature=0).usage.input_tokens \
        == sdk.chat.completions.create(model="tiny", messages=[{"role": "user", "content": [
            {"type": "text", "text": "Tell me "}, {"type": "text", "text": "a story."}]}], max_tokens=6).usage.prompt_tokens


def test_the_event_stream_is_named_and_framed(server):
    body = {"model": "tiny", "input": "hi", "max_output_tokens": 4, "stream": True}
    with httpx.stream("POST", server.url + ROUTE, json=body, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        blocks = r.read().decode().strip().split("\n\n")
    for block in blocks:
        event, data = block.split("\n")
        assert event.startswith("event: ") and data.startswith("data: ")
        assert json.loads(data[6:])["type"] == event[7:]  # no [DONE]: the terminal event ends it


def test_function_calls_stream_as_they_complete_and_round_trip(sdk, server):
    kw = dict(model="tiny", input="What is the weather in Paris?", tools=TOOLS, tool_choice="required",
              max_output_tokens=160, temperature=0)
    r = sdk.responses.create(**kw)
    assert r.status == "completed"
    calls = [o for o in r.output if o.type == "function_call"]
    assert calls and all(c.name == "get_weather" and c.status == "completed" for c in calls)
    for c in calls:
        Draft202012Validator(WEATHER).validate(json.loads(c.arguments))
    chat = sdk.chat.completions.create(model="tiny", messages=[{"role": "user", "content": kw["input"]}],
                                       tools=CHAT_TOOLS, tool_choice="required", max_tokens=160, temperature=0)
    assert [(c.name, c.arguments) for c in calls] == [(t.function.name, t.function.arguments)
                                                      for t in chat.choices[0].message.tool_calls]
    with sdk.responses.stream(**kw) as stream:
        final = stream.get_final_response()
    assert _shape(final.output) == _shape(r.output) and _usage(final) == _usage(r)
    events, _ = _streamed(sdk, **kw)
    args = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert [(e.name, e.arguments) for e in args] == [(c.name, c.arguments) for c in calls]
    # the calls and their results go back as input items: the same prompt as chat's history
    results = [{"type": "function_call_output", "call_id": c.call_id, "output": "sunny"} for c in calls]
    history = [{"role": "user", "content": kw["input"]}, *[o.model_dump(exclude_none=True) for o in calls], *results]
    nxt = sdk.responses.create(**{**kw, "input": history, "tool_choice": "auto", "max_output_tokens": 8})
    chat_history = [{"role": "user", "content": kw["input"]},
                    {"role": "assistant", "content": None, "tool_calls": [
                        {"id": c.call_id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                        for c in calls]},
                    *[{"role": "tool", "tool_call_id": c.call_id, "content": "sunny"} for c in calls]]
    chat = sdk.chat.completions.create(model="tiny", messages=chat_history, tools=CHAT_TOOLS, tool_choice="auto",
                                       max_tokens=8, temperature=0)
    assert nxt.usage.input_tokens == chat.usage.prompt_tokens
    assert nxt.output_text == (chat.choices[0].message.content or "")
    named = sdk.responses.create(**{**kw, "tool_choice": {"type": "function", "name": "get_weather"},
                                    "parallel_tool_calls": False})
    assert [o.type for o in named.output] == ["function_call"] and named.parallel_tool_calls is False


def test_text_format_json_schema_holds(sdk):
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["n"], "additionalProperties": False}
    kw = dict(model="tiny", input="A number.", max_output_tokens=40, temperature=0,
              text={"format": {"type": "json_schema", "name": "n", "schema": schema, "strict": True}})
    r = sdk.responses.create(**kw)
    assert r.status == "completed" and 0 <= json.loads(r.output_text)["n"] <= 9
    assert r.text.format.type == "json_schema"
    with sdk.responses.stream(**kw) as stream:
        assert _shape(stream.get_final_response().output) == _shape(r.output)
    obj = sdk.responses.create(model="tiny", input="JSON.", max_output_tokens=60, temperature=0,
                               text={"format": {"type": "json_object"}})
    if obj.status == "completed":
        assert isinstance(json.loads(obj.output_text), dict)


def test_reasoning_comes_apart_and_goes_back(think_server):
    sdk = _sdk(think_server)
    for seed in range(20):  # a seed whose reply thinks a little, then answers
        extra = {"logit_bias": {str(think_server.end_think): 3.0}, "seed": seed}
        kw = dict(model="tiny", input="hi", max_output_tokens=40, temperature=1.0, extra_body=extra)
        r = sdk.responses.create(**kw)
        if [o.type for o in r.output] == ["reasoning", "message"] and r.output_text:
            break
    else:
        pytest.fail("no reply both thought and answered")
    chat = sdk.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=40,
                                       temperature=1.0, extra_body=extra).choices[0].message
    thought = r.output[0]
    assert thought.summary == [] and thought.content[0].text == chat.reasoning_content
    assert r.output_text == chat.content
    assert 0 < r.usage.output_tokens_details.reasoning_tokens <= r.usage.output_tokens
    events, final = _streamed(sdk, **kw)
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == chat.reasoning_content
    assert _shape(final.output) == _shape(r.output) and _usage(final) == _usage(r)
    # an earlier turn's reasoning item goes back as the assistant message's reasoning_content
    history = [{"role": "user", "content": "hi"}, *[o.model_dump(exclude_none=True) for o in r.output],
               {"role": "user", "content": "and?"}]
    back = sdk.responses.create(model="tiny", input=history, max_output_tokens=2, reasoning={"effort": "low"})
    msgs = [{"role": "user", "content": "hi"},
            {"role": "assistant", "content": chat.content, "reasoning_content": chat.reasoning_content},
            {"role": "user", "content": "and?"}]
    ref = sdk.chat.completions.create(model="tiny", messages=msgs, max_tokens=2, reasoning_effort="low")
    assert back.usage.input_tokens == ref.usage.prompt_tokens
    assert back.reasoning.effort == "low"


def test_reasoning_effort_without_a_template_that_reads_it_names_the_field(sdk):
    with pytest.raises(openai.BadRequestError) as e:
        sdk.responses.create(model="tiny", input="hi", reasoning={"effort": "high"})
    assert e.value.body["param"] == "reasoning.effort" and "reasoning_effort" not in e.value.body["message"]


BAD = [
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input[0].content[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "input[0].content[0].type"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"tools": [{"type": "mcp", "server_label": "x"}]}, "tools[0].type"),
    ({"tools": [{"type": "function", "name": "f", "parameters": {"type": "nonsense"}}]}, "tools"),
    ({"tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": []}}, "tool_choice.type"),
    ({"tool_choice": {"type": "function"}}, "tool_choice.name"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"previous_response_id": "resp_1"}, "previous_response_id"),
    ({"conversation": "conv_1"}, "conversation"),
    ({"background": True}, "background"),
    ({"prompt": {"id": "pmpt_1"}}, "prompt"),
    ({"include": ["file_search_call.results"]}, "include[0]"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
    ({"input": [{"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "zz"}]},
     "input[0].encrypted_content"),
    ({"input": [{"role": "robot", "content": "hi"}]}, "input[0].role"),
    ({"input": []}, "input"),
    ({"input": [{"role": "user", "content": "hi", "audio": {"data": "x"}}]}, "input[0].audio"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}", "namespace": "ns"}]},
     "input[0].namespace"),
    ({"input": [{"type": "web_search_call", "id": "ws_1"}]}, "input[0].type"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"text": {"format": {"type": "yaml"}}}, "text.format.type"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "nope"}}}}, "text.format"),
    ({"truncation": "sometimes"}, "truncation"),
    ({"temperature": "hot"}, "temperature"),
    ({"service_tier": "flex"}, "service_tier"),
    ({"stream_options": {"include_obfuscation": False}}, "stream_options"),
    ({"top_logprobs": 3}, "top_logprobs"),
]


@pytest.mark.parametrize("extra, param", BAD)
def test_bad_input_is_a_400_naming_the_field(server, extra, param):
    r = httpx.post(server.url + ROUTE, json={"model": "tiny", "input": "hi", "max_output_tokens": 2, **extra},
                   timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param, error
    assert error["type"] == "invalid_request_error" and error["message"].startswith(param)
    assert not any(name in error["message"] for name in ("function.", "response_format", "max_completion_tokens",
                                                         "reasoning_effort", "messages"))


def test_accepted_fields_and_unknown_ones_named(server):
    codex = [{"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Be brief."}]},
             {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}], "id": None}]
    body = {"model": "tiny", "input": codex, "max_output_tokens": 2, "store": True, "truncation": "auto",
            "tool_choice": "auto", "parallel_tool_calls": False, "tools": TOOLS,
            "include": ["reasoning.encrypted_content"], "service_tier": "auto", "safety_identifier": "s",
            "prompt_cache_key": "k", "reasoning": {"summary": "auto"}, "text": {"verbosity": "medium"},
            "frobnicate": 1}
    r = httpx.post(server.url + ROUTE, json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["store"] is False and r.json()["truncation"] == "auto"
    assert r.headers["x-ridgeline-ignored-fields"] == "frobnicate"


def test_truncation_auto_never_drops_input(server):
    r = httpx.post(server.url + ROUTE, timeout=60, json={"model": "tiny", "input": "x" * 3000, "truncation": "auto"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input"
    assert r.json()["error"]["code"] == "context_length_exceeded" and "truncation auto" in r.json()["error"]["message"]


def test_an_error_mid_stream_is_an_error_event_then_response_failed():
    from openai.types.responses import ResponseErrorEvent, ResponseFailedEvent
    from ridgeline.errors import InvalidRequestError
    from ridgeline.serve.responses_output import envelope
    from ridgeline.serve.responses_request import ResponsesRequest
    from ridgeline.serve.responses_stream import ResponseEvents
    events = ResponseEvents(None, envelope(ResponsesRequest(model="tiny", input="hi"), "resp_1"), None)
    events.seq = 7
    error, failed = events.failed(InvalidRequestError("grammar: too slow", "text.format", "unsupported_parameter"))
    error, failed = ResponseErrorEvent.model_validate(error), ResponseFailedEvent.model_validate(failed)
    assert (error.sequence_number, error.param, error.code) == (7, "text.format", "unsupported_parameter")
    assert failed.sequence_number == 8 and failed.response.status == "failed"
    assert (failed.response.error.code, failed.response.error.message) == ("invalid_prompt", "grammar: too slow")


def test_an_abandoned_stream_frees_its_request(server):
    """Held at the step gate, the request is still running when the client goes away mid-stream."""
    aborted = metric(server.url, "ridgeline_requests_total", 'status="abort"')
    body = {"model": "tiny", "input": "a long story", "max_output_tokens": 1000, "temperature": 0, "stream": True}
    with StepGate(server.app) as gate:
        with httpx.stream("POST", server.url + ROUTE, json=body, timeout=60) as r:
            lines = r.iter_lines()
            while "response.in_progress" not in next(lines):
                pass
            gate.step()
            gate.step()
            assert metric(server.url, "ridgeline_num_requests_running") == 1
        wait_until(lambda: metric(server.url, "ridgeline_requests_total", 'status="abort"') == aborted + 1)
    wait_idle(server.url)
    assert not server.engine.has_unfinished()


def test_the_key_guard_covers_the_route(tiny_llama):
    with _server(tiny_llama, api_key="sesame") as s:
        with pytest.raises(openai.AuthenticationError) as e:
            _sdk(s, "wrong").responses.create(model="tiny", input="hi", max_output_tokens=2)
        assert e.value.status_code == 401 and "message" in e.value.body
        assert _sdk(s, "sesame").responses.create(model="tiny", input="hi", max_output_tokens=2).usage.output_tokens
        r = httpx.post(s.url + ROUTE, headers={"x-api-key": "sesame"}, timeout=60,
                       json={"model": "tiny", "input": "hi", "max_output_tokens": 2})
        assert r.status_code == 200
