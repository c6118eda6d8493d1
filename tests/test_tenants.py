"""API keys with tenants (http/api_keys.py) and the prefix-cache namespace they key
(engine/cache_namespace.py): one tenant's requests reuse its own blocks and never another's."""
from __future__ import annotations

import pytest

from ridgeline.engine.cache_namespace import cache_namespace, tenant_salt
from ridgeline.engine.prefix_cache import block_hashes
from ridgeline.errors import InvalidRequestError
from ridgeline.http.api_keys import load_api_keys, read_key_file


def _file(tmp_path, text, mode=0o600):
    p = tmp_path / "keys"
    p.write_text(text)
    p.chmod(mode)
    return p


def test_a_key_file_maps_keys_to_tenants(tmp_path):
    keys = load_api_keys(key_file=_file(tmp_path, "# ops\nk-alpha-1 alpha\n\nk-alpha-2 alpha\nk-beta beta\n"))
    assert keys.check("k-alpha-1") == (True, "alpha") and keys.check("k-alpha-2") == (True, "alpha")
    assert keys.check("k-beta") == (True, "beta") and keys.check("k-beta ") == (False, None)
    assert keys.check("") == (False, None) and keys.tenanted
    one = load_api_keys("secret")
    assert one.check("secret") == (True, None) and not one.tenanted and bool(one)
    assert not load_api_keys(None)


@pytest.mark.parametrize("text, match", [
    ("k1\n", "expected `KEY TENANT`"),
    ("k1 a b\n", "expected `KEY TENANT`"),
    ("k1 bad/tenant\n", "expected `KEY TENANT`"),
    ("k1 a\nk1 b\n", "listed twice"),
    ("# nothing\n", "holds no key"),
])
def test_bad_key_files_are_refused(tmp_path, text, match):
    with pytest.raises(InvalidRequestError, match=match):
        read_key_file(_file(tmp_path, text))


def test_key_file_mode_empty_keys_and_both_flags(tmp_path):
    with pytest.raises(InvalidRequestError, match="chmod 600"):
        read_key_file(_file(tmp_path, "k a\n", 0o644))
    with pytest.raises(InvalidRequestError, match="is empty"):
        load_api_keys("  ")
    with pytest.raises(InvalidRequestError, match="not both"):
        load_api_keys("k", _file(tmp_path, "k a\n"))


def test_tenants_never_share_blocks_and_a_client_cannot_spell_another_tenant():
    secret = b"s" * 32
    a, b = tenant_salt(secret, "alpha"), tenant_salt(secret, "beta")
    assert a != b and a == tenant_salt(secret, "alpha") and a != tenant_salt(b"t" * 32, "alpha")
    ids = list(range(64))
    ns = [cache_namespace(a), cache_namespace(b), cache_namespace(a, salt="x"), cache_namespace(),
          cache_namespace(salt="x"), cache_namespace(a, adapter="x")]
    hashes = [block_hashes(ids, 16, n) for n in ns]
    assert len({h[0] for h in hashes}) == len(ns)  # every namespace keys its own blocks
    assert cache_namespace() is None and cache_namespace(salt="x") == "x"  # no tenant: as before
    # on a server with tenants every request has one: a client salt spelling another tenant's namespace
    # (were it guessed) stays inside its own
    assert cache_namespace(b, salt=cache_namespace(a)) != cache_namespace(a)
    assert cache_namespace(a, salt="y") != cache_namespace(a, salt="y\0adapter=1:z")


# ---- through the server and the router ---------------------------------------------------------
import httpx  # noqa: E402

from spawned import serve  # noqa: E402

KEYS = "k-alpha-1 alpha\nk-alpha-2 alpha\nk-beta beta\n"
PROMPT = "the shared system prompt of every tenant in this test " * 6


def _keyfile(tmp_path):
    return str(_file(tmp_path, KEYS))


def _ask(url, key, prompt=PROMPT, **headers):
    r = httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": prompt, "max_tokens": 2},
                   headers={"Authorization": f"Bearer {key}", **headers}, timeout=60)
    assert r.status_code == 200, r.text
    return r


def _cached(r) -> int:
    return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


@pytest.fixture(scope="module")
def tenant_server(tiny_llama, tmp_path_factory):
    keys = _keyfile(tmp_path_factory.mktemp("keys"))
    with serve([str(tiny_llama), "--port", "0", "--served-model-name", "tiny", "--dtype", "float32",
                "--kv-cache-memory", "4MiB", "--quiet", "--api-key-file", keys,
                "--allowed-origins", "https://app.example.com"], r"at (http://\S+)/v1") as got:
        yield got[1]


