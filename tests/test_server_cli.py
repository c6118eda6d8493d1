"""`ridgeline serve` as a process: start-up report; SIGTERM drains (a stream that finishes in time
finishes; one that outlives --drain-timeout ends with an in-band error and [DONE]) and exits 0; a
second signal ends everything at once and exits non-zero. The flags: MODEL positional, --help."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest
from conftest import make_tiny_model
from server_helpers import SAFETY_S

from ridgeline.cli import main

LONG_TOKENS = 30000  # a stream that no machine finishes within the drain timeouts used here


class Served:
    """The server process, its output collected by a thread (a full pipe would stall its logging)."""

    def __init__(self, model_dir, *extra: str):
        cmd = [sys.executable, "-m", "ridgeline.cli", "serve", str(model_dir), "--port", "0", "--dtype", "float32",
               "--kv-cache-memory", "24MiB", "--served-model-name", "tiny", *extra]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self._cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()
        serving = self.wait_for("serving")
        self.url = serving.split(" at ")[1].split("/v1")[0]
        deadline = time.monotonic() + SAFETY_S
        while True:
            try:
                if httpx.get(self.url + "/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "server never became healthy"
            time.sleep(0.05)

    def _read(self) -> None:
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(line)
                self._cond.notify_all()
        with self._cond:
            self.lines.append(None)
            self._cond.notify_all()

    def wait_for(self, prefix: str) -> str:
        def found():
            return next((ln for ln in self.lines if ln is None or ln.startswith(prefix)), False)
        with self._cond:
            line = self._cond.wait_for(found, SAFETY_S)
        assert line, f"no line starting with {prefix!r}:\n{self.output}"
        return line

    @property
    def output(self) -> str:
        return "".join(ln for ln in self.lines if ln is not None)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture(scope="module")
def long_model(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny-long"), "llama", max_position_embeddings=32768)


def _stream(url: str, max_tokens: int, on_first_event) -> list[str]:
    body = {"model": "tiny", "prompt": "a", "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
            "logprobs": 0, "stream_options": {"include_usage": True}}
    events: list[str] = []
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=SAFETY_S) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                if not events:
                    on_first_event()
                events.append(line[6:])
    return events


def test_serve_reports_startup_and_drains_on_sigterm(tiny_llama):
    s = Served(tiny_llama, "--drain-timeout", "120")
    try:
        assert "kv cache" in s.output and "LlamaForCausalLM" in s.output and s.url.startswith("http://127.0.0.1:")
        events = _stream(s.url, 300, lambda: s.proc.send_signal(signal.SIGTERM))  # must still finish
        assert events[-1] == "[DONE]"
        assert json.loads(events[-2])["usage"]["completion_tokens"] == 300
        assert s.proc.wait(timeout=SAFETY_S) == 0
        assert "draining" in s.output and "Traceback" not in s.output
    finally:
        s.close()


def test_sigterm_ends_what_outlives_the_drain_with_an_error_and_exits_0(long_model):
    s = Served(long_model, "--drain-timeout", "0.5")
    try:
        events = _stream(s.url, LONG_TOKENS, lambda: s.proc.send_signal(signal.SIGTERM))
        assert events[-1] == "[DONE]"
        error = json.loads(events[-2])["error"]
        assert error["type"] == "service_unavailable" and "drain timeout" in error["message"]
        assert s.proc.wait(timeout=SAFETY_S) == 0
        out = s.output
        assert out.count("shutdown: aborted cmpl-") == 1
        assert "Traceback" not in out and "CancelledError" not in out and "ERROR" not in out, out
    finally:
        s.close()


def test_a_second_signal_ends_everything_at_once_and_exits_non_zero(long_model):
    s = Served(long_model, "--drain-timeout", "600")

    def two_signals():
        s.proc.send_signal(signal.SIGTERM)
        s.wait_for("SIGTERM: draining")  # the first is handled: the second is not merged into it
        s.proc.send_signal(signal.SIGINT)

    try:
        events = _stream(s.url, LONG_TOKENS, two_signals)
        assert events[-1] == "[DONE]" and json.loads(events[-2]).get("error", {}).get("type") == \
            "service_unavailable", s.output
        assert s.proc.wait(timeout=SAFETY_S) == 128 + signal.SIGINT
        assert "second signal" in s.output and "Traceback" not in s.output
    finally:
        s.close()


def test_model_positional_or_flag_but_not_two_different(capsys):
    assert main(["serve", "model-a", "--model", "model-b"]) == 2
    assert "two models" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["serve", "--help-all"])  # every flag; --help shows the common ones
    help_text = capsys.readouterr().out
    assert "MODEL" in help_text and "temperature 1" in help_text and "max_tokens 16" in help_text
    for flag in ("--timeout-header", "--timeout-body", "--max-connections", "--drain-timeout", "--public-metrics",
                 "--quiet", "--max-waiting"):
        assert flag in help_text


@pytest.mark.parametrize("port", ["99999", "-1"])
def test_a_port_out_of_range_is_one_error_line(capsys, port):
    assert main(["serve", "--port", port]) == 2
    err = capsys.readouterr().err
    assert "--port must be in [0, 65535]" in err and "Traceback" not in err
