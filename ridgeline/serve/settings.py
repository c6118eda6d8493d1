"""The server's settings (its flags), in a module that loads neither torch nor the web stack: `serve --help`
builds its flags' defaults from them."""
from __future__ import annotations

from dataclasses import dataclass

from ridgeline.http.front_limits import FrontLimits
from ridgeline.sampling_params import MAX_N
from ridgeline.serve.limits import CHAT_TEMPLATE_TIMEOUT_S, MAX_LOGPROB_ENTRIES


@dataclass(frozen=True)
class ServerSettings:
    served_model_name: str
    api_key: str | None = None  # this and the other FrontLimits fields: see http/front_limits.py
    max_waiting: int = 1024  # sequences (prompts x n) accepted but without a first token; more get 429
    max_body_bytes: int = FrontLimits.max_body_bytes
    drain_timeout: float = 30.0  # seconds in-flight requests get to finish on SIGINT/SIGTERM
    log_requests: str | None = None  # append each request body to this file as a JSON line
    timeout_header: float = FrontLimits.timeout_header
    timeout_body: float = FrontLimits.timeout_body
    max_connections: int = FrontLimits.max_connections
    public_metrics: bool = False  # /metrics needs no API key
    quiet: bool = False  # no per-request or throughput log lines
    kv_events_endpoint: str | None = None  # ZeroMQ endpoint to publish KV events on (serve/kv_publisher.py)
    console: bool = True  # the web console at / (its page and scripts need no key; its APIs do)
    # what one request may make the server spend (serve/limits.py)
    max_n: int = MAX_N  # choices per request
    max_logprob_entries: int = MAX_LOGPROB_ENTRIES  # n x tokens x (1 + top logprobs), prompt's included
    chat_template_timeout: float = CHAT_TEMPLATE_TIMEOUT_S  # seconds one rendering may take
    chat_template_max_bytes: int | None = None  # rendered output; None: 1 MiB, or the longest prompt that fits
    api_key_file: str | None = None  # keys with tenants (http/api_keys.py); not with api_key
    allowed_origins: tuple[str, ...] = ()  # web pages allowed besides the console (http/origins.py)
    tenant_header: bool = False  # behind a launcher's front: its internal key's requests name their tenant
    reasoning_parser: str = "auto"  # the reasoning section of replies: auto (from the template), none, or a format
    pooling: str = "auto"  # embeddings: auto (a sentence-transformers folder's, else last), last, mean or cls

    @property
    def limits(self) -> FrontLimits:
        return FrontLimits(self.api_key, self.public_metrics, self.max_body_bytes, self.timeout_header,
                           self.timeout_body, self.max_connections, self.api_key_file, tuple(self.allowed_origins),
                           self.tenant_header)
