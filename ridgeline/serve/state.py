"""What every route needs: the settings, the engines and the metrics, hung on app.state."""
from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from fastapi import Request
from pydantic import BaseModel

from ridgeline.engine.async_engine import AsyncEngine
from ridgeline.engine.llm_engine import LLMEngine
from ridgeline.http.errors import ApiError
from ridgeline.serve.drain import Drain
from ridgeline.serve.metrics import ServerMetrics
from ridgeline.serve.request_log import RequestLog
from ridgeline.serve.settings import ServerSettings
from ridgeline.utils import internal_auth


@dataclass
class ServerState:
    settings: ServerSettings
    engine: LLMEngine  # read-only here (tokenizer, limits); the step thread owns its state
    async_engine: AsyncEngine
    metrics: ServerMetrics
    request_log: RequestLog | None = None
    drain: Drain = None
    system_fingerprint: str = ""
    kv_events: object = None  # the KVEventPublisher with --kv-events-endpoint, else None
    # tokenizing and chat-template rendering run here, off the event loop: a huge prompt must not
    # stall every other route (the tokenizer releases the GIL while it encodes)
    executor: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(4, "ridgeline-tokenize"))
    disagg: object = None  # a prefill or decode worker's role (ridgeline/disagg/worker.py); None: co-located
    chat_template: object = None  # TemplateWorkers: chat templates rendered under the settings' bounds
    # the deployment's secret: tenants' prefix-cache salts are keyed by it (engine/cache_namespace.py)
    cache_secret: bytes = field(default_factory=internal_auth.deployment_secret)
    text_bound: object = None  # limits.TextBound: text prompts longer can never fit (None: no sound bound)
    pending_seqs: int = 0  # sequences of requests admitted and not yet counted by the engine (generate.admitted)
    pooling: str = "last"  # how an embedding is read from the hidden states (serve/pooling.py)

    def render(self, source: str, context: dict) -> str:
        """A chat template rendered in a bounded worker (Tokenizer's `render`)."""
        return self.chat_template.render(source, context)

    def log_request(self, body: BaseModel) -> None:
        if self.request_log is not None:
            self.request_log.write(body)

    def check_model(self, name: str) -> None:
        if name != self.settings.served_model_name:
            raise ApiError(404, f"the model `{name}` does not exist; this server serves "
                                f"`{self.settings.served_model_name}`", param="model", code="model_not_found")

    async def offload(self, name: str, fn, *args):
        """fn(*args) on the executor; ends with the drain's 503 if the drain timeout passes first."""
        job = asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)
        job.add_done_callback(_consume)  # no "exception never retrieved" if nobody waits for it
        expired = asyncio.ensure_future(self.drain.expired.wait())
        try:
            await asyncio.wait({job, expired}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            expired.cancel()
        if not job.done():
            self.drain.log_aborted(name)
            raise self.drain.error
        return job.result()


def _consume(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()


def state_of(request: Request) -> ServerState:
    return request.app.state.ridgeline
