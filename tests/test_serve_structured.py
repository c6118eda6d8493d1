"""Structured outputs through the server: response_format (json_object, json_schema strict or not),
structured_outputs and guided_* on chat and completions, streamed or not, n > 1; the OpenAI SDK's
parse() returns a parsed object; every way of asking wrong is a 400 naming the field."""
from __future__ import annotations

import json
import re

import httpx
import openai
import pytest
from jsonschema import Draft202012Validator
from pydantic import BaseModel, Field

CHAT, CMPL = "/v1/chat/completions", "/v1/completions"
SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                           "rank": {"type": "integer", "minimum": 1, "maximum": 9}},
          "required": ["city", "rank"], "additionalProperties": False}


def chat(**kw) -> dict:
    return {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 200, **kw}


def cmpl(**kw) -> dict:
    return {"model": "tiny", "prompt": "hi", "max_tokens": 200, **kw}


@pytest.fixture(scope="module")
def client(tiny_server):
    with httpx.Client(base_url=tiny_server.url, timeout=60) as c:
        yield c


def _streamed(client, route: str, body: dict) -> dict[int, str]:
    texts: dict[int, str] = {}
    with client.stream("POST", route, json={**body, "stream": True}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for c in json.loads(line[6:])["choices"]:
                    part = c["delta"].get("content", "") if "delta" in c else c["text"]
                    texts[c["index"]] = texts.get(c["index"], "") + (part or "")
    return texts


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("strict", [True, False])
def test_json_schema_on_chat(client, stream, strict):
    body = chat(n=2, temperature=1.0, seed=5, response_format={
        "type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA, "strict": strict}})
    if stream:
        texts = list(_streamed(client, CHAT, body).values())
    else:
        r = client.post(CHAT, json=body)
        assert r.status_code == 200, r.text
        texts = [c["message"]["content"] for c in r.json()["choices"]]
        assert all(c["finish_reason"] == "stop" for c in r.json()["choices"])
    assert len(texts) == 2
    for t in texts:
        Draft202012Validator(SCHEMA).validate(json.loads(t))


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("field,value,check", [
    ("guided_choice", ["alpha", "beta"], lambda t: t in ("alpha", "beta")),
    ("guided_regex", "[a-c]{2}[0-9]", lambda t: re.fullmatch("[a-c]{2}[0-9]", t)),
    ("guided_json", SCHEMA, lambda t: Draft202012Validator(SCHEMA).validate(json.loads(t)) is None),
    ("guided_grammar", 'root ::= "on" | "off"', lambda t: t in ("on", "off")),
    ("structured_outputs", {"choice": ["x1", "y2"]}, lambda t: t in ("x1", "y2")),
    ("structured_outputs", {"regex": "[0-9]{4}"}, lambda t: re.fullmatch("[0-9]{4}", t)),
    ("response_format", {"type": "json_object"}, lambda t: isinstance(json.loads(t), dict)),
    ("regex", "[d-f]{3}", lambda t: re.fullmatch("[d-f]{3}", t)),  # SGLang's spellings
    ("ebnf", 'root ::= "yes" | "no"', lambda t: t in ("yes", "no")),
    ("json_schema", json.dumps(SCHEMA), lambda t: Draft202012Validator(SCHEMA).validate(json.loads(t)) is None),
    ("json_schema", SCHEMA, lambda t: Draft202012Validator(SCHEMA).validate(json.loads(t)) is None),  # llama.cpp's
    ("grammar", 'root ::= "up" | "down"', lambda t: t in ("up", "down")),
])
def test_every_spelling_on_completions(client, stream, field, value, check):
    body = cmpl(**{field: value}, temperature=0, max_tokens=300)
    if stream:
        [text] = _streamed(client, CMPL, body).values()
    else:
        r = client.post(CMPL, json=body)
        assert r.status_code == 200, r.text
        text = r.json()["choices"][0]["text"]
    assert check(text), text


class Pet(BaseModel):
    name: str = Field(max_length=6)
    legs: int = Field(ge=0, le=8)
    kind: str = Field(pattern="^(cat|dog|bird)$")


def test_openai_sdk_parse(tiny_server):
    client = openai.OpenAI(base_url=tiny_server.url + "/v1", api_key="none")
    done = client.chat.completions.parse(model="tiny", messages=[{"role": "user", "content": "a pet"}],
                                         response_format=Pet, max_tokens=200, temperature=0)
    pet = done.choices[0].message.parsed
    assert isinstance(pet, Pet) and 0 <= pet.legs <= 8 and pet.kind in ("cat", "dog", "bird")


@pytest.mark.parametrize("route,body,param,needle", [
    (CHAT, chat(response_format={"type": "json_schema", "json_schema": {"name": "x"}}), "response_format",
     "schema is missing"),
    (CHAT, chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": [1]}}),
     "response_format", "JSON object"),
    (CHAT, chat(response_format={"type": "yaml"}), "response_format", "type must be"),
    (CMPL, cmpl(guided_choice=[]), "guided_choice", "empty"),
    (CMPL, cmpl(guided_choice=["a", "a"]), "guided_choice", "twice"),
    (CHAT, chat(response_format={"type": "json_object"}, structured_outputs={"regex": "a"}), "structured_outputs",
     "one way"),
    (CMPL, cmpl(guided_regex="a", guided_choice=["a"]), "guided_choice", "one way"),
    (CMPL, cmpl(structured_outputs={"regex": "a", "choice": ["a"]}), "structured_outputs", "exactly one"),
    (CMPL, cmpl(structured_outputs={"structural_tag": "x"}), "structured_outputs", "structural"),
    (CMPL, cmpl(structured_outputs={"jsn": {}}), "structured_outputs", "unknown"),
    (CMPL, cmpl(guided_regex="(?=a)b"), "guided_regex", "look-around"),
    (CHAT, chat(response_format={"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"$ref": "https://example.com/schema.json"}}}), "response_format", "example.com"),
    (CMPL, cmpl(guided_grammar="start: nope"), "guided_grammar", "nope"),
    (CMPL, cmpl(guided_json={"type": "string", "format": "bogus"}), "guided_json", "bogus"),
    (CMPL, cmpl(guided_choice=["a"], guided_decoding_backend="xgrammar"), "guided_decoding_backend", "llguidance"),
])
def test_bad_requests_name_the_field(client, route, body, param, needle):
    r = client.post(route, json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and needle in err["message"], err


def test_a_bad_grammar_harms_no_other_request(client):
    assert client.post(CMPL, json=cmpl(guided_regex="(a)\\1")).status_code == 400
    r = client.post(CMPL, json=cmpl(max_tokens=4))
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length"


def _metric(text: str, name: str) -> float:
    return float(re.search(rf"^{name}(?:_total)? (\S+)$", text, re.M).group(1))


def test_metrics_count_constrained_work(client):
    before = client.get("/metrics").text
    body = cmpl(n=2, max_tokens=40, structured_outputs={"choice": ["alpha beta gamma delta", "omega"]})
    r = client.post(CMPL, json=body)
    assert r.status_code == 200, r.text
    after = client.get("/metrics").text
    grew = {n: _metric(after, f"ridgeline_structured_{n}") - _metric(before, f"ridgeline_structured_{n}")
            for n in ("choices", "tokens", "forced_tokens", "mask_rows", "mask_steps", "mask_seconds")}
    assert grew["choices"] == 2
    tokens = r.json()["usage"]["completion_tokens"]
    assert grew["tokens"] == tokens and grew["mask_rows"] >= tokens and grew["mask_steps"] >= 1
    # once a choice's first letters decide it, the rest of it is forced
    assert 0 < grew["forced_tokens"] < tokens and grew["mask_seconds"] > 0
    assert _metric(after, "ridgeline_structured_compiles") >= 1
    assert _metric(after, "ridgeline_structured_compile_seconds") > 0
