"""Response headers every front passes on from the server that answered (a router's replica, a
disaggregated decode worker), so a client sees them whichever front it called."""
from __future__ import annotations

IGNORED_FIELDS = "x-ridgeline-ignored-fields"  # request fields no part of Ridgeline knows (serve/fields.py)
PASSED_ON = (IGNORED_FIELDS,)


def passed_on(headers) -> dict[str, str]:
    """The headers of an upstream response a front repeats to its client."""
    return {k: v for k, v in headers.items() if k.lower() in PASSED_ON}
