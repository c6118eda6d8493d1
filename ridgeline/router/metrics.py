"""/metrics of the router: every replica's metrics summed sample by sample (same name and labels),
then the router's own counters (ridgeline_router_*)."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector


class RouterMetrics:
    def __init__(self, replicas):
        r = self.registry = CollectorRegistry()
        self.requests = Counter("ridgeline_router_requests", "Requests proxied, by replica and HTTP status",
                                ["replica", "status"], registry=r)
        self.retries = Counter("ridgeline_router_retries", "Requests sent again to another replica after one "
                               "failed before answering", registry=r)
        self.replica_failures = Counter("ridgeline_router_replica_failures", "Times a replica was taken out",
                                        ["replica"], registry=r)
        self.stream_failures = Counter("ridgeline_router_stream_failures", "Streams cut by a replica failing "
                                       "after the first chunk (ended with an in-band error)", registry=r)
        self.expected_hits = Counter("ridgeline_router_expected_cached_tokens", "Prompt tokens the KV index "
                                     "expected the chosen replica to hold", registry=r)
        self.kv_resyncs = Counter("ridgeline_router_kv_resyncs", "KV event streams resynced from a snapshot "
                                  "(start, a gap in seq, a restarted replica)", ["replica"], registry=r)
        r.register(_ReplicaGauges(replicas))

    def render(self, replica_texts: list[str]) -> bytes:
        merged = generate_latest(_Static(sum_metrics(replica_texts))) if replica_texts else b""
        return merged + generate_latest(self.registry)


def sum_metrics(texts: list[str]) -> list[Metric]:
    families: dict[str, Metric] = {}
    values: dict[str, dict[tuple, float]] = {}
    for text in texts:
        try:
            parsed = list(text_string_to_metric_families(text))
        except ValueError:  # not Prometheus text: that replica is left out of the sum
            continue
        for fam in parsed:
            if fam.name not in families:
                families[fam.name] = Metric(fam.name, fam.documentation, fam.type, fam.unit)
                values[fam.name] = {}
            acc = values[fam.name]
            for s in fam.samples:
                key = (s.name, tuple(sorted(s.labels.items())))
                acc[key] = acc.get(key, 0.0) + s.value
    for name, fam in families.items():
        for (sample, labels), value in values[name].items():
            fam.add_sample(sample, dict(labels), value)
    return list(families.values())


class _Static(Collector):
    def __init__(self, metrics: list[Metric]):
        self.metrics = metrics

    def collect(self):
        return self.metrics


class _ReplicaGauges(Collector):
    def __init__(self, replicas):
        self.replicas = replicas

    def collect(self):
        up = GaugeMetricFamily("ridgeline_router_replica_up", "1 if the replica is in rotation", labels=["replica"])
        load = GaugeMetricFamily("ridgeline_router_replica_waiting_tokens", "Prompt tokens sent to the replica "
                                 "without a first token yet (less expected cache hits)", labels=["replica"])
        running = GaugeMetricFamily("ridgeline_router_replica_running", "Requests streaming from the replica",
                                    labels=["replica"])
        for r in self.replicas:
            up.add_metric([r.url], 1 if r.up else 0)
            load.add_metric([r.url], r.waiting_tokens)
            running.add_metric([r.url], r.running)
        yield from (up, load, running)
