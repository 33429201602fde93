"""Prometheus metrics of the local backend, named as Substrate's after Prometheus export.

Substrate exports OTel instruments (`rpc.server.call.duration`, `atenet.router.route.duration`,
`atelet.snapshot.size`); a legacy-escaping Prometheus scrape shows them as
`rpc_server_call_duration_seconds{rpc_method=...}` and so on (reference §6.2). Using those exact
names and labels lets one Grafana dashboard serve a cluster and this backend. What Substrate
lacks (actor and worker gauges, lifecycle durations) gets a `gym_substrate_local_` prefix.
Each backend has its own registry, so several backends in one process (tests) never clash.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["CONTENT_TYPE", "Metrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip
_SNAPSHOT_BUCKETS = (1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10)
# atenet's own boundaries (docs/metrics/registry/metrics.yaml@09c2ac9c)
_ROUTE_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.25, 0.5, 1.0, 2.5, 5.0,
    10.0, 15.0, 30.0,
)  # fmt: skip
_PARKING_WAIT_BUCKETS = (
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 30.0, 45.0, 60.0,
)  # fmt: skip


class _StateCollector(Collector):
    def __init__(
        self,
        actors: Callable[[], Mapping[str, int]],
        workers: Callable[[], tuple[int, int]],
    ) -> None:
        self._actors = actors
        self._workers = workers

    def collect(self) -> Iterable[Metric]:
        actors = GaugeMetricFamily(
            "gym_substrate_local_actors", "Actors by status.", labels=["status"]
        )
        for status, count in sorted(self._actors().items()):
            actors.add_metric([status], count)
        yield actors
        busy, free = self._workers()
        workers = GaugeMetricFamily(
            "gym_substrate_local_workers", "Worker slots by state.", labels=["state"]
        )
        workers.add_metric(["busy"], busy)
        workers.add_metric(["free"], free)
        yield workers


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.rpc_duration = Histogram(
            "rpc_server_call_duration_seconds",
            "ateapi RPC handling time (Substrate: rpc.server.call.duration).",
            ["rpc_method", "rpc_response_status_code"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.route_duration = Histogram(
            "atenet_router_route_duration_seconds",
            "Router time from a request to its worker endpoint (Substrate: "
            "atenet.router.route.duration).",
            [
                "ate_template_atespace",
                "ate_template_name",
                "ate_router_outcome",
                "ate_router_resume",
            ],
            buckets=_ROUTE_BUCKETS,
            registry=self.registry,
        )
        self.parking_active = Gauge(
            "atenet_router_parking_active",
            "Requests parked in the router now (Substrate: atenet.router.parking.active).",
            registry=self.registry,
        )
        self.parking_wait = Histogram(
            "atenet_router_parking_wait_duration_seconds",
            "Time a request spent parked (Substrate: atenet.router.parking.wait.duration).",
            ["outcome"],
            buckets=_PARKING_WAIT_BUCKETS,
            registry=self.registry,
        )
        self.parking_rejected = Counter(
            "atenet_router_parking_rejected",
            "Requests shed because the parking lot was full (Substrate: "
            "atenet.router.parking.rejected).",
            registry=self.registry,
        )
        self.snapshot_size = Histogram(
            "atelet_snapshot_size_bytes",
            "Checkpoint file sizes (Substrate: atelet.snapshot.size).",
            ["kind", "actor_template_namespace", "actor_template_name"],
            buckets=_SNAPSHOT_BUCKETS,
            registry=self.registry,
        )
        self.operation_duration = Histogram(
            "gym_substrate_local_operation_duration_seconds",
            "Pause, suspend and resume durations inside the control plane.",
            ["operation", "source"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )

    def watch_state(
        self,
        actors: Callable[[], Mapping[str, int]],
        workers: Callable[[], tuple[int, int]],
    ) -> None:
        self.registry.register(_StateCollector(actors, workers))

    def render(self) -> bytes:
        return generate_latest(self.registry)
