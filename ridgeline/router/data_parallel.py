"""What each replica of `ridgeline serve --data-parallel-size N` is started with (serve/data_parallel.py
runs the launch; router/launch.py or serve/ray_executor.py start the replicas)."""
from __future__ import annotations


def replica_spec(model: str, engine: dict, settings, replica_key: str, secret: bytes) -> dict:
    """What each replica is started with: the served settings, but a key of its own (one per launch, held
    by the router only) in place of the front's, whose requests name their tenant (the router checked
    the client's key); the deployment's secret, so tenants' cache salts match the router's; and room
    for the router's own calls (health checks, /metrics, KV snapshots) beyond its clients' connections."""
    from dataclasses import asdict
    return {"model": model, "engine": engine, "secret": secret.hex(),
            "settings": {**asdict(settings), "quiet": True, "api_key": replica_key, "public_metrics": False,
                         "api_key_file": None, "tenant_header": True, "allowed_origins": (),
                         "max_connections": settings.max_connections + 64}}
