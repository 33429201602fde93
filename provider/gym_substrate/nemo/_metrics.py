"""Provider-side Prometheus metrics in a private registry, served only when a port is configured.

A private `CollectorRegistry` keeps our series out of whatever the trainer already exports to the
default registry, and recording is a few dictionary operations, cheap enough for every exec.
"""

from __future__ import annotations

import logging
import threading

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from gym_substrate.nemo.errors import ConfigError

__all__ = ["METRICS", "Metrics", "serve_metrics"]

log = logging.getLogger("gym_substrate.metrics")

_LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    180,
    600,
)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.creates = Counter("gym_substrate_creates", "Sandboxes created", registry=r)
        self.execs = Counter("gym_substrate_execs", "Commands run", registry=r)
        self.exec_latency = Histogram(
            "gym_substrate_exec_seconds", "Exec wall time", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.create_latency = Histogram(
            "gym_substrate_create_seconds", "Create to ready", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.resume_latency = Histogram(
            "gym_substrate_resume_seconds",
            "ResumeActor to agent ready",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.failures = Counter("gym_substrate_failures", "Failures by kind", ["kind"], registry=r)
        self.running = Gauge(
            "gym_substrate_running", "Sandboxes running (this process)", registry=r
        )
        self.parked = Gauge(
            "gym_substrate_parked", "Sandboxes parked by pause or idle policy", registry=r
        )
        # RESOURCE_EXHAUSTED is "no free capacity yet": each answer waited out, by call, and
        # how long each wait took (success or give-up), so a too-small pool shows up here.
        self.capacity_waits = Counter(
            "gym_substrate_capacity_waits",
            "RESOURCE_EXHAUSTED answers (no free capacity) waited out, by call",
            ["call"],
            registry=r,
        )
        self.capacity_wait_seconds = Histogram(
            "gym_substrate_capacity_wait_seconds",
            "Time from the first RESOURCE_EXHAUSTED to capacity or giving up",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.crashes = Counter(
            "gym_substrate_crashes",
            "Sandboxes found CRASHED, by what lifecycle.on_crash did (fail or revert)",
            ["action"],
            registry=r,
        )


METRICS = Metrics()

_served: dict[tuple[str, int], int] = {}
_serve_lock = threading.Lock()


def serve_metrics(host: str, port: int) -> int:
    """Start the /metrics HTTP server once per (host, port); returns the bound port."""
    with _serve_lock:
        if (host, port) in _served:
            return _served[(host, port)]
        try:
            server, _thread = start_http_server(port, addr=host, registry=METRICS.registry)
        except OSError as exc:  # e.g. the port is taken by another process
            raise ConfigError(
                f"metrics.port: cannot serve metrics on {host}:{port}: {exc.strerror or exc}; "
                "pick a free port (or 0 for any)"
            ) from exc
        bound = int(server.server_port)
        _served[(host, port)] = bound
        log.info("serving provider metrics on http://%s:%d/metrics", host, bound)
        return bound