def test_a_tenants_blocks_serve_it_and_no_other(tenant_server):
    url = tenant_server
    assert _cached(_ask(url, "k-alpha-1")) == 0
    assert _cached(_ask(url, "k-alpha-2")) > 0  # the same tenant, another key: its blocks
    assert _cached(_ask(url, "k-beta")) == 0  # another tenant: the prompt is not cached for it
    assert _cached(_ask(url, "k-beta")) > 0  # its own blocks now
    assert httpx.get(url + "/v1/models", headers={"Authorization": "Bearer k-gamma"}).status_code == 401
    # a client cannot name a tenant: the header is only trusted behind a launcher's front
    r = _ask(url, "k-beta", "another prompt that beta alone has sent, long enough for a block " * 3)
    assert _cached(_ask(url, "k-alpha-1", "another prompt that beta alone has sent, long enough for a block " * 3,
                        **{"x-ridgeline-tenant": "beta"})) == 0 and r


def test_browsers_only_from_allowed_origins(tenant_server):
    url, key = tenant_server, {"Authorization": "Bearer k-alpha-1"}
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 1}
    r = httpx.post(url + "/v1/completions", json=body, headers={**key, "Origin": "https://evil.example"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed"
    r = httpx.post(url + "/v1/completions", json=body, headers={**key, "Origin": "https://app.example.com"})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://app.example.com"
    pre = httpx.options(url + "/v1/completions", headers={"Origin": "https://app.example.com",
                                                         "Access-Control-Request-Method": "POST",
                                                         "Access-Control-Request-Headers": "authorization"})
    assert pre.status_code == 200 and "POST" in pre.headers["access-control-allow-methods"]
    # a blind cross-site form post: refused even from an allowed page; the same bytes from curl are JSON
    form = {**key, "Content-Type": "application/x-www-form-urlencoded"}
    raw = b'{"model": "tiny", "prompt": "hi", "max_tokens": 1}'
    assert httpx.post(url + "/v1/completions", content=raw,
                      headers={**form, "Origin": "https://app.example.com"}).status_code == 415
    assert httpx.post(url + "/v1/completions", content=raw, headers=form).status_code == 200
    # the console's own page (same origin) is trusted here: this server checks a key
    assert httpx.post(url + "/v1/completions", json=body, headers={**key, "Origin": url}).status_code == 200


def test_without_a_key_only_a_literal_host_is_its_own_origin():
    """DNS rebinding: a page at http://rebound.example:8000 whose name now resolves to 127.0.0.1 sends
    Origin and Host both rebound.example: 'same origin', so a keyless front trusts only IP literals
    and localhost as its own."""
    from ridgeline.http.origins import OriginPolicy
    keyless = OriginPolicy()
    assert keyless.refusal({}) is None  # curl, SDKs
    assert keyless.refusal({"origin": "http://127.0.0.1:8000", "host": "127.0.0.1:8000"}) is None
    assert keyless.refusal({"origin": "http://localhost:8000", "host": "localhost:8000"}) is None
    assert keyless.refusal({"origin": "http://[::1]:8000", "host": "[::1]:8000"}) is None
    assert keyless.refusal({"origin": "http://rebound.example:8000", "host": "rebound.example:8000"}).status == 403
    assert keyless.refusal({"origin": "http://127.0.0.1:9", "host": "127.0.0.1:8000"}).status == 403
    assert keyless.refusal({"origin": "null", "host": "127.0.0.1:8000"}).status == 403
    assert OriginPolicy(keyed=True).refusal({"origin": "http://box:8000", "host": "box:8000"}) is None
    assert OriginPolicy(("*",)).refusal({"origin": "https://any.example", "host": "x"}) is None
    assert OriginPolicy(("*",)).refusal({"origin": "https://any.example", "host": "x",
                                         "content-type": "text/plain"}).status == 415


def test_the_router_keeps_tenants_apart_and_predicts_their_hits(tiny_llama, tmp_path):
    keys = _keyfile(tmp_path)
    with serve([str(tiny_llama), "--port", "0", "--data-parallel-size", "2", "--served-model-name", "tiny",
                "--dtype", "float32", "--kv-cache-memory", "2MiB", "--quiet", "--api-key-file", keys],
               r"at (http://\S+)/v1: 2 replicas") as (_, url):
        first = _ask(url, "k-alpha-1")
        again = _ask(url, "k-alpha-2")
        other = _ask(url, "k-beta")
        assert _cached(first) == 0 and _cached(other) == 0
        # cache-aware routing matches within the tenant: same replica, and it expected the hit it got
        assert again.headers["x-ridgeline-replica"] == first.headers["x-ridgeline-replica"]
        assert int(again.headers["x-ridgeline-expected-cached-tokens"]) == _cached(again) > 0
        assert int(other.headers["x-ridgeline-expected-cached-tokens"]) == 0
