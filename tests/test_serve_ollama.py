"""ollama's REST API through ollama's own Python client on a tiny random model: greedy replies equal the
OpenAI routes' for the same request (chat, generate through the template, raw generate, embeddings),
streamed and whole alike; options, format and think reach the engine; tool calls round trip in ollama's
shape; every bad field is a 400 in ollama's error body naming it; an abandoned stream frees its request;
the API key guard covers /api/."""
from __future__ import annotations

import json

import httpx
import ollama
import openai
import pytest
from jsonschema import Draft202012Validator

from server_helpers import wait_idle

USER = [{"role": "user", "content": "Say something."}]
GREEDY = {"temperature": 0, "num_predict": 12}
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "description": "The city."},
                                            "days": {"type": "integer"}}, "required": ["city", "days"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather.", "parameters": WEATHER}}]


def _serve(tmp_path_factory, name: str, settings=None, tokenizer=None, **model):
    from conftest import SERVER_OPTS, make_tiny_model
    from ridgeline.config import EngineConfig
    from ridgeline.engine.llm_engine import LLMEngine
    from ridgeline.serve.app import build_app
    from ridgeline.serve.server import ServerThread
    from ridgeline.serve.state import ServerSettings
    folder = make_tiny_model(tmp_path_factory.mktemp(name), "llama", max_position_embeddings=2048, **model)
    if tokenizer is not None:
        tokenizer(folder)
    engine = LLMEngine(EngineConfig.from_kwargs(str(folder), progress=False,
                                                **{**SERVER_OPTS, "kv_cache_memory": "16MiB"}))
    return ServerThread(build_app(engine, settings or ServerSettings("tiny", quiet=True)))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with _serve(tmp_path_factory, "tiny-ollama") as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return ollama.Client(host=server.url, timeout=60)


@pytest.fixture(scope="module")
def sdk(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)


def _post(server, path: str, **body) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=60)


def _streamed_chat(client, **kw) -> tuple[dict, list]:
    parts = list(client.chat(stream=True, **kw))
    text = {"content": "".join(p.message.content or "" for p in parts),
            "thinking": "".join(p.message.thinking or "" for p in parts) or None,
            "tool_calls": [c for p in parts for c in p.message.tool_calls or []]}
    return text, parts


# ---- chat and generate agree with the OpenAI routes --------------------------------------------------------
def test_chat_whole_and_streamed_equal_the_openai_route(client, sdk):
    whole = client.chat(model="tiny", messages=USER, options=GREEDY)
    assert whole.done and whole.done_reason in ("stop", "length") and whole.message.role == "assistant"
    ref = sdk.chat.completions.create(model="tiny", messages=USER, temperature=0, max_tokens=12)
    assert whole.message.content == (ref.choices[0].message.content or "")
    assert whole.prompt_eval_count == ref.usage.prompt_tokens and whole.eval_count == ref.usage.completion_tokens
    assert whole.done_reason == {"length": "length"}.get(ref.choices[0].finish_reason, "stop")
    assert whole.total_duration >= whole.prompt_eval_duration > 0 and whole.load_duration == 0
    text, parts = _streamed_chat(client, model="tiny:latest", messages=USER, options=GREEDY)
    assert text["content"] == whole.message.content
    assert all(not p.done for p in parts[:-1]) and parts[-1].done and parts[-1].eval_count == whole.eval_count
    assert parts[-1].done_reason == whole.done_reason and parts[-1].model == "tiny:latest"


def test_stream_is_the_default_and_ndjson(server):
    with httpx.stream("POST", server.url + "/api/chat", json={"model": "tiny", "messages": USER,
                                                                "options": GREEDY}, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(line) for line in r.iter_lines() if line]
    assert lines[-1]["done"] is True and {"eval_count", "eval_duration", "created_at"} <= set(lines[-1])
    assert all(line["done"] is False and "message" in line for line in lines[:-1])


