"""The console in headless Chromium (Playwright driving Debian's `chromium`): loads without console errors,
chat streams and stops (the engine frees the request), the live view moves under load, the calculators
show the CLI's numbers, bad input gets an inline message, and the API-key flow."""
from __future__ import annotations

import json
import shutil
import threading

import httpx
import pytest
from server_helpers import StepGate, metric, wait_idle, wait_until

from ridgeline.advisor import local_profile
from ridgeline.advisor.local_profile import PROFILE_VERSION
from ridgeline.cli import main
from ridgeline.serve.app import build_app
from ridgeline.serve.server import ServerThread
from ridgeline.serve.state import ServerSettings

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install '.[test]')")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (apt-get install chromium)")

TIMEOUT_MS = 60_000  # a safety net only
# wait_for_function takes arrow functions: under the console's CSP (no eval) Playwright cannot poll a bare
# expression


# this machine's profile as `ridgeline advise --hardware local` caches it (fixed numbers): the calculators'
# default hardware is this machine, and a web request never measures it, so the tests never depend on whether
# an earlier test happened to measure and cache it
PROFILE = {"version": PROFILE_VERSION, "name": "local test CPU", "kind": "cpu", "threads": 2, "torch": "test",
           "memory": 24 * 2**30, "bandwidth": 40e9, "flops": {"fp32": 2e11, "bf16": 4e11, "int8": 8e11, "fp8": 1e10},
           "weight_stream_bw": {"bf16": 20e9}, "op_overhead": 5e-6, "gemm_curve": {}, "clock": "wall",
           "measured_at": "2026-01-01 00:00:00"}


@pytest.fixture(autouse=True, scope="module")
def measured_profile():
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(local_profile, "cached_profile", lambda *a, **k: dict(PROFILE))
        mp.setattr(local_profile, "measure", lambda *a, **k: pytest.fail("measured from a request"))
        yield


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture
def page(browser):
    p = browser.new_page(viewport={"width": 1280, "height": 900})
    p.set_default_timeout(TIMEOUT_MS)
    p.errors = []
    p.on("console", lambda m: p.errors.append(m.text) if m.type == "error" else None)
    p.on("pageerror", lambda e: p.errors.append(str(e)))
    yield p
    p.close()


def open_view(page, url: str, view: str = "chat"):
    page.goto(f"{url}/#{view}")
    page.wait_for_selector("body[data-ready='1']")


def test_loads_every_view_without_console_errors(tiny_server, page):
    open_view(page, tiny_server.url)
    assert page.inner_text("#model-name") == "tiny"
    page.click("#tab-live")
    page.wait_for_function("() => Number(document.body.dataset.liveUpdates || 0) >= 2")
    page.keyboard.press("ArrowRight")  # the tabs move with the keyboard
    assert page.get_attribute("#tab-calc", "aria-selected") == "true"
    page.wait_for_selector("#calc-form[data-state='done']")
    for kind in ("gpus", "spec", "quant", "disagg", "roofline", "kv"):
        page.check(f"input[name='calc'][value='{kind}']")
        page.wait_for_selector("#calc-form[data-state='done']")
    assert page.errors == []
    assert "NaN" not in page.inner_text("body")


def test_chat_streams_and_stop_frees_the_request(tiny_server, page):
    open_view(page, tiny_server.url)
    page.fill("#chat-temperature", "0")
    page.fill("#chat-max-tokens", "6")
    page.fill("#chat-text", "hello")
    page.press("#chat-text", "Enter")
    page.wait_for_selector(".meta[data-state='done']")
    meta = page.inner_text(".meta[data-state='done']")
    assert "6 tokens" in meta and "TTFT" in meta and "cached prompt tokens" in meta
    aborts = metric(tiny_server.url, "ridgeline_requests_total", 'status="abort"')
    page.fill("#chat-max-tokens", "300")
    with StepGate(tiny_server.app) as gate:
        page.fill("#chat-text", "tell me more")
        page.click("#chat-send")
        wait_until(lambda: gate.parked, "request at the gate")
        for _ in range(3):
            gate.step()
        page.wait_for_function("() => document.querySelectorAll('.msg.assistant .content')[1].textContent.length > 0")
        assert page.is_enabled("#chat-stop")
        page.click("#chat-stop")
        page.wait_for_selector(".meta[data-state='stopped']")
        wait_until(lambda: metric(tiny_server.url, "ridgeline_requests_total", 'status="abort"') == aborts + 1,
                   "the server aborted the request")
    wait_idle(tiny_server.url)  # its KV blocks are back, nothing running or waiting
    assert page.is_enabled("#chat-send") and not page.is_enabled("#chat-stop")


