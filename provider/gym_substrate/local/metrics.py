"""Prometheus metrics of the local backend, named as Substrate's after Prometheus export.

Substrate exports OTel instruments (docs/metrics/registry/metrics.yaml@09c2ac9c:
`rpc.server.call.duration`, `ate.actor.lifecycle.operation.duration`, `ate.actor.crashes`,
`atenet.router.route.duration`, `atelet.snapshot.size`); a Prometheus scrape shows them with
underscores and unit suffixes (`ate_actor_lifecycle_operation_duration_seconds{
ate_actor_operation_name=...}`). Using those names and labels lets one Grafana dashboard serve
a cluster and this backend. What Substrate has no metric for (actors by state, worker slots)
gets a `gym_substrate_local_` prefix. Each backend has its own registry, so several backends in
one process (tests) never clash.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

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
            "gym_substrate_local_actors", "Actors by state.", labels=["state"]
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
            "ate_actor_lifecycle_operation_duration_seconds",
            "Resume, pause and suspend durations (Substrate: ate.actor.lifecycle.operation."
            "duration); a resume of a RUNNING actor is not one.",
            [
                "ate_actor_operation_name",
                "ate_template_atespace",
                "ate_template_name",
                "ate_snapshot_kind",
                "error_type",
            ],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.crashes = Counter(
            "ate_actor_crashes",
            "Actors moved into CRASHED (Substrate: ate.actor.crashes).",
            ["ate_actor_operation_name", "ate_template_atespace", "ate_template_name"],
            registry=self.registry,
        )
        self.orphaned_transitions = Counter(
            "gym_substrate_local_orphaned_transitions",
            "Actors found in a transitional state with no operation behind it and repaired "
            "(CRASHED with the reason) by the watchdog; ours, not Substrate's.",
            ["state"],
            registry=self.registry,
        )
        # called with (operation, seconds) for each finished one: the experiments' operation log
        self.operation_listeners: list[Callable[[str, float], None]] = []

    def lifecycle(
        self, operation: str, template: Any, kind: str, seconds: float, error: str = ""
    ) -> None:
        """One resume, pause or suspend of an actor of ``template`` (a TemplateRecord)."""
        self.operation_duration.labels(
            operation, template.meta.atespace, template.meta.name, kind, error
        ).observe(seconds)
        if not error:
            for listener in self.operation_listeners:
                listener(operation, seconds)

    def watch_state(
        self,
        actors: Callable[[], Mapping[str, int]],
        workers: Callable[[], tuple[int, int]],
    ) -> None:
        self.registry.register(_StateCollector(actors, workers))

    def render(self) -> bytes:
        return generate_latest(self.registry)
