"""Bad advisor input (unknown names, missing config fields, impossible sizes): exit code 2, no traceback."""
from __future__ import annotations

from ridgeline.errors import InvalidRequestError


class AdvisorError(InvalidRequestError):
    pass


def require_positive(name: str, value: float) -> float:
    if value is None or value <= 0:
        raise AdvisorError(f"{name} must be positive, got {value}", name)
    return value
