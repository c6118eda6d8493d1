"""clean(text): user text made safe for one log line. Control characters (newlines, carriage
returns, escape sequences, Unicode line separators) and lone surrogates are written as escapes, so a
field name, model name or message can neither forge a log line nor break the log's encoding."""
from __future__ import annotations

import re

_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(m: re.Match) -> str:
    ch = m.group()
    return _NAMED.get(ch) or (f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}")


def clean(text: object, limit: int = 200) -> str:
    """`text` as one printable line, cut to `limit` characters (a log line is not an archive)."""
    s = str(text)
    if len(s) > limit:
        s = s[:limit] + f"...({len(s) - limit} more)"
    return _UNSAFE.sub(_escape, s)