def test_live_numbers_move_under_load(tiny_server, page):
    open_view(page, tiny_server.url, "live")
    page.wait_for_function("() => document.getElementById('live-generated').textContent !== '–'")
    before = float(page.inner_text("#live-generated"))
    body = {"model": "tiny", "messages": [{"role": "user", "content": "load"}], "max_tokens": 5, "temperature": 0}
    with StepGate(tiny_server.app) as gate:
        done = threading.Event()
        threading.Thread(target=lambda: (httpx.post(tiny_server.url + "/v1/chat/completions", json=body, timeout=60),
                                         done.set()), daemon=True).start()
        wait_until(lambda: gate.parked, "request at the gate")
        page.wait_for_function("() => Number(document.getElementById('live-waiting').textContent) + "
                               "Number(document.getElementById('live-running').textContent) === 1")
        gate.open()
        wait_until(done.is_set, "request finished")
    page.wait_for_function(f"() => Number(document.getElementById('live-generated').textContent) === {before + 5}")
    page.wait_for_function("() => document.getElementById('live-running').textContent === '0'")
    assert page.inner_text("#live-ttft") != "–"
    page.select_option("#live-hardware", "Xeon-8480")  # a table entry: the wall needs no measured profile
    page.wait_for_function("() => document.getElementById('live-wall-check').textContent.startsWith('SLOs as measured')")
    check = page.inner_text("#live-wall-check")  # the SLOs judged by the measured medians, the prediction beside
    assert "TTFT" in check and ("met" in check or "missed" in check) and "predicts" in check, check


CALC_INPUTS = [
    {"model": "Llama-3.1-70B", "hardware": "H100-SXM", "prompt_len": "2000", "output_len": "500", "concurrency": "64"},
    {"model": "Qwen2.5-7B", "hardware": "L4", "weights": "fp8", "kv": "fp8", "prefix_share": "0.5"},
    {"model": "Mixtral-8x7B", "hardware": "MI300X", "gpus": "2", "concurrency": "8", "alpha": "0.8",
     "draft_len": "3", "rate": "2.5"},
]


def fill_form(page, kind: str, values: dict) -> list[str]:
    """Sets the fields this calculator shows; returns the CLI flags for every field the form sends."""
    page.check(f"input[name='calc'][value='{kind}']")
    page.wait_for_selector("#calc-form[data-state='done'], #calc-form[data-state='error']")
    for name, value in values.items():
        field = f"#calc-{name}"
        if page.query_selector(field) is None:
            continue
        if page.eval_on_selector(field, "e => e.tagName") == "SELECT":
            page.select_option(field, value)
        else:
            page.fill(field, value)
    page.evaluate("document.getElementById('calc-form').dataset.state = 'busy'")
    page.click("#calc-run")
    page.wait_for_selector("#calc-form[data-state='done']")
    sent = page.eval_on_selector_all("#calc-fields input, #calc-fields select",
                                     "els => els.map(e => [e.name, e.value])")
    return [x for name, value in sent if value != "" for x in (f"--{name.replace('_', '-')}", value)]


@pytest.mark.parametrize("kind", ["kv", "gpus", "spec", "disagg", "quant"])
def test_calculators_show_the_cli_numbers(tiny_server, page, capsys, kind):
    open_view(page, tiny_server.url, "calc")
    page.wait_for_selector("#calc-form[data-state]")
    for values in CALC_INPUTS:
        flags = fill_form(page, kind, values)
        assert main(["advise", kind, *flags, "--json"]) == 0
        cli = json.loads(capsys.readouterr().out)
        shown = dict(page.eval_on_selector_all(".step", "els => els.map(e => [e.dataset.key, e.dataset.value])"))
        expected = {f"{s}.{k}": v["value"] for s, sec in cli["sections"].items() for k, v in sec["values"].items()}
        assert shown.keys() == expected.keys()
        for key, value in expected.items():
            assert (float(shown[key]) if shown[key] else None) == value, key
        assert main(["advise", kind, *flags]) == 0
        assert page.eval_on_selector("#calc-text", "e => e.textContent") == capsys.readouterr().out.rstrip("\n")


def test_bad_input_shows_an_inline_message(tiny_server, page):
    open_view(page, tiny_server.url, "calc")
    page.wait_for_selector("#calc-form[data-state]")
    page.check("input[name='calc'][value='spec']")
    page.wait_for_selector("#calc-form[data-state='done']")
    for value, words in (("", "is empty"), ("-5", "positive"), ("1e30", "out of range"), ("abc", "must be a number")):
        page.fill("#calc-prompt_len", value)
        page.click("#calc-run")
        page.wait_for_selector("#calc-form[data-state='error']")
        assert words in page.inner_text("#calc-error")
        assert page.get_attribute("#calc-prompt_len", "aria-invalid") == "true"
        assert page.query_selector(".step") is None and not page.is_visible("#calc-chart")
        assert "NaN" not in page.inner_text("body")
        page.fill("#calc-prompt_len", "64")
        page.click("#calc-run")
        page.wait_for_selector("#calc-form[data-state='done']")
        assert page.inner_text("#calc-error") == "" and page.is_visible("#calc-chart")


