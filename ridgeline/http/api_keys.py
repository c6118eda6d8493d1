"""The API keys a front accepts and the tenant each belongs to.

`--api-key KEY`: one key, no tenant (every client shares one prefix-cache namespace).
`--api-key-file FILE`: one key per line, `KEY TENANT` (blank lines and lines starting with # are
skipped; several keys may share a tenant). Readable by its owner only, as ssh asks of a private key.
Tenants get separate prefix-cache namespaces (engine/cache_namespace.py): a tenant's requests reuse
its own cached blocks and never another tenant's, and `cached_tokens` tells it about its own only.

A presented key is looked up by its keyed hash (a random key per process): the lookup's time does
not depend on how much of a real key it matches, however many keys there are."""
from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
import stat
from pathlib import Path

from ridgeline.errors import InvalidRequestError

TENANT = re.compile(r"[A-Za-z0-9_.@:-]{1,64}")
MAX_KEYS = 100_000


class ApiKeys:
    def __init__(self, keys: dict[str, str | None]):
        """keys: key -> tenant (None: no tenant)."""
        self._pepper = secrets.token_bytes(32)
        self._tenants = {self._digest(k): t for k, t in keys.items()}

    def _digest(self, key: str) -> bytes:
        return hmac.new(self._pepper, key.encode("utf-8", "surrogatepass"), hashlib.sha256).digest()

    def __bool__(self) -> bool:
        return bool(self._tenants)

    @property
    def tenanted(self) -> bool:
        return any(t is not None for t in self._tenants.values())

    def check(self, presented: str) -> tuple[bool, str | None]:
        """(the key is one of ours, its tenant)."""
        d = self._digest(presented)
        if d not in self._tenants:
            return False, None
        return True, self._tenants[d]


def check_key(key: str | None, flag: str = "--api-key") -> str | None:
    """An empty key is an error, never a silent 'no auth'."""
    if key is not None and not key.strip():
        raise InvalidRequestError(f"{flag} is empty: give a key, or leave the flag (and $RIDGELINE_API_KEY) unset "
                                  "to serve without one", "api_key")
    return key


def load_api_keys(key: str | None = None, key_file: str | os.PathLike | None = None) -> ApiKeys:
    """The keys of --api-key or --api-key-file (not both)."""
    if key is not None and key_file is not None:
        raise InvalidRequestError("give --api-key or --api-key-file, not both", "api_key")
    if key_file is None:
        key = check_key(key)
        return ApiKeys({} if key is None else {key: None})
    return ApiKeys(read_key_file(key_file))


def read_key_file(path: str | os.PathLike) -> dict[str, str]:
    p = Path(path)
    try:
        mode = p.stat().st_mode
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise InvalidRequestError(f"cannot read --api-key-file {str(p)!r}: {e}", "api_key_file") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise InvalidRequestError(f"--api-key-file {str(p)!r} is readable or writable by other users (mode "
                                  f"{stat.S_IMODE(mode):o}); chmod 600 it", "api_key_file")
    keys: dict[str, str] = {}
    for no, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) != 2 or not TENANT.fullmatch(parts[1]):
            raise InvalidRequestError(f"--api-key-file line {no}: expected `KEY TENANT` (a tenant is 1-64 of "
                                      "A-Z a-z 0-9 _ . @ : -)", "api_key_file")
        if parts[0] in keys:
            raise InvalidRequestError(f"--api-key-file line {no}: a key listed twice", "api_key_file")
        keys[parts[0]] = parts[1]
        if len(keys) > MAX_KEYS:
            raise InvalidRequestError(f"--api-key-file holds more than {MAX_KEYS} keys", "api_key_file")
    if not keys:
        raise InvalidRequestError(f"--api-key-file {str(p)!r} holds no key", "api_key_file")
    return keys
