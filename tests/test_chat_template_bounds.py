"""Chat-template rendering is bounded: in the server's worker processes a template that loops for
hours is killed at --chat-template-timeout, one that produces gigabytes stops at
--chat-template-max-bytes, one that allocates without end hits the worker's memory limit; each
is a 400 with the template's message, and the next request is served. In any process, every
template failure (jinja's, raise_exception, a TypeError on the messages) is an InvalidRequestError,
never an unexpected exception (a 500)."""
from __future__ import annotations

import json
import os
import shutil

import httpx
import pytest
from conftest import CHATML

from ridgeline.config import EngineConfig
from ridgeline.engine.llm_engine import LLMEngine
from ridgeline.errors import InvalidRequestError
from ridgeline.serve.app import build_app
from ridgeline.serve.server import ServerThread
from ridgeline.serve.state import ServerSettings
from ridgeline.weights.chat_template import TemplateFailure
from ridgeline.weights.template_worker import TemplateWorkers
from ridgeline.weights.tokenizer import Tokenizer

FOREVER = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"  # 1e10 empty turns
HUGE = "{% for i in range(100000) %}{% for j in range(100000) %}0123456789{% endfor %}{% endfor %}"  # 1e11 bytes
# what the first message's content selects: a way to fail, else the ordinary template
TEMPLATE = ("{% set c = messages[0]['content'] %}"
            "{% if c == 'forever' %}" + FOREVER + "{% elif c == 'huge' %}" + HUGE +
            "{% elif c == 'center' %}{{ 'x' | center(10 ** 12) }}"
            "{% elif c == 'raise' %}{{ raise_exception('only one system message, please') }}"
            "{% elif c == 'type' %}{{ 1 + c }}"
            "{% elif c == 'key' %}{{ messages[5]['content'] }}"
            "{% else %}" + CHATML + "{% endif %}")


def with_template(src, dst, template: str):
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "tokenizer_config.json").read_text())
    (dst / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": template}))
    return dst


@pytest.fixture(scope="module")
def model(tiny_llama, tmp_path_factory):
    return with_template(tiny_llama, tmp_path_factory.mktemp("tpl") / "model", TEMPLATE)


def context(content: str) -> dict:
    return {"messages": [{"role": "user", "content": content}], "add_generation_prompt": True,
            "bos_token": "<s>", "eos_token": "</s>"}


def test_workers_kill_a_template_at_its_deadline_and_serve_the_next(model):
    workers = TemplateWorkers(timeout=0.5, max_bytes=1 << 20, size=2)
    try:
        ordinary = workers.render(TEMPLATE, context("hi"))
        assert ordinary == Tokenizer(model).apply_chat_template([{"role": "user", "content": "hi"}])
        [busy] = workers._idle
        limits = f"/proc/{busy.proc.pid}/limits"
        if os.path.exists(limits):  # Linux: the worker's address space is capped
            [line] = [ln for ln in open(limits) if ln.startswith("Max address space")]
            assert line.split()[3] != "unlimited"
        with pytest.raises(TemplateFailure, match=r"within 0\.5s \(--chat-template-timeout\)"):
            workers.render(TEMPLATE, context("forever"))
        assert busy.proc.poll() is not None and not workers._idle  # killed, never reused
        with pytest.raises(TemplateFailure, match=r"more than 1048576 bytes .*--chat-template-max-bytes"):
            workers.render(TEMPLATE, context("huge"))
        with pytest.raises(TemplateFailure, match="out of memory"):
            workers.render(TEMPLATE, context("center"))  # 1 TB in one C call: the worker's memory limit
        assert workers.render(TEMPLATE, context("hi")) == ordinary
        [idle] = workers._idle
    finally:
        workers.close()
    assert idle.proc.wait(10) is not None
    with pytest.raises(RuntimeError):
        workers.render(TEMPLATE, context("hi"))


@pytest.mark.parametrize("content,message", [
    ("raise", "the chat template rejected these messages: only one system message, please"),
    ("type", "the chat template failed on these messages: TypeError: "),
    ("key", "the chat template "),
])
def test_every_template_failure_is_an_invalid_request_in_process(model, content, message):
    with pytest.raises(InvalidRequestError, match=message) as e:
        Tokenizer(model).apply_chat_template([{"role": "user", "content": content}])
    assert e.value.param == "messages" and e.value.status == 400


def test_a_template_that_does_not_compile_is_a_400(tiny_llama, tmp_path):
    tok = Tokenizer(with_template(tiny_llama, tmp_path / "m", "{% for m in messages %}{{ m.content "))
    with pytest.raises(InvalidRequestError, match="does not compile"):
        tok.apply_chat_template([{"role": "user", "content": "hi"}])


@pytest.fixture(scope="module")
def url(model):
    engine = LLMEngine(EngineConfig.from_kwargs(str(model), progress=False, dtype="float32", kv_cache_memory="1MiB"))
    with ServerThread(build_app(engine, ServerSettings("tiny", quiet=True, chat_template_timeout=0.5))) as s:
        yield s.url


@pytest.mark.parametrize("content,needle", [
    ("forever", "--chat-template-timeout"),
    ("huge", "--chat-template-max-bytes"),
    ("center", "out of memory"),
    ("raise", "only one system message, please"),
    ("type", "TypeError"),
    ("key", "the chat template"),
])
def test_the_chat_route_answers_400_and_keeps_serving(url, content, needle):
    body = {"model": "tiny", "max_tokens": 2, "temperature": 0}
    r = httpx.post(url + "/v1/chat/completions", json={**body, "messages": [{"role": "user", "content": content}]},
                   timeout=60)  # without the bounds, "forever" and "huge" hold the request far past this
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert needle in err["message"] and err["param"] == "messages" and err["type"] == "invalid_request_error"
    ok = httpx.post(url + "/v1/chat/completions", json={**body, "messages": [{"role": "user", "content": "hi"}]},
                    timeout=60)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] >= 1
