"""API keys with tenants (serve/api_keys.py) and the prefix-cache namespace they key
(engine/cache_namespace.py): one tenant's requests reuse its own blocks and never another's."""
from __future__ import annotations

import pytest

from ridgeline.engine.cache_namespace import cache_namespace, tenant_salt
from ridgeline.engine.prefix_cache import block_hashes
from ridgeline.errors import InvalidRequestError
from ridgeline.serve.api_keys import load_api_keys, read_key_file


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
