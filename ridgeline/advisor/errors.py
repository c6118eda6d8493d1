"""Bad advisor input (unknown names, missing config fields, impossible sizes): exit code 2, no traceback."""
from __future__ import annotations

import math

from ridgeline.errors import InvalidRequestError


class AdvisorError(InvalidRequestError):
    pass


def require_positive(name: str, value: float) -> float:
    if value is None or not 0 < value < math.inf:  # nan fails both comparisons
        raise AdvisorError(f"{name} must be a positive finite number, got {value}", name)
    return value
