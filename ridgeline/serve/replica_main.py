"""One replica of `ridgeline serve --data-parallel-size N`: `python -m ridgeline.serve.replica_main FD`
(the program router/launch.py starts) serves the OpenAI routes on the listening socket FD its parent
bound, with the threads (and CPUs, where the parent gave some) of its share. Its spec comes as JSON
on stdin (it holds the replica's API key: a command line is readable by any local user): {"model",
"engine": engine keyword arguments, "settings": ServerSettings fields, "threads", "cpus", "index",
"parent"}."""
from __future__ import annotations

import json
import os
import socket
import sys

from ridgeline.utils.lifetime import end_with_parent


def build_replica_app(spec: dict):
    """The FastAPI app of one replica (a process here, a Ray actor in serve/ray_executor.py)."""
    import torch

    from ridgeline.config import EngineConfig
    from ridgeline.engine.async_engine import build_off_main_thread
    from ridgeline.engine.llm_engine import LLMEngine
    from ridgeline.serve.app import build_app
    from ridgeline.serve.state import ServerSettings

    if spec.get("secret"):  # the deployment's: tenants' cache salts match the router's
        from ridgeline.utils.internal_auth import adopt_deployment_secret
        adopt_deployment_secret(bytes.fromhex(spec["secret"]))
    torch.set_num_threads(spec["threads"])
    config = EngineConfig.from_kwargs(spec["model"], progress=False, **spec["engine"])
    engine = build_off_main_thread(lambda: LLMEngine(config))
    return build_app(engine, ServerSettings(**spec["settings"]))


def main(argv: list[str]) -> int:
    import logging

    from ridgeline.errors import RidgelineError
    from ridgeline.serve.server import serve_forever

    end_with_parent()
    fd = int(argv[1])
    # the imports first: a process started ahead of its spec (a spare, router/launch.py) is then warm
    import ridgeline.engine.llm_engine  # noqa: F401
    import ridgeline.serve.app  # noqa: F401
    raw = sys.stdin.buffer.read()
    if not raw:
        return 1  # the parent died before it handed the spec over
    spec = json.loads(raw)
    if spec.get("parent") and os.getppid() != spec["parent"]:
        return 1  # the parent died before the line above could take effect
    logging.basicConfig(level=logging.INFO, format=f"%(levelname)s replica {spec.get('index', 0)}: %(message)s")
    if spec.get("cpus") and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, spec["cpus"])
    sock = socket.socket(fileno=fd)
    before = os.getpriority(os.PRIO_PROCESS, 0)
    if spec.get("load_nice"):  # loading beside other models' serving: theirs first while this one loads
        os.setpriority(os.PRIO_PROCESS, 0, before + spec["load_nice"])
    try:
        app = build_replica_app(spec)
    except RidgelineError as e:
        print(f"error: {e.message}", file=sys.stderr)
        return 2
    finally:
        if spec.get("load_nice"):
            try:
                os.setpriority(os.PRIO_PROCESS, 0, before)
            except PermissionError:  # an unprivileged process cannot take it back: it keeps the lower one
                logging.getLogger("ridgeline.serve").warning(
                    "kept nice %d after loading (raising a priority back needs privileges)", before + spec["load_nice"])
    return serve_forever(app, sock)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
