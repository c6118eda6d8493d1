"""What every route needs: the settings, the engines and the metrics, hung on app.state."""
from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request
from pydantic import BaseModel

from ridgeline.engine.async_engine import AsyncEngine
from ridgeline.engine.llm_engine import LLMEngine
from ridgeline.serve.errors import ApiError
from ridgeline.serve.metrics import ServerMetrics
from ridgeline.serve.request_log import RequestLog


@dataclass(frozen=True)
class ServerSettings:
    served_model_name: str
    api_key: str | None = None
    max_waiting: int = 1024  # requests accepted but without a first token; more get 429
    max_body_bytes: int = 8 << 20
    drain_timeout: float = 30.0  # seconds in-flight requests get to finish on SIGINT/SIGTERM
    log_requests: str | None = None  # append each request body to this file as a JSON line


@dataclass
class ServerState:
    settings: ServerSettings
    engine: LLMEngine  # read-only here (tokenizer, limits); the step thread owns its state
    async_engine: AsyncEngine
    metrics: ServerMetrics
    request_log: RequestLog | None = None

    def log_request(self, body: BaseModel) -> None:
        if self.request_log is not None:
            self.request_log.write(body)

    def check_model(self, name: str) -> None:
        if name != self.settings.served_model_name:
            raise ApiError(404, f"the model `{name}` does not exist; this server serves "
                                f"`{self.settings.served_model_name}`", param="model", code="model_not_found")


def state_of(request: Request) -> ServerState:
    return request.app.state.ridgeline