def test_sampling_options_are_those_of_the_openai_route(client, sdk):
    opts = {"temperature": 1.0, "top_p": 0.9, "top_k": 20, "min_p": 0.05, "seed": 7, "num_predict": 16,
            "repeat_penalty": 1.3, "presence_penalty": 0.5, "frequency_penalty": 0.2, "stop": ["zz"],
            "num_gpu": 1, "num_thread": 4, "use_mmap": True, "numa": False, "num_batch": 64, "num_ctx": 1024}
    got = client.chat(model="tiny", messages=USER, options=opts, keep_alive="5m").message.content
    ref = sdk.chat.completions.create(model="tiny", messages=USER, temperature=1.0, top_p=0.9, seed=7, max_tokens=16,
                                      presence_penalty=0.5, frequency_penalty=0.2, stop=["zz"],
                                      extra_body={"top_k": 20, "min_p": 0.05, "repetition_penalty": 1.3})
    assert got == (ref.choices[0].message.content or "")


def test_generate_goes_through_the_template_and_raw_does_not(client, sdk):
    system = "Be brief."
    got = client.generate(model="tiny", prompt="Hello", system=system, options=GREEDY)
    ref = sdk.chat.completions.create(model="tiny", temperature=0, max_tokens=12, messages=[
        {"role": "system", "content": system}, {"role": "user", "content": "Hello"}])
    assert got.response == (ref.choices[0].message.content or "") and got.prompt_eval_count == ref.usage.prompt_tokens
    streamed = "".join(p.response for p in client.generate(model="tiny", prompt="Hello", system=system, options=GREEDY,
                                                            stream=True))
    assert streamed == got.response
    raw = client.generate(model="tiny", prompt="Once upon", raw=True, options=GREEDY)
    cref = sdk.completions.create(model="tiny", prompt="Once upon", temperature=0, max_tokens=12)
    assert raw.response == cref.choices[0].text and raw.prompt_eval_count == cref.usage.prompt_tokens
    assert raw.done_reason == {"length": "length"}.get(cref.choices[0].finish_reason, "stop")
    assert "".join(p.response for p in client.generate(model="tiny", prompt="Once upon", raw=True, options=GREEDY,
                                                       stream=True)) == raw.response
    unbounded = client.generate(model="tiny", prompt="Once upon", raw=True, options={"temperature": 0, "seed": 1,
                                                                                     "num_predict": -1})
    assert unbounded.done and unbounded.eval_count >= 1


def test_logprobs_are_the_openai_routes_entries(client, sdk):
    got = client.chat(model="tiny", messages=USER, options=GREEDY, logprobs=True, top_logprobs=2)
    ref = sdk.chat.completions.create(model="tiny", messages=USER, temperature=0, max_tokens=12, logprobs=True,
                                      top_logprobs=2)
    want = [(e.token, e.logprob, [t.token for t in e.top_logprobs]) for e in ref.choices[0].logprobs.content]
    assert [(e.token, e.logprob, [t.token for t in e.top_logprobs]) for e in got.logprobs] == want
    parts = list(client.chat(model="tiny", messages=USER, options=GREEDY, logprobs=True, top_logprobs=2, stream=True))
    assert [e.token for p in parts for e in p.logprobs or []] == [w[0] for w in want]
    raw = client.generate(model="tiny", prompt="Once upon", raw=True, options=GREEDY, logprobs=True)
    assert len(raw.logprobs) == raw.eval_count and all(e.top_logprobs == [] for e in raw.logprobs)


def test_an_empty_conversation_or_prompt_is_ollamas_load_request(client):
    assert client.chat(model="tiny", messages=[]).done_reason == "load"
    assert client.generate(model="tiny", prompt="").done_reason == "load"


# ---- structured output and tools ----------------------------------------------------------------------------
def test_a_format_schema_is_enforced_and_json_is_json_object(client, sdk):
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["n"], "additionalProperties": False}
    for seed in range(3):
        r = client.chat(model="tiny", messages=USER, format=schema, options={"temperature": 1, "seed": seed,
                                                                             "num_predict": 40})
        Draft202012Validator(schema).validate(json.loads(r.message.content))
        assert r.done_reason == "stop"
    got = client.chat(model="tiny", messages=USER, format="json", options=GREEDY).message.content
    ref = sdk.chat.completions.create(model="tiny", messages=USER, temperature=0, max_tokens=12,
                                      response_format={"type": "json_object"})
    assert got == (ref.choices[0].message.content or "")


