"""How a launcher hands a server it starts its API key: in the child's environment ($RIDGELINE_API_KEY,
which `ridgeline serve` and `ridgeline router` read and then remove), never on its command line, which
any local user can read. Torch-free and server-free, so a tool that starts servers as processes (the
serving benchmarks) needs nothing of the server's own code."""
from __future__ import annotations

import os

API_KEY_ENV = "RIDGELINE_API_KEY"


def env_with_api_key(key: str | None, env: dict[str, str] | None = None) -> dict[str, str]:
    """A child's environment (this process's, or `env`) carrying `key` in $RIDGELINE_API_KEY; for None,
    without that variable at all, so the child does not inherit a key it was not given."""
    out = {k: v for k, v in (os.environ if env is None else env).items() if k != API_KEY_ENV}
    if key is not None:
        out[API_KEY_ENV] = key
    return out
