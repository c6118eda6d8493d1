"""The one prefix-cache namespace of a request: who may share its KV blocks. Two requests share a block
only when their namespaces are equal (the namespace is the salt of the first block's hash: see
prefix_cache.py), so the fields below must be derived the same way by every process that computes
block hashes — the replica's engine and a router predicting its hits.

Fields, in this fixed order, each length-prefixed so no value can spell another's:
    tenant   HMAC(deployment secret, tenant name) (the tenant an API key belongs to); a client cannot
             choose it, and without the secret nobody can compute another tenant's hashes
    adapter  the LoRA adapter the request runs under (its KV differs from the base model's)
    salt     the client's own `cache_salt`
The model is implied: one engine's prefix cache holds one model. No field set: None, the unsalted
namespace every request without a tenant, adapter or salt shares."""
from __future__ import annotations

import hashlib
import hmac

VERSION = "ns1"


def tenant_salt(secret: bytes, tenant: str) -> str:
    """The tenant's field: unguessable without the secret, the same in every process holding it."""
    return hmac.new(secret, b"ridgeline-tenant\0" + tenant.encode("utf-8", "surrogatepass"),
                    hashlib.sha256).hexdigest()[:32]


def cache_namespace(tenant: str | None = None, adapter: str | None = None, salt: str | None = None) -> str | None:
    """tenant: tenant_salt(...)'s value, not the tenant's name."""
    if tenant is None and adapter is None and salt is None:
        return None
    if tenant is None and adapter is None:
        return salt  # a client salt alone keys blocks as it always has
    parts = [VERSION]
    for name, value in (("tenant", tenant), ("adapter", adapter), ("salt", salt)):
        if value is not None:
            parts.append(f"{name}={len(value)}:{value}")
    return "\0".join(parts)
