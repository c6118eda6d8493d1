"""KV transfer cost on this machine: a request's prompt KV from one pool to another process's pool.

The sender (this process) holds a pool laid out as the model's KV spec says (random bytes); the
receiver (a child process) listens with the same connector and has its own pool. One transfer is
timed end to end as a decode worker would see it: gather the blocks out of the sender's pool,
deliver (connect, authenticate, send, the receiver checks and files it and acknowledges), then the
receiver's scatter into its pool. Configurations (connector x KV format x prompt length) are interleaved rep by rep so a load
change on a shared machine touches all of them alike; the best wall time of the reps is kept (a busy
machine adds waits, never removes work), and the median CPU time of both processes beside it. A straight
line time = fixed + per_token x tokens is fitted per (connector, format) by least squares."""
from __future__ import annotations

import multiprocessing as mp
import statistics
import time
from dataclasses import dataclass

from ridgeline.kv_spec import KV_FORMATS, KVCacheSpec

KV_NAMES = {"bf16": "bf16", "bfloat16": "bf16", "int8": "int8", "fp8": "fp8_e4m3", "int4": "int4", "f32": "f32"}


@dataclass(frozen=True)
class Shape:
    """The KV geometry of a model: what a transfer's size depends on."""
    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int = 16

    def spec(self, kv: str) -> KVCacheSpec:
        fmt = KV_FORMATS[KV_NAMES.get(kv, kv)]
        return KVCacheSpec(fmt, self.num_layers, self.num_kv_heads, self.head_dim, self.block_size)


def _receiver(connector: str, shape: Shape, kv_names: list[str], max_blocks: int, secret: bytes, conn) -> None:
    """Child process: for each kv format asked, a connector listening with that pool's layout; then
    for each kv message issue a transfer id, take its payload, scatter it into that format's pool,
    and answer the scatter time."""
    import torch

    from ridgeline.disagg.blocks import scatter
    from ridgeline.disagg.payload import Layout
    from ridgeline.disagg.transports import create_connector
    from ridgeline.layers.kv_cache import allocate_kv

    torch.set_num_threads(1)
    pools = {kv: allocate_kv(shape.spec(kv), max_blocks + 1, torch.device("cpu")) for kv in kv_names}
    receivers = {kv: create_connector(connector, timeout=60, secret=secret) for kv in kv_names}
    conn.send({kv: c.listen(Layout.of(shape.spec(kv), max_blocks * shape.block_size))
               for kv, c in receivers.items()})
    while True:
        kv = conn.recv()
        if kv is None:
            break
        c = receivers[kv]
        cpu0 = time.process_time()
        tid = c.inbox.expect()
        conn.send(tid)  # the sender starts only now: the receiving thread's CPU time counts from here
        payload = c.inbox.take(tid, 60)
        if payload is None:
            conn.send(None)
            continue
        t = time.perf_counter()
        scatter(pools[kv], list(range(1, payload.header.num_blocks + 1)), payload.data, payload.num_tokens)
        payload.release()
        conn.send((time.perf_counter() - t, time.process_time() - cpu0))
    for c in receivers.values():
        c.close()


class Link:
    """A sender connector in this process and a receiver in a child process, one transport."""

    def __init__(self, connector: str, shape: Shape, kv_names: list[str], max_blocks: int):
        from ridgeline.disagg.transports import create_connector
        from ridgeline.utils.internal_auth import new_secret

        secret = new_secret()  # to the child through its spawn pipe, never its command line
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_receiver, args=(connector, shape, kv_names, max_blocks, secret, child),
                                daemon=True)
        self.proc.start()
        self.addresses = self.conn.recv()
        self.sender = create_connector(connector, timeout=60, secret=secret)

    def transfer(self, layers, blocks: list[int], spec_key: str, kv: str, num_tokens: int) -> tuple[float, float]:
        """(wall seconds, CPU seconds of both processes) for one transfer: gather + deliver + the
        receiver's scatter."""
        from ridgeline.disagg.blocks import gather
        from ridgeline.disagg.payload import Header

        nbytes = len(blocks) * sum(r.shape[1] for r in _regions(layers))
        self.conn.send(kv)
        tid = self.conn.recv()
        header = Header(tid, spec_key, [0] * num_tokens, 0, len(blocks), nbytes)
        t, cpu = time.perf_counter(), time.process_time()
        out = self.sender.prepare(header, lambda o: gather(layers, blocks, num_tokens, o))
        self.sender.deliver(out, self.addresses[kv])
        sent, sent_cpu = time.perf_counter() - t, time.process_time() - cpu
        got = self.conn.recv()
        if got is None:
            raise RuntimeError("the receiver did not get the payload")
        return sent + got[0], sent_cpu + got[1]

    def close(self) -> None:
        self.conn.send(None)
        self.proc.join(30)
        self.sender.close()


def _regions(layers):
    from ridgeline.runner.kv_store import block_regions
    return block_regions(layers)


def fit_line(points: list[tuple[int, float]]) -> tuple[float, float]:
    """(fixed seconds, seconds per token) of the least-squares line through (tokens, seconds)."""
    n = len(points)
    if n == 1:
        return 0.0, points[0][1] / points[0][0]
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    slope = max(0.0, sum((x - mx) * (y - my) for x, y in points) / sxx)  # noise on tiny sizes can tilt it
    return max(0.0, my - slope * mx), slope


def measure(shape: Shape, connectors: list[str], kv_names: list[str], lengths: list[int], reps: int,
            progress=None) -> dict:
    """{connector: {kv: {"points": [[tokens, seconds]], "fixed_s", "per_token_s", "bytes_per_token"}}}."""
    import torch

    from ridgeline.disagg.payload import spec_key
    from ridgeline.layers.kv_cache import allocate_kv

    max_blocks = -(-max(lengths) // shape.block_size)
    pools = {}
    for kv in kv_names:
        layers = allocate_kv(shape.spec(kv), max_blocks + 1, torch.device("cpu"))
        for r in _regions(layers):
            r.copy_(torch.randint(0, 256, r.shape, dtype=torch.uint8))
        pools[kv] = layers
    links = {c: Link(c, shape, kv_names, max_blocks) for c in connectors}
    times: dict[tuple, list[float]] = {}
    try:
        for rep in range(reps + 1):  # rep 0 warms up (page faults, connections) and is not kept
            for c, link in links.items():
                for kv in kv_names:
                    for n in lengths:
                        blocks = list(range(1, -(-n // shape.block_size) + 1))
                        s = link.transfer(pools[kv], blocks, spec_key(shape.spec(kv)), kv, n)
                        if rep:
                            times.setdefault((c, kv, n), []).append(s)
            if progress is not None:
                progress(rep, reps)
    finally:
        for link in links.values():
            link.close()
    out: dict = {}
    for c in connectors:
        for kv in kv_names:
            # best wall time of the reps (a busy machine adds waits, never removes work) and the median CPU time
            pts = [(n, min(w for w, _ in times[(c, kv, n)])) for n in lengths]
            cpu = [(n, statistics.median(u for _, u in times[(c, kv, n)])) for n in lengths]
            fixed, per = fit_line(pts)
            cpu_fixed, cpu_per = fit_line(cpu)
            out.setdefault(c, {})[kv] = {"points": [[n, s] for n, s in pts], "fixed_s": fixed, "per_token_s": per,
                                         "cpu_points": [[n, s] for n, s in cpu], "cpu_fixed_s": cpu_fixed,
                                         "cpu_per_token_s": cpu_per, "bytes_per_token": shape.spec(kv).bytes_per_token}
    return out
