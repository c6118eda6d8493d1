"""Which browser pages may drive a front. A browser sends `Origin` on every cross-site request and on
same-site POSTs; other clients (curl, SDKs) send none.

- No Origin: not a browser page; any Content-Type is read as JSON (so `curl -d '{...}'`, which sends
  a form type, works as ollama's documented examples expect).
- An Origin in --allowed-origins (none by default; `*` allows any): allowed, with CORS headers.
- The page this front served itself (the console): its Origin names the Host it was loaded from.
  That is trusted only where DNS rebinding cannot forge it: the Host is an IP literal or
  `localhost`, or the front checks an API key (a rebinding page has no key).
- Anything else: 403. A page that is allowed must send JSON as JSON (a form Content-Type from a
  browser is refused with 415: no blind cross-site form post)."""
from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from ridgeline.http.errors import ApiError

JSON_TYPES = ("application/json",)


def _literal(host: str) -> bool:
    name = host.strip("[]").lower()
    if name == "localhost":
        return True
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return False


def _host_of(host_header: str) -> str:
    return urlsplit(f"//{host_header}").hostname or ""


class OriginPolicy:
    def __init__(self, allowed: tuple[str, ...] = (), keyed: bool = False):
        self.any = "*" in allowed
        self.allowed = frozenset(o.rstrip("/").lower() for o in allowed if o != "*")
        self.keyed = keyed

    def refusal(self, headers: dict[str, str]) -> ApiError | None:
        origin = headers.get("origin")
        if origin is None:
            return None
        o = origin.rstrip("/").lower()
        if not (self.any or o in self.allowed or self._same_origin(o, headers.get("host", ""))):
            return ApiError(403, f"requests from the web page at {origin!r} are refused: add it to "
                                 "--allowed-origins to let it use this server", code="origin_not_allowed")
        kind = headers.get("content-type", "").split(";")[0].strip().lower()
        if kind and kind not in JSON_TYPES and not kind.endswith("+json"):
            return ApiError(415, f"a browser request must send its body as application/json, not {kind!r}",
                            code="unsupported_media_type")
        return None

    def _same_origin(self, origin: str, host: str) -> bool:
        parts = urlsplit(origin)
        if parts.netloc != host.lower() or parts.scheme not in ("http", "https"):
            return False
        return self.keyed or _literal(_host_of(host))
