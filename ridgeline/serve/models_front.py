"""`ridgeline serve --models a,b,...`: several models behind one endpoint, each in its own replica process
started on its first request (router/fleet.py), stopped after --keep-alive seconds idle or, least recently
used first, when starting another would exceed --models-memory. A model is `NAME=MODEL` (clients send
NAME) or just MODEL (its name as given). The replicas take a key made for this launch that only the front
holds; clients reach them through the front's guard only."""
from __future__ import annotations

import argparse
import threading
from dataclasses import replace
from pathlib import Path

from ridgeline.errors import InvalidRequestError
from ridgeline.http.front_limits import new_api_key
from ridgeline.router.data_parallel import replica_spec
from ridgeline.router.fleet import Fleet, FleetModel
from ridgeline.utils.internal_auth import deployment_secret

WEIGHT_FILES = ("*.safetensors", "*.bin", "*.gguf", "*.pt")
LOAD_NICE = 10  # a model loads at this much lower CPU priority, so the models serving meanwhile keep theirs


def parse_models(text: str) -> list[tuple[str, str]]:
    """"a=path,b" -> [(name, model)]; names unique and non-empty. A folder of models (one that is not a model
    folder itself): each model folder in it (a config.json) and each GGUF file, named by its folder or file
    stem."""
    folder = Path(text).expanduser()
    if "," not in text and "=" not in text and folder.is_dir() and not (folder / "config.json").exists():
        found = sorted([(p.name, str(p)) for p in folder.iterdir() if p.is_dir() and (p / "config.json").exists()]
                       + [(p.stem, str(p)) for p in folder.glob("*.gguf") if p.is_file()])
        if not found:
            raise InvalidRequestError(f"--models {text}: the folder holds no model (a folder with a config.json, "
                                      "or a .gguf file)", "models")
        names = [n for n, _ in found]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise InvalidRequestError(f"--models {text}: two models named {twice[0]!r} (a folder and a .gguf file)",
                                      "models")
        return found
    out = []
    for part in text.split(","):
        part = part.strip()
        name, sep, model = part.partition("=")
        name, model = name.strip(), (model.strip() if sep else name.strip())
        if not name or not model:
            raise InvalidRequestError(f"--models: {part!r} is not NAME=MODEL or MODEL", "models")
        if name in (n for n, _ in out):
            raise InvalidRequestError(f"--models names {name!r} twice", "models")
        out.append((name, model))
    return out


def model_bytes(model: str, engine: dict) -> int:
    """What a loaded model holds, estimated: its weight files (a folder's or a GGUF's; 0 for an alias not on
    disk yet) and its KV budget (--kv-cache-memory, else the engine's default cap)."""
    from ridgeline.config import parse_bytes
    from ridgeline.engine.build import DEFAULT_KV_CAP
    p = Path(model).expanduser()
    weights = p.stat().st_size if p.is_file() else (
        sum(f.stat().st_size for pattern in WEIGHT_FILES for f in p.glob(pattern)) if p.is_dir() else 0)
    kv = engine.get("kv_cache_memory")
    return weights + (parse_bytes(kv) if kv is not None else DEFAULT_KV_CAP)


def serve_models(args: argparse.Namespace, engine: dict, settings, sock) -> int:
    from ridgeline.config import parse_bytes
    from ridgeline.http.server import url_of
    from ridgeline.router.core import RouterSettings
    from ridgeline.router.launch import ProcessLauncher, spare
    from ridgeline.router.serve import build_router, serve_fleet

    import ridgeline.serve.anthropic  # noqa: F401  (their error shapes: the front answers in each API's own)
    import ridgeline.serve.ollama  # noqa: F401
    from ridgeline.serve.ollama.models import API_VERSION
    key, secret = new_api_key(), deployment_secret(args.internal_secret_file)
    models = [FleetModel(name, {**replica_spec(model, engine, replace(settings, served_model_name=name), key, secret),
                                "load_nice": LOAD_NICE}, model_bytes(model, engine))
              for name, model in parse_models(args.models)]
    budget = parse_bytes(args.models_memory) if args.models_memory else None
    if budget is not None and budget < max(m.nbytes for m in models):
        big = max(models, key=lambda m: m.nbytes)
        raise InvalidRequestError(f"--models-memory {budget} B is less than {big.name!r} needs alone ({big.nbytes} B: "
                                  "its weight files and KV budget)", "models_memory")

    # one process kept started ahead, its imports done: a model's first request waits for its load only
    spares, lock = [spare()], threading.Lock()

    def start(spec: dict):
        with lock:
            ready = spares.pop() if spares else None
        launcher = ProcessLauncher()
        try:
            return launcher, [r.url for r in launcher.start([spec], kv_events=False, spare=ready)]
        finally:
            with lock:
                spares.append(spare())  # the next model's, warming while this one serves

    policy = RouterSettings("least-load", replica_api_key=key, quiet=settings.quiet, limits=settings.limits)
    fleet = Fleet(models, args.keep_alive, budget, start, lambda urls: build_router(urls, policy))
    sock.listen(2048)
    print(f"serving   {', '.join(f'`{m.name}`' for m in models)} at {url_of(sock)}/v1, each loaded on its first "
          f"request (keep-alive {args.keep_alive:g} s); Ctrl-C stops", flush=True)
    try:
        return serve_fleet(fleet, settings.limits, sock, API_VERSION)
    finally:
        for s in spares:
            s.stop()