def test_tools_and_tool_history_render_as_on_the_openai_route(client, sdk):
    history = [*USER, {"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}]},
               {"role": "tool", "tool_name": "get_weather", "content": "sunny"}]
    openai_history = [*USER, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1_0", "type": "function", "function": {"name": "get_weather",
                                                            "arguments": json.dumps({"city": "Paris", "days": 2})}}]},
                      {"role": "tool", "tool_call_id": "call_1_0", "content": "sunny"}]
    sent = [ollama.Tool.model_validate(t).model_dump(exclude_none=True) for t in TOOLS]  # the client's key order
    ref = sdk.chat.completions.create(model="tiny", temperature=0, max_tokens=12, tools=sent, messages=openai_history)
    got = client.chat(model="tiny", messages=history, tools=TOOLS, options=GREEDY)
    assert got.prompt_eval_count == ref.usage.prompt_tokens > 100  # the tools and the history are in the prompt
    assert got.message.content == (ref.choices[0].message.content or "")
    assert [c.function.name for c in got.message.tool_calls or []] == \
        [c.function.name for c in ref.choices[0].message.tool_calls or []]


@pytest.fixture(scope="module")
def call_server(tmp_path_factory):
    """The generic call format's start marker is a token here, so a sampled reply can open a call (the call
    itself is then constrained to the tool's schema)."""
    from conftest import _byte_tokenizer

    def tokenizer(folder):
        tok = _byte_tokenizer()
        tok.add_tokens(["<tool_call>", "</tool_call>"])
        tok.save(str(folder / "tokenizer.json"))
    with _serve(tmp_path_factory, "tiny-ollama-calls", tokenizer=tokenizer) as s:
        yield s


def test_a_sampled_tool_call_comes_back_in_ollamas_shape(call_server):
    client = ollama.Client(host=call_server.url, timeout=60)
    sdk = openai.OpenAI(base_url=call_server.url + "/v1", api_key="x", max_retries=0)
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 3}, "days": {"type": "integer"}},
        "required": ["city", "days"]}}}]
    sent = [ollama.Tool.model_validate(t).model_dump(exclude_none=True) for t in tools]
    # a seed whose sampled reply opens a call (about one in 150 does; the same seed gives the same reply on one
    # machine): 45 does here; where the kernels round differently, the OpenAI route finds another
    for seed in (45, *range(400)):
        ref = sdk.chat.completions.create(model="tiny", messages=USER, tools=sent, temperature=2.0, seed=seed,
                                          max_tokens=100).choices[0]
        if ref.message.tool_calls:
            break
    else:
        pytest.fail("no seed of 400 opened a call")
    opts = {"temperature": 2.0, "seed": seed, "num_predict": 100}
    want = [(c.function.name, json.loads(c.function.arguments)) for c in ref.message.tool_calls]
    got = client.chat(model="tiny", messages=USER, tools=tools, options=opts).message
    assert [(c.function.name, dict(c.function.arguments)) for c in got.tool_calls] == want
    assert got.content == (ref.message.content or "")
    streamed, _ = _streamed_chat(client, model="tiny", messages=USER, tools=tools, options=opts)
    assert [(c.function.name, dict(c.function.arguments)) for c in streamed["tool_calls"]] == want
    assert streamed["content"] == got.content
    history = [*USER, got.model_dump(exclude_none=True), {"role": "tool", "tool_name": "get_weather",
                                                          "content": "sunny"}]
    assert client.chat(model="tiny", messages=history, tools=tools, options=GREEDY).done  # and it goes back


