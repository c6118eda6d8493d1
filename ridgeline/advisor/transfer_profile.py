"""This machine's measured KV transfer cost (from `ridgeline bench disagg`), kept beside the other
measured numbers of the local profile (the model cache dir's advisor/ folder), and the last measured
1P1D vs co-located goodput and the engine's own prefill and decode-step cost. Torch-free."""
from __future__ import annotations

import json
import re
import time
from pathlib import Path

from ridgeline.advisor.local_profile import _cpu_name
from ridgeline.advisor.memory import kv_bytes_per_token
from ridgeline.weights.cache_dir import model_cache_dir

VERSION = 1


def profile_path() -> Path:
    key = re.sub(r"[^A-Za-z0-9.]+", "_", _cpu_name())
    return model_cache_dir() / "advisor" / f"kv-transfer-{key}.json"


def load() -> dict | None:
    try:
        p = json.loads(profile_path().read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return p if p.get("version") == VERSION else None


def save(section: str, value: dict) -> Path:
    """Store one section ("transfer", "engine" or "goodput") of the profile, keeping the others."""
    p = load() or {"version": VERSION}
    p[section] = {**value, "measured_at": time.strftime("%Y-%m-%d %H:%M:%S")}
    path = profile_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(p, indent=1))
    return path


def transfer_cost(profile: dict | None, kv: str, connector: str | None = None) -> dict | None:
    """{"connector", "fixed_s", "per_token_s", "bytes_per_token", ...} measured for KV format kv (the
    cheapest connector when none is named), or None if it was not measured."""
    if not profile or "transfer" not in profile:
        return None
    kv = {"bfloat16": "bf16", "fp16": "bf16", "f16": "bf16"}.get(kv, kv)
    found = []
    for name, by_kv in profile["transfer"].get("connectors", {}).items():
        if (connector is None or name == connector) and kv in by_kv:
            found.append({"connector": name, **by_kv[kv]})
    return min(found, key=lambda c: c["per_token_s"]) if found else None


def seconds(cost: dict, tokens: int) -> float:
    return cost["fixed_s"] + cost["per_token_s"] * tokens


def measured_cost(s, connector: str | None = None) -> dict | None:
    """The profile's transfer cost for the scenario's KV precision, rescaled to its model's bytes per token."""
    cost = transfer_cost(load(), s.w.kv_precision, connector)
    if cost is None:
        return None
    scale = kv_bytes_per_token(s.spec, s.w.kv_precision) / cost["bytes_per_token"]
    return {**cost, "per_token_s": cost["per_token_s"] * scale}
