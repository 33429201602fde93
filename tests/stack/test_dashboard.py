"""The "Sandbox lifecycle" dashboard: valid Grafana JSON, and every query names a real metric.

Substrate's names are the underscore-escaped forms of the OTel instruments in reference §6.2
(our Prometheus scrapes with the legacy validation scheme, see objects.prometheus_config). The
provider's names are read from the provider's own Prometheus registry, so renaming a provider
metric without updating the dashboard fails here.
"""

from __future__ import annotations

import json
import re

import pytest
from stack_harness import stack_config

from gym_substrate.stack import objects

SUBSTRATE_METRICS = {
    f"{base}{suffix}"
    for base in (
        "rpc_server_call_duration_seconds",
        "atenet_router_route_duration_seconds",
        "atelet_snapshot_size_bytes",
    )
    for suffix in ("_bucket", "_sum", "_count")
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
    from gym_substrate._metrics import Metrics

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
        "pool_replicas"
    }


def _dashboard() -> dict[str, object]:
    return objects.dashboard(stack_config("kind-gvisor"))


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
        "Actors by status",
        "Resume latency",
        "Suspend latency",
        "Router latency by outcome",
        "Snapshot sizes",
        "Worker occupancy",
        "Provider exec latency",
    ):
        assert any(t.startswith(needed) for t in titles), needed


def test_every_query_names_an_exported_metric() -> None:
    known = SUBSTRATE_METRICS | _provider_metrics()
    used: set[str] = set()
    for panel in _dashboard()["panels"]:  # type: ignore[index]
        for target in panel["targets"]:
            names = _metric_names(target["expr"])
            assert names, target["expr"]
            assert names <= known, (panel["title"], names - known)
            used |= names
    # Both sides are really on the dashboard.
    assert used & SUBSTRATE_METRICS
    assert used & _provider_metrics()


def test_metric_name_check_catches_a_typo() -> None:
    assert _metric_names('sum(rate(rpc_server_call_duration_second_count{a="b"}[5m]))') == {
        "rpc_server_call_duration_second_count"
    }


@pytest.mark.parametrize("replicas", [1, 8, 64])
def test_occupancy_uses_the_pool_size(replicas: int) -> None:
    import dataclasses

    cfg = stack_config("kind-gvisor")
    cfg = dataclasses.replace(cfg, pool=dataclasses.replace(cfg.pool, replicas=replicas))
    var = objects.dashboard(cfg)["templating"]["list"][0]
    assert (var["name"], var["query"]) == ("pool_replicas", str(replicas))