def test_spec_slider_moves_the_batch(tiny_server, page):
    open_view(page, tiny_server.url, "calc")
    page.wait_for_selector("#calc-form[data-state]")
    page.check("input[name='calc'][value='spec']")
    page.wait_for_selector("#calc-form[data-state='done']")
    page.focus("#calc-batch")
    for _ in range(3):
        page.keyboard.press("ArrowRight")
    page.wait_for_function("() => document.getElementById('calc-chart-note').textContent.startsWith('batch 8:')")
    assert page.inner_text("#calc-batch-out") == "8"


def test_api_key_is_asked_for_and_sent(tiny_engine, page):
    settings = ServerSettings("tiny", quiet=True, api_key="sesame")
    with ServerThread(build_app(tiny_engine, settings)) as s:
        page.goto(s.url + "/")
        page.wait_for_selector("#key-form:not([hidden])")
        page.fill("#api-key", "wrong")
        page.click("#key-form button")
        page.wait_for_function("() => document.getElementById('key-error').textContent.includes('refused')")
        page.fill("#api-key", "sesame")
        page.click("#key-form button")
        page.wait_for_selector("body[data-ready='1']")
        assert page.inner_text("#model-name") == "tiny"
        page.fill("#chat-max-tokens", "3")
        page.fill("#chat-text", "hi")
        page.press("#chat-text", "Enter")
        page.wait_for_selector(".meta[data-state='done']")
        page.click("#tab-live")
        page.wait_for_function("() => Number(document.body.dataset.liveUpdates || 0) >= 1")
        assert page.is_hidden("#key-form")


def test_chat_takes_a_json_schema(tiny_server, page):
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9},
                                               "ok": {"type": "boolean"}},
              "required": ["n", "ok"], "additionalProperties": False}
    open_view(page, tiny_server.url)
    page.fill("#chat-schema", "{not json")
    page.fill("#chat-text", "hi")
    page.press("#chat-text", "Enter")
    page.wait_for_selector(".meta[data-state='error']")
    assert "JSON schema: not valid JSON" in page.inner_text(".meta[data-state='error']")
    page.fill("#chat-schema", json.dumps(schema))
    page.fill("#chat-temperature", "1")
    page.fill("#chat-max-tokens", "60")
    page.fill("#chat-text", "a number and a flag")
    page.press("#chat-text", "Enter")
    page.wait_for_selector(".meta[data-state='done']")
    reply = json.loads(page.inner_text(".msg.assistant:not(.error) .content"))
    assert set(reply) == {"n", "ok"} and 0 <= reply["n"] <= 9 and isinstance(reply["ok"], bool)
    assert "stop" in page.inner_text(".meta[data-state='done']")
    assert page.errors == []


def test_chat_shows_reasoning_and_tool_calls(tiny_server, page):
    """The reply's deltas as a reasoning model with tools streams them (the route answered by the test):
    reasoning folds above the answer, calls show below it; a tools box that is not a list is refused."""
    def sse(*deltas):
        chunks = [{"choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas]
        chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
        return "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"

    body = sse({"role": "assistant", "content": ""}, {"reasoning_content": "The user wants "},
               {"reasoning_content": "a sum."}, {"content": "Adding."},
               {"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                "function": {"name": "add", "arguments": '{"a": 1}'}}]})
    sent = []
    page.route("**/v1/chat/completions", lambda route: sent.append(route.request.post_data_json) or route.fulfill(
        status=200, headers={"Content-Type": "text/event-stream"}, body=body))
    open_view(page, tiny_server.url)
    page.fill("#chat-tools", "{}")
    page.fill("#chat-text", "hi")
    page.press("#chat-text", "Enter")
    page.wait_for_selector(".meta[data-state='error']")
    assert "Tools: must be a JSON list" in page.inner_text(".meta[data-state='error']") and not sent
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    page.fill("#chat-tools", json.dumps(tools))
    page.fill("#chat-text", "add one")
    page.press("#chat-text", "Enter")
    page.wait_for_selector(".meta[data-state='done']")
    assert sent[-1]["tools"] == tools
    reply = ".msg.assistant:not(.error)"
    assert page.inner_text(f"{reply} .content") == "Adding."
    assert page.inner_text(f"{reply} .tool-calls") == 'call add({"a": 1})'
    page.click(f"{reply} .thinking summary")
    assert "The user wants a sum." in page.inner_text(f"{reply} .thinking")
    assert "tool_calls" in page.inner_text(".meta[data-state='done']") and page.errors == []
