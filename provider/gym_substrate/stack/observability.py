"""Prometheus and Grafana with the "Sandbox lifecycle" dashboard, as plain Kubernetes objects.

The dashboard's JSON lives in `manifests/dashboards/sandbox-lifecycle.json` (the single source
for `pulumi up` and `gym-substrate render`); `dashboard` only fills in its constants. Its
queries use the names Substrate exports after Prometheus' escaping (dots become underscores, a
unit suffix, `_total` on counters), from upstream's metric registry
(docs/metrics/registry/metrics.yaml@09c2ac9c), and the NeMo Gym provider's own metrics
(`gym_substrate.nemo._metrics`). tests/stack/test_dashboard_live.py evaluates every panel against a
real Prometheus scraping a local backend and a provider.
"""

from __future__ import annotations

import json
from typing import Any

import yaml

from gym_substrate.stack.config import StackConfig
from gym_substrate.stack.objects import PART_OF, manifests_dir

__all__ = ["dashboard", "observability_objects", "prometheus_config"]

Obj = dict[str, Any]


def dashboard(cfg: StackConfig) -> Obj:
    doc: Obj = json.loads((manifests_dir() / "dashboards" / "sandbox-lifecycle.json").read_text())
    for var in doc["templating"]["list"]:
        if var["name"] == "pool_sandboxes":
            var["query"] = str(max(cfg.pool.replicas * cfg.pool.per_worker, 1))
    return doc


def prometheus_config(cfg: StackConfig) -> str:
    """Scrape Substrate's annotated pods (ateapi, atelet, atenet-router on :9090) and the provider.

    `metric_name_validation_scheme: legacy` makes Prometheus ask for underscore-escaped names,
    so the dashboard's queries (`rpc_server_call_duration_seconds_bucket{rpc_method=...}`) do not
    depend on how the OTel exporter negotiates UTF-8 names.
    """
    relabel = [
        {
            "source_labels": ["__meta_kubernetes_pod_annotation_prometheus_io_scrape"],
            "action": "keep",
            "regex": "true",
        },
        {
            "source_labels": ["__address__", "__meta_kubernetes_pod_annotation_prometheus_io_port"],
            "action": "replace",
            "regex": r"([^:]+)(?::\d+)?;(\d+)",
            "replacement": "$1:$2",
            "target_label": "__address__",
        },
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"source_labels": ["__meta_kubernetes_pod_node_name"], "target_label": "node"},
        {"action": "labelmap", "regex": "__meta_kubernetes_pod_label_(.+)"},
    ]
    scrape: list[Obj] = [
        {
            "job_name": "substrate",
            "metric_name_validation_scheme": "legacy",
            "kubernetes_sd_configs": [{"role": "pod", "namespaces": {"names": ["ate-system"]}}],
            "relabel_configs": relabel,
        }
    ]
    if cfg.observability.provider_targets:
        scrape.append(
            {
                "job_name": "gym-substrate-provider",
                "metric_name_validation_scheme": "legacy",
                "static_configs": [{"targets": list(cfg.observability.provider_targets)}],
            }
        )
    doc = {
        "global": {"scrape_interval": "15s", "evaluation_interval": "15s"},
        "scrape_configs": scrape,
    }
    return yaml.safe_dump(doc, sort_keys=False)


