"""The "Sandbox lifecycle" dashboard: valid Grafana JSON, and every query names a real metric.

Substrate's names are the Prometheus spelling of the OTel instruments in upstream's metric
registry, docs/metrics/registry/metrics.yaml@09c2ac9c (dots become underscores, the unit adds a
suffix, counters get `_total`): `ate.actor.lifecycle.operation.duration`,
`atenet.router.route.duration` and the parking instruments as upstream's troubleshooting docs
spell them (docs/troubleshooting/capacity-is-full.md@7e5ab969, requests-are-slow.md,
resumes-are-slow.md: ids 71509065905, 70298980695), the others by the same rule. The provider's
names are read from its own registry, and the local backend's from its registry, so renaming a
metric on either side without updating the dashboard fails here. test_dashboard_live.py then
evaluates every query in a real Prometheus.
"""

from __future__ import annotations

import json
import re

import pytest
from stack_harness import stack_config

from gym_substrate.stack import objects, observability

_HISTOGRAMS = (
    "ate_actor_lifecycle_operation_duration_seconds",  # ateapi
    "ate_scheduler_assignment_duration_seconds",  # ateapi
    "ate_actor_restore_duration_seconds",  # atelet
    "ate_actor_checkpoint_duration_seconds",  # atelet
    "atelet_snapshot_size_bytes",  # atelet
    "atenet_router_route_duration_seconds",  # atenet-router
    "atenet_router_parking_wait_duration_seconds",  # atenet-router
    "rpc_server_call_duration_seconds",  # otelgrpc, every server
)
SUBSTRATE_METRICS = {f"{h}{s}" for h in _HISTOGRAMS for s in ("_bucket", "_sum", "_count")} | {
    "ate_actor_crashes_total",  # ateapi
    "ate_workerpool_workers",  # ateapi
    "ate_workerpool_desired_workers",  # atecontroller
    "ate_workerpool_ready_workers",  # atecontroller
    "atenet_router_parking_active",  # atenet-router
    "atenet_router_parking_rejected_total",  # atenet-router
}
PROMQL_WORDS = {
    "histogram_quantile",
    "sum",
    "by",
    "rate",
    "le",
    "increase",
    "avg",
    "max",
    "min",
    "without",
    "on",
    "ignoring",
    "count",
    "irate",
}


def _provider_metrics() -> set[str]:
    from gym_substrate.nemo._metrics import Metrics

    names: set[str] = set()
    for family in Metrics().registry.collect():
        if family.type == "counter":
            names.add(f"{family.name}_total")
        elif family.type == "histogram":
            names |= {f"{family.name}{s}" for s in ("_bucket", "_sum", "_count")}
        else:
            names.add(family.name)
    return names


def _metric_names(expr: str) -> set[str]:
    without_labels = re.sub(r"\{[^}]*\}", "", expr)
    without_ranges = re.sub(r"\[[^\]]*\]", "", without_labels)
    without_by = re.sub(r"by \([^)]*\)", "", without_ranges)
    tokens = set(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", without_by))
    return {t for t in tokens if t not in PROMQL_WORDS and not t.startswith("$")} - {
        "pool_sandboxes"
    }


def _dashboard() -> dict[str, object]:
    return observability.dashboard(stack_config("kind-gvisor"))


def _local_metrics() -> set[str]:
    from gym_substrate.local.metrics import Metrics

    names: set[str] = set()
    for family in Metrics().registry.collect():
        if family.type == "counter":
            names.add(f"{family.name}_total")
        elif family.type == "histogram":
            names |= {f"{family.name}{s}" for s in ("_bucket", "_sum", "_count")}
        else:
            names.add(family.name)
    return names


def test_dashboard_is_grafana_json() -> None:
    raw = (objects.manifests_dir() / "dashboards" / "sandbox-lifecycle.json").read_text()
    doc = json.loads(raw)
    assert doc["title"] == "Sandbox lifecycle"
    assert doc["uid"]
    assert isinstance(doc["schemaVersion"], int)
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))
    for panel in doc["panels"]:
        assert panel["type"] in {"timeseries", "stat", "gauge", "bargauge"}
        assert set(panel["gridPos"]) == {"h", "w", "x", "y"}
        assert panel["datasource"] == {"type": "prometheus", "uid": "prometheus"}
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["expr"].count("(") == target["expr"].count(")"), target["expr"]


def test_dashboard_has_the_lifecycle_panels() -> None:
    titles = {p["title"] for p in _dashboard()["panels"]}  # type: ignore[index]
    for needed in (
        "Sandboxes by state (provider)",
        "Workers by state",
        "Resume latency",
        "Suspend and pause latency",
        "Crashes",
        "Router latency: activation vs warm",
        "Router outcomes",
        "Parked requests",
        "Snapshot sizes",
        "Sandbox occupancy",
        "Provider exec latency",
    ):
        assert needed in titles, needed


def test_every_query_names_an_exported_metric() -> None:
    known = SUBSTRATE_METRICS | _provider_metrics()
    used: set[str] = set()
    for panel in _dashboard()["panels"]:  # type: ignore[index]
        for target in panel["targets"]:
            names = _metric_names(target["expr"])
            assert names, target["expr"]
            assert names <= known, (panel["title"], names - known)
            used |= names
    # Both sides are really on the dashboard, and no June-era name is left.
    assert used & SUBSTRATE_METRICS
    assert used & _provider_metrics()
    text = json.dumps(_dashboard())
    assert "by (le, outcome) (rate(atenet_router_route" not in text  # June label: outcome
    assert "ate_actor_lifecycle_operation_duration_seconds_bucket" in text


def test_the_local_backend_exports_substrate_names() -> None:
    """The local backend's metrics are Substrate's names (or its own, prefixed): one dashboard
    serves both, and test_dashboard_live.py scrapes the local backend for real."""
    local = _local_metrics()
    ours = {n for n in local if n.startswith("gym_substrate_local_")}
    assert local - ours <= SUBSTRATE_METRICS, (local - ours) - SUBSTRATE_METRICS


def test_metric_name_check_catches_a_typo() -> None:
    assert _metric_names('sum(rate(rpc_server_call_duration_second_count{a="b"}[5m]))') == {
        "rpc_server_call_duration_second_count"
    }


@pytest.mark.parametrize(("sandboxes", "per_worker", "room"), [(1, 4, 4), (8, 4, 8), (9, 4, 12)])
def test_occupancy_uses_the_pool_size(sandboxes: int, per_worker: int, room: int) -> None:
    import dataclasses

    cfg = stack_config("kind-gvisor")
    pool = dataclasses.replace(cfg.pool, sandboxes=sandboxes, per_worker=per_worker)
    cfg = dataclasses.replace(cfg, pool=pool)
    var = observability.dashboard(cfg)["templating"]["list"][0]
    assert (var["name"], var["query"]) == ("pool_sandboxes", str(room))