def test_a_parsed_tool_call_leaves_in_ollamas_shape():
    from ridgeline.serve.ollama import reply
    delta = {"tool_calls": [{"index": 0, "id": "call_x", "type": "function",
                             "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "days": 1}'}}]}
    line = {"model": "tiny", "created_at": reply.created_at(), **reply.chat_piece(delta), "done": False}
    parsed = ollama.ChatResponse(**json.loads(json.dumps(line)))
    [call] = parsed.message.tool_calls
    assert call.function.name == "get_weather" and call.function.arguments == {"city": "Oslo", "days": 1}
    # and the call goes back as history (this client drops the id: one is made up), the result tied to it
    from ridgeline.serve.ollama.messages import chat_messages
    from ridgeline.serve.ollama.protocol import ChatRequest
    back = parsed.message.model_dump(exclude_none=True)
    for sent, call_id in ((back, "call_1_0"), ({**back, "tool_calls": [{"id": "call_x", **back["tool_calls"][0]}]},
                                                "call_x")):
        body = ChatRequest.model_validate({"model": "tiny", "messages": [*USER, sent, {"role": "tool",
                                                                                       "content": "cold"}]})
        msgs = chat_messages(body.messages)
        assert msgs[1]["tool_calls"][0]["id"] == call_id and msgs[2]["tool_call_id"] == call_id
        assert json.loads(msgs[1]["tool_calls"][0]["function"]["arguments"]) == {"city": "Oslo", "days": 1}


# ---- thinking -----------------------------------------------------------------------------------------------
THINK_TEMPLATE = ("{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
                  "{% if add_generation_prompt %}<s>assistant\n"
                  "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n"
                  "{% else %}<think>\n{% endif %}{% endif %}")


@pytest.fixture(scope="module")
def think_server(tmp_path_factory):
    from conftest import _byte_tokenizer

    def tokenizer(folder):
        tok = _byte_tokenizer()
        tok.add_tokens(["<think>", "</think>"])
        tok.save(str(folder / "tokenizer.json"))
        (folder / "tokenizer_config.json").write_text(json.dumps(
            {"bos_token": "<s>", "eos_token": "</s>", "chat_template": THINK_TEMPLATE, "add_bos_token": False}))
    with _serve(tmp_path_factory, "tiny-ollama-think", tokenizer=tokenizer) as s:
        yield s


def test_think_splits_the_reasoning_into_thinking(think_server):
    client = ollama.Client(host=think_server.url, timeout=60)
    sdk = openai.OpenAI(base_url=think_server.url + "/v1", api_key="x", max_retries=0)
    assert "thinking" in client.show("tiny").capabilities
    for seed in range(3):
        opts = {"temperature": 1.0, "seed": seed, "num_predict": 40}
        got = client.chat(model="tiny", messages=USER, think=True, options=opts).message
        ref = sdk.chat.completions.create(model="tiny", messages=USER, temperature=1.0, seed=seed, max_tokens=40,
                                          extra_body={"chat_template_kwargs": {"enable_thinking": True}})
        m = ref.choices[0].message
        assert (got.thinking, got.content) == (m.reasoning_content, m.content or "")
        streamed, _ = _streamed_chat(client, model="tiny", messages=USER, think=True, options=opts)
        assert (streamed["thinking"], streamed["content"]) == (got.thinking, got.content)
    off = client.chat(model="tiny", messages=USER, think=False, options=GREEDY)
    ref = sdk.chat.completions.create(model="tiny", messages=USER, temperature=0, max_tokens=12, extra_body={
        "chat_template_kwargs": {"enable_thinking": False}, "include_reasoning": False})
    assert off.message.thinking is None and off.message.content == (ref.choices[0].message.content or "")
    assert off.prompt_eval_count == ref.usage.prompt_tokens


# ---- embeddings ---------------------------------------------------------------------------------------------
def test_embed_and_embeddings_are_the_openai_routes_vectors(client, sdk):
    got = client.embed(model="tiny", input=["hello there", "a second text"])
    ref = sdk.embeddings.create(model="tiny", input=["hello there", "a second text"])
    assert len(got.embeddings) == 2 and got.prompt_eval_count == ref.usage.prompt_tokens
    for g, r in zip(got.embeddings, ref.data):
        assert g == pytest.approx(r.embedding, abs=1e-6)
    assert client.embed(model="tiny", input="hello there").embeddings[0] == pytest.approx(got.embeddings[0], abs=1e-6)
    legacy = client.embeddings(model="tiny", prompt="hello there").embedding
    raw = sdk.embeddings.create(model="tiny", input="hello there", extra_body={"normalize": False}).data[0].embedding
    assert legacy == pytest.approx(raw, abs=1e-5)
    assert client.embeddings(model="tiny", prompt="").embedding == []


def test_embed_truncates_at_the_window_unless_told_not_to(client, server):
    long = "word " * 900  # a byte a token: past num_ctx 256
    cut = client.embed(model="tiny", input=long, options={"num_ctx": 256})
    assert cut.prompt_eval_count == 256
    r = _post(server, "/api/embed", model="tiny", input=long, truncate=False, options={"num_ctx": 256})
    assert r.status_code == 400 and "truncate" in r.json()["error"]
    r = _post(server, "/api/embed", model="tiny", input="x", dimensions=3)
    assert r.status_code == 400 and r.json()["error"].startswith("dimensions:")


# ---- the model card -----------------------------------------------------------------------------------------
def test_model_routes(client, server):
    [m] = client.list().models
    assert m.model == "tiny:latest" and m.details.family == "llama" and m.details.format == "safetensors"
    assert m.size > 0 and len(m.digest) == 64 and m.details.quantization_level == "F32"
    shown = client.show("tiny:latest")
    assert shown.modelinfo["llama.context_length"] == 2048 and "completion" in shown.capabilities
    assert "thinking" not in shown.capabilities and shown.template
    [p] = client.ps().models
    assert p.model == "tiny:latest" and p.context_length == 2048
    assert _post(server, "/api/show", name="tiny").status_code == 200  # the older field name
    assert httpx.get(server.url + "/api/version").json()["version"]
    assert client.pull("tiny").status == "success"
    with pytest.raises(ollama.ResponseError) as e:
        client.pull("llama3.2")
    assert e.value.status_code == 404 and "ridgeline pull" in e.value.error


# ---- refusals: ollama's error body, naming the field ----------------------------------------------------------
@pytest.mark.parametrize("path, body, status, start", [
    ("/api/chat", {"options": {"bogus": 1}}, 400, "options.bogus:"),
    ("/api/chat", {"options": {"temperature": 5}}, 400, "options.temperature:"),
    ("/api/chat", {"options": {"num_predict": 0}}, 400, "options.num_predict:"),
    ("/api/chat", {"options": {"repeat_penalty": -1}}, 400, "options.repeat_penalty"),
    ("/api/chat", {"options": {"mirostat": 2}}, 400, "options.mirostat:"),
    ("/api/chat", {"options": {"typical_p": 0.5}}, 400, "options.typical_p:"),
    ("/api/chat", {"options": {"repeat_last_n": 64}}, 400, "options.repeat_last_n:"),
    ("/api/chat", {"options": {"num_ctx": 99999}}, 400, "options.num_ctx:"),
    ("/api/chat", {"options": {"num_ctx": 8}}, 400, "options.num_ctx:"),
    ("/api/chat", {"options": {"num_ctx": 64, "num_predict": 60}}, 400, "options.num_ctx:"),
    ("/api/chat", {"options": {"num_predict": 5000}}, 400, "this model's maximum context length"),
    ("/api/chat", {"format": "xml"}, 400, "format:"),
    ("/api/chat", {"format": {"type": "object", "properties": {"a": {"$ref": "http://x/y"}}}}, 400, "format"),
    ("/api/chat", {"think": True}, 400, "think:"),
    ("/api/chat", {"think": "high"}, 400, "think:"),
    ("/api/chat", {"top_logprobs": 2}, 400, "top_logprobs:"),
    ("/api/generate", {"prompt": "x", "raw": True, "top_logprobs": 2}, 400, "top_logprobs:"),
    ("/api/chat", {"bogus": 1}, 400, "bogus:"),
    ("/api/chat", {"messages": "hi"}, 400, "messages:"),
    ("/api/chat", {"messages": [{"role": "user", "content": "x", "images": ["aGk="]}]}, 400, "messages[0].images:"),
    ("/api/chat", {"messages": [{"role": "user", "content": "x", "what": 1}]}, 400, "messages.0.what:"),
    ("/api/chat", {"messages": [*USER, {"role": "tool", "content": "x"}]}, 400, "messages[1]:"),
    ("/api/chat", {"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, 400, "tools[0]"),
    ("/api/chat", {"model": "llama3.2"}, 404, 'model "llama3.2" not found'),
    ("/api/chat", {"stream": "yes"}, 400, "stream:"),
    ("/api/generate", {"prompt": "x", "suffix": "y"}, 400, "suffix:"),
    ("/api/generate", {"prompt": "x", "template": "{{ .Prompt }}"}, 400, "template:"),
    ("/api/generate", {"prompt": "x", "context": [1, 2]}, 400, "context:"),
    ("/api/generate", {"prompt": "x", "images": ["aGk="]}, 400, "images:"),
    ("/api/generate", {"prompt": "x", "raw": True, "system": "s"}, 400, "system:"),
    ("/api/generate", {"prompt": "x", "raw": True, "options": {"temperature": -1}}, 400, "options.temperature:"),
    ("/api/embed", {"input": []}, 400, "input:"),
    ("/api/embed", {"input": "x", "options": {"bogus": 1}}, 400, "options.bogus:"),
    ("/api/show", {"model": "other"}, 404, 'model "other" not found'),
    ("/api/copy", {"source": "a", "destination": "b"}, 404, "no route"),
])
def test_bad_input_is_ollamas_error_naming_the_field(server, path, body, status, start):
    full = {"model": "tiny", **({"messages": USER} if path == "/api/chat" else {}), "stream": False, **body}
    if path in ("/api/embed", "/api/show", "/api/copy"):
        full.pop("stream")
    r = _post(server, path, **full)
    assert r.status_code == status, r.text
    assert list(r.json()) == ["error"] and r.json()["error"].startswith(start), r.text
    wait_idle(server.url)  # a refusal after the job started (num_ctx) freed it


def test_an_abandoned_stream_frees_its_request(server):
    body = {"model": "tiny", "messages": USER, "options": {"temperature": 1.0, "seed": 3, "num_predict": 1500}}
    with httpx.stream("POST", server.url + "/api/chat", json=body, timeout=60) as r:
        assert r.status_code == 200
        first = next(line for line in r.iter_lines() if line)
        assert json.loads(first)["done"] is False
    wait_idle(server.url)


# ---- the key guard and liveness ---------------------------------------------------------------------------
def test_the_key_guard_covers_the_api_and_the_client_sends_its_key(tmp_path_factory, monkeypatch):
    from ridgeline.serve.state import ServerSettings
    with _serve(tmp_path_factory, "tiny-ollama-key", ServerSettings("tiny", quiet=True, api_key="sekret",
                                                                    console=False)) as s:
        monkeypatch.delenv("OLLAMA_API_KEY", raising=False)
        with pytest.raises(ollama.ResponseError) as e:
            ollama.Client(host=s.url).chat(model="tiny", messages=USER, options=GREEDY)
        assert e.value.status_code == 401 and list(json.loads(httpx.get(s.url + "/api/tags").text)) == ["error"]
        keyed = ollama.Client(host=s.url, headers={"Authorization": "Bearer sekret"})
        assert keyed.chat(model="tiny", messages=USER, options=GREEDY).done
        monkeypatch.setenv("OLLAMA_API_KEY", "sekret")  # the client's own way
        assert ollama.Client(host=s.url).list().models
        r = httpx.get(s.url + "/", headers={"Authorization": "Bearer sekret"})
        assert r.status_code == 200 and "Ollama is running" in r.text  # no console here: / is ollama's liveness
