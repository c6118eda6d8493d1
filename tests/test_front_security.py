"""API keys and exposure on every front's command line: an empty key is an error naming its flag
(never "auth off"), the key is read from $RIDGELINE_API_KEY once and removed from the environment, a
child gets it by environment only, and listening beyond loopback without a key (or publishing KV
events there) prints a warning."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from router_helpers import FakeReplica

from ridgeline.cli import main
from ridgeline.errors import InvalidRequestError
from ridgeline.http.front_limits import exposure_warning, is_loopback, resolve_api_key
from ridgeline.utils.api_key_env import API_KEY_ENV, env_with_api_key
from ridgeline.serve.kv_publisher import endpoint_warning


@pytest.mark.parametrize("argv, flag", [
    (["serve", "MODEL", "--api-key", ""], "--api-key is empty"),
    (["serve", "MODEL", "--api-key", "  "], "--api-key is empty"),
    (["serve", "MODEL", "--api-key", "ключ"], "--api-key must be printable ASCII"),
    (["serve", "MODEL", "--disaggregate", "1P1D", "--api-key", ""], "--api-key is empty"),
    (["serve", "MODEL", "--data-parallel-size", "2", "--api-key", ""], "--api-key is empty"),
    (["router", "--replica", "http://127.0.0.1:9", "--api-key", ""], "--api-key is empty"),
    (["router", "--replica", "http://127.0.0.1:9", "--replica-api-key", ""], "--replica-api-key is empty"),
    (["router", "--replica", "http://127.0.0.1:9", "--max-body-bytes", "0"], "--max-body-bytes must be >= 1"),
])
def test_an_empty_key_is_an_error_naming_the_flag(argv, flag, capsys, tiny_llama, monkeypatch):
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    argv = [str(tiny_llama) if a == "MODEL" else a for a in argv]
    assert main([*argv, "--port", "0"]) == 2  # before any model loads or any replica is asked
    assert flag in capsys.readouterr().err


@pytest.mark.parametrize("command", ["serve", "router"])
def test_an_empty_key_in_the_environment_is_an_error(command, capsys, tiny_llama, monkeypatch):
    monkeypatch.setenv(API_KEY_ENV, "")
    argv = ["serve", str(tiny_llama)] if command == "serve" else ["router", "--replica", "http://127.0.0.1:9"]
    assert main([*argv, "--port", "0"]) == 2
    assert f"${API_KEY_ENV} is empty" in capsys.readouterr().err


def test_the_key_is_read_once_and_leaves_the_environment(monkeypatch):
    monkeypatch.setenv(API_KEY_ENV, "from-env")
    assert resolve_api_key(None) == "from-env" and API_KEY_ENV not in os.environ
    assert resolve_api_key(None) is None  # gone: what this process starts does not inherit it
    monkeypatch.setenv(API_KEY_ENV, "from-env")
    assert resolve_api_key("given") == "given" and API_KEY_ENV not in os.environ  # the flag wins
    with pytest.raises(InvalidRequestError, match="leading or trailing"):
        resolve_api_key(" padded")


def test_a_child_gets_the_key_by_environment_only(monkeypatch):
    monkeypatch.setenv(API_KEY_ENV, "the-parents-own")
    env = env_with_api_key("child-key")
    assert env[API_KEY_ENV] == "child-key" and env["PATH"] == os.environ["PATH"]
    assert API_KEY_ENV not in env_with_api_key(None)
    code = "import os, sys; sys.stdout.write(open(f'/proc/{os.getpid()}/cmdline').read() + os.environ['" \
           + API_KEY_ENV + "'])"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.endswith("child-key") and "child-key" not in out[:-len("child-key")]


@pytest.mark.parametrize("host, exposed", [
    ("127.0.0.1", False), ("::1", False), ("[::1]", False), ("localhost", False), ("127.0.0.2", False),
    ("0.0.0.0", True), ("::", True), ("10.0.0.2", True), ("example.org", True)])
def test_listening_beyond_loopback_without_a_key_is_a_warning(host, exposed):
    assert is_loopback(host) is not exposed
    message = exposure_warning(host, None, "the router")
    assert (message is not None) is exposed
    if exposed:
        assert message.startswith("warning   the router listens on") and "--api-key" in message
    assert exposure_warning(host, "k") is None


def _no_serving(*args, **kwargs) -> int:
    return 0


@pytest.mark.parametrize("extra, warned", [([], True), (["--api-key", "k"], False)])
def test_router_and_server_warn_at_start_up(extra, warned, capsys, tiny_llama, monkeypatch):
    import ridgeline.router.serve
    import ridgeline.serve.server
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    monkeypatch.setattr(ridgeline.router.serve, "serve_router", _no_serving)
    monkeypatch.setattr(ridgeline.serve.server, "serve_forever", _no_serving)
    fake = FakeReplica()
    try:
        assert main(["router", "--replica", fake.url, "--policy", "least-load", "--host", "0.0.0.0", "--port", "0",
                     *extra]) == 0
        assert ("warning   the router listens on every interface without --api-key" in capsys.readouterr().err) \
            is warned
    finally:
        fake.close()
    assert main(["serve", str(tiny_llama), "--host", "0.0.0.0", "--port", "0", "--dtype", "float32",
                 "--kv-cache-memory", "2MiB", "--quiet", *extra]) == 0
    assert ("warning   the server listens on every interface without --api-key" in capsys.readouterr().err) is warned


@pytest.mark.parametrize("endpoint, where", [
    ("tcp://*:5557", "every interface"), ("tcp://0.0.0.0:5557", "every interface"),
    ("tcp://[::]:5557", "every interface"),
    ("tcp://10.1.2.3:5557", "10.1.2.3"), ("tcp://eth0:5557", "eth0"),
    ("tcp://127.0.0.1:5557", None), ("tcp://[::1]:5557", None), ("tcp://localhost:5557", None),
    ("ipc:///tmp/x/kv", None), ("inproc://kv", None)])
def test_kv_events_on_a_wildcard_or_non_loopback_address_are_a_warning(endpoint, where):
    message = endpoint_warning(endpoint)
    if where is None:
        assert message is None
    else:
        assert f"publishes KV events on {where} without authentication" in message and "ipc://" in message


def test_the_publisher_says_it(capsys):
    pytest.importorskip("zmq")
    from ridgeline.serve.kv_publisher import KVEventPublisher
    for endpoint, warned in (("tcp://0.0.0.0:*", True), ("tcp://127.0.0.1:*", False)):
        KVEventPublisher(endpoint, 16).close()
        assert ("warning   --kv-events-endpoint" in capsys.readouterr().err) is warned