def observability_objects(cfg: StackConfig) -> list[Obj]:
    """Prometheus (RBAC for pod discovery) and Grafana with the provisioned dashboard."""
    ns = cfg.observability.namespace
    labels = dict(PART_OF)

    def meta(name: str, namespaced: bool = True) -> Obj:
        m: Obj = {"name": name, "labels": dict(labels)}
        if namespaced:
            m["namespace"] = ns
        return m

    def deployment(
        name: str,
        image: str,
        port: int,
        args: list[str],
        mounts: list[Obj],
        volumes: list[Obj],
        sa: str | None = None,
        probe: str = "/",
    ) -> Obj:
        pod: Obj = {
            "containers": [
                {
                    "name": name,
                    "image": image,
                    "args": args,
                    "ports": [{"name": "http", "containerPort": port}],
                    "volumeMounts": mounts,
                    "readinessProbe": {"httpGet": {"path": probe, "port": port}},
                    "resources": {
                        "requests": {"cpu": "100m", "memory": "128Mi"},
                        "limits": {"memory": "1Gi"},
                    },
                }
            ],
            "volumes": volumes,
        }
        if sa:
            pod["serviceAccountName"] = sa
        return {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": meta(name),
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": name}},
                "template": {"metadata": {"labels": {"app": name, **labels}}, "spec": pod},
            },
        }

    def service(name: str, port: int, node_port: int) -> Obj:
        return {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": meta(name),
            "spec": {
                "type": "NodePort",
                "selector": {"app": name},
                "ports": [
                    {"name": "http", "port": port, "targetPort": port, "nodePort": node_port}
                ],
            },
        }

    datasources = yaml.safe_dump(
        {
            "apiVersion": 1,
            "datasources": [
                {
                    "name": "Prometheus",
                    "type": "prometheus",
                    "uid": "prometheus",
                    "access": "proxy",
                    "url": f"http://prometheus.{ns}.svc:9090",
                    "isDefault": True,
                }
            ],
        }
    )
    providers = yaml.safe_dump(
        {
            "apiVersion": 1,
            "providers": [
                {
                    "name": "gym-substrate",
                    "folder": "gym-substrate",
                    "type": "file",
                    "disableDeletion": True,
                    "options": {"path": "/var/lib/grafana/dashboards"},
                }
            ],
        }
    )
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": meta(ns, namespaced=False)},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta("prometheus")},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": meta("gym-substrate-prometheus", namespaced=False),
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["pods", "endpoints", "services"],
                    "verbs": ["get", "list", "watch"],
                }
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": meta("gym-substrate-prometheus", namespaced=False),
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "gym-substrate-prometheus",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "prometheus", "namespace": ns}],
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": meta("prometheus-config"),
            "data": {"prometheus.yml": prometheus_config(cfg)},
        },
        deployment(
            "prometheus",
            cfg.observability.prometheus_image,
            9090,
            [
                "--config.file=/etc/prometheus/prometheus.yml",
                "--storage.tsdb.path=/prometheus",
                "--storage.tsdb.retention.time=7d",
            ],
            [
                {"name": "config", "mountPath": "/etc/prometheus"},
                {"name": "data", "mountPath": "/prometheus"},
            ],
            [
                {"name": "config", "configMap": {"name": "prometheus-config"}},
                {"name": "data", "emptyDir": {}},
            ],
            sa="prometheus",
            probe="/-/ready",
        ),
        service("prometheus", 9090, cfg.access.prometheus_node_port),
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": meta("grafana-provisioning"),
            "data": {"datasources.yaml": datasources, "dashboards.yaml": providers},
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": meta("grafana-dashboards"),
            "data": {"sandbox-lifecycle.json": json.dumps(dashboard(cfg), indent=2)},
        },
        deployment(
            "grafana",
            cfg.observability.grafana_image,
            3000,
            [],
            [
                {"name": "datasources", "mountPath": "/etc/grafana/provisioning/datasources"},
                {
                    "name": "dashboard-providers",
                    "mountPath": "/etc/grafana/provisioning/dashboards",
                },
                {"name": "dashboards", "mountPath": "/var/lib/grafana/dashboards"},
            ],
            [
                {
                    "name": "datasources",
                    "configMap": {
                        "name": "grafana-provisioning",
                        "items": [{"key": "datasources.yaml", "path": "datasources.yaml"}],
                    },
                },
                {
                    "name": "dashboard-providers",
                    "configMap": {
                        "name": "grafana-provisioning",
                        "items": [{"key": "dashboards.yaml", "path": "dashboards.yaml"}],
                    },
                },
                {"name": "dashboards", "configMap": {"name": "grafana-dashboards"}},
            ],
            probe="/api/health",
        ),
        service("grafana", 3000, cfg.access.grafana_node_port),
    ]
