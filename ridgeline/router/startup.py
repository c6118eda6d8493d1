"""Start-up checks of a router's replicas: each one reachable and a Ridgeline server, all serving
the same model (and, for cache-aware routing, the same block size and KV events on)."""
from __future__ import annotations

import asyncio
from pathlib import Path

import httpx

from ridgeline.errors import RidgelineError
from ridgeline.router.replica import Replica


class RouterConfigError(RidgelineError):
    status = 400
    type = "invalid_request_error"


def normalize(url: str) -> str:
    url = url.strip().rstrip("/")
    if url.endswith("/v1"):
        url = url[:-3]
    if "://" not in url:
        url = "http://" + url
    return url


async def fetch_info(client: httpx.AsyncClient, url: str) -> dict:
    try:
        r = await client.get(url + "/info")
    except httpx.HTTPError as e:
        raise RouterConfigError(f"replica {url} is unreachable: {type(e).__name__}: {e or 'no answer'}") from None
    if r.status_code == 404:
        raise RouterConfigError(f"replica {url} is not a Ridgeline server (it has no /info route)")
    if r.status_code == 401:
        raise RouterConfigError(f"replica {url} refused the router's key: give the replicas' key as "
                                "--replica-api-key")
    if r.status_code != 200:
        raise RouterConfigError(f"replica {url} answered /info with HTTP {r.status_code}")
    return r.json()


async def discover(client: httpx.AsyncClient, urls: list[str], policy: str) -> list[Replica]:
    if not urls:
        raise RouterConfigError("no replicas: give at least one --replica URL")
    urls = [normalize(u) for u in urls]
    dup = sorted({u for u in urls if urls.count(u) > 1})
    if dup:
        raise RouterConfigError(f"replica {dup[0]} is given twice")
    infos = await asyncio.gather(*(fetch_info(client, u) for u in urls), return_exceptions=True)
    for info in infos:  # every check has finished (none left pending), then the first failure
        if isinstance(info, BaseException):
            raise info
    check_same_model(urls, infos, policy)
    return [Replica(u, info) for u, info in zip(urls, infos)]


def check_same_model(urls: list[str], infos: list[dict], policy: str) -> None:
    models = {info.get("model") for info in infos}
    if len(models) > 1:
        served = ", ".join(f"{u} serves `{i.get('model')}`" for u, i in zip(urls, infos))
        raise RouterConfigError(f"replicas serve different models ({served}); a router fronts replicas of one "
                                "model (start them with the same --served-model-name)")
    if policy != "cache-aware":
        return
    sizes = {info.get("block_size") for info in infos}
    if len(sizes) > 1:
        raise RouterConfigError(f"cache-aware routing needs one KV block size, the replicas use {sorted(sizes)} "
                                "(--block-size)")
    silent = [u for u, i in zip(urls, infos) if not i.get("kv_events_endpoint")]
    if silent:
        raise RouterConfigError(f"cache-aware routing needs KV events, and {', '.join(silent)} publishes none: "
                                "start it with --kv-events-endpoint tcp://HOST:PORT (or use --policy least-load)")


def tokenizer_folder(given: str | None, infos: list[dict]) -> Path:
    """--tokenizer, else the replicas' model folder when this machine has it."""
    if given is not None:
        folder = Path(given)
        if not (folder / "tokenizer.json").exists():
            raise RouterConfigError(f"--tokenizer {given}: no tokenizer.json there")
        return folder
    for info in infos:
        folder = Path(info.get("model_path") or "")
        if info.get("model_path") and (folder / "tokenizer.json").exists():
            return folder
    raise RouterConfigError("cache-aware routing tokenizes requests, but the replicas' model folder "
                            f"({infos[0].get('model_path')}) is not on this machine: give --tokenizer FOLDER "
                            "(a folder with the model's tokenizer.json and tokenizer_config.json)")
