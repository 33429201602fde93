"""Kubernetes objects the stack applies, as plain dicts built from the validated config.

Static shapes (WorkerPool, NodePort Services, the Grafana dashboard) live in `manifests/` and are
only filled in here, so the YAML a GitOps user reads is the YAML Pulumi applies. Values that
exist only after `pulumi up` (image digests, the ateom image) are parameters, which lets
`gym-substrate render` produce everything else with placeholders that say what they stand for.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from gym_substrate.stack.config import StackConfig, WorkloadConfig

__all__ = [
    "CA_BUNDLE",
    "PART_OF",
    "actor_template",
    "dashboard",
    "local_registry_hosting",
    "manifests_dir",
    "nodeport_services",
    "observability_objects",
    "pool_namespace",
    "prebuilt_actor_template",
    "provider_config",
    "sandbox_config",
    "template_name",
    "to_yaml",
    "worker_pool",
]

Obj = dict[str, Any]
PART_OF = {"app.kubernetes.io/part-of": "gym-substrate"}
CA_BUNDLE = "servicedns.podcert.ate.dev:identity:primary-bundle"
API_SERVER_NAME = "api.ate-system.svc"

# gVisor runsc release pinned by the Substrate commit this project installs
# (manifests/ate-install/sandboxconfig-gvisor.yaml at 86e138f6).
RUNSC_ASSETS = {
    "amd64": {
        "runsc": {
            "url": "gs://gvisor/releases/release/20260622/x86_64/runsc",
            "sha256": "f18a948bf9c8bbb54eb998549a3a8d719a1c7de2efbe8fdd2ff0ee5fecd06f19",
        }
    },
    "arm64": {
        "runsc": {
            "url": "gs://gvisor/releases/release/20260622/aarch64/runsc",
            "sha256": "62eee121f8c188e347c428acc96f111568ede3be37b906046b6f28bbe2cc40c0",
        }
    },
}
MICROVM_ASSET_FILES = {
    "cloud-hypervisor": "cloud-hypervisor",
    "virtiofsd": "virtiofsd",
    "kata-kernel": "vmlinux",
    "kata-image": "rootfs.img",
    "kata-config": "configuration-clh.toml",
}


def manifests_dir() -> Path:
    """`manifests/` from an installed wheel (force-included) or from the repo checkout."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "manifests", here.parents[2] / "manifests"):
        if (candidate / "workerpool.yaml").is_file():
            return candidate
    raise FileNotFoundError(
        f"manifests/ not found next to {here} or at the repo root; reinstall gym-substrate"
    )


@cache
def _load(name: str) -> tuple[Obj, ...]:
    docs = yaml.safe_load_all((manifests_dir() / name).read_text())
    return tuple(d for d in docs if d)


def _manifest(name: str) -> list[Obj]:
    return [copy.deepcopy(d) for d in _load(name)]


def pool_namespace(cfg: StackConfig) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": cfg.pool.namespace, "labels": dict(PART_OF)},
    }


def worker_pool(cfg: StackConfig, ateom_image: str) -> Obj:
    (pool,) = _manifest("workerpool.yaml")
    pool["metadata"]["name"] = cfg.pool.name
    pool["metadata"]["namespace"] = cfg.pool.namespace
    pool["metadata"]["labels"]["workload"] = cfg.pool.workload
    spec = pool["spec"]
    spec["replicas"] = cfg.pool.replicas
    spec["ateomImage"] = ateom_image
    spec["sandboxClass"] = cfg.sandbox_class
    spec["sandboxConfigName"] = cfg.sandbox_config_name
    spec["template"]["resources"]["limits"] = {"cpu": cfg.pool.cpu, "memory": cfg.pool.memory}
    requests = spec["template"]["resources"]["requests"]
    # Requests never exceed limits, or the pod would be rejected.
    if _quantity_value(requests["cpu"]) > _quantity_value(cfg.pool.cpu):
        requests["cpu"] = cfg.pool.cpu
    if _quantity_value(requests["memory"]) > _quantity_value(cfg.pool.memory):
        requests["memory"] = cfg.pool.memory
    return pool


_SUFFIX = {
    "m": 1e-3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "Ki": 2.0**10,
    "Mi": 2.0**20,
    "Gi": 2.0**30,
    "Ti": 2.0**40,
}


def _quantity_value(q: str) -> float:
    for suffix in sorted(_SUFFIX, key=len, reverse=True):
        if q.endswith(suffix):
            return float(q[: -len(suffix)]) * _SUFFIX[suffix]
    return float(q)


def sandbox_config(
    cfg: StackConfig,
    virtiofsd_sha256: str = "0" * 64,
    asset_sha256: Mapping[str, str] | None = None,
) -> Obj:
    """`gvisor-default` (the pinned runsc) or `microvm` (kata assets staged in the bucket)."""
    if cfg.runtime == "gvisor":
        return {
            "apiVersion": "ate.dev/v1alpha1",
            "kind": "SandboxConfig",
            "metadata": {"name": "gvisor-default", "labels": dict(PART_OF)},
            "spec": {
                "sandboxClass": "gvisor",
                "default": True,
                "assets": copy.deepcopy(RUNSC_ASSETS),
            },
        }
    sums = dict(asset_sha256 or {})
    sums.setdefault("virtiofsd", virtiofsd_sha256)
    # The assets are assembled for the node's architecture only; list just that one, since the
    # admission policy demands every asset for every listed arch.
    arches = [sums.pop("arch")] if "arch" in sums else ["amd64", "arm64"]
    assets = {
        name: {
            "url": f"gs://{cfg.substrate.bucket}/kata-assets/{fname}",
            "sha256": sums.get(name, "0" * 64),
        }
        for name, fname in MICROVM_ASSET_FILES.items()
    }
    return {
        "apiVersion": "ate.dev/v1alpha1",
        "kind": "SandboxConfig",
        "metadata": {"name": "microvm", "labels": dict(PART_OF)},
        "spec": {
            "sandboxClass": "microvm",
            "default": True,
            "assets": {arch: copy.deepcopy(assets) for arch in arches},
        },
    }


def _template_spec(
    cfg: StackConfig, workload: WorkloadConfig, *, image: str, agent_image: str | None
) -> Obj:
    agent = cfg.agent
    env = dict(cfg.templates.env)
    env.update(dict(workload.env))
    container: Obj = {
        "name": "sandbox",
        "image": image,
        "command": [agent.binary_path, *agent.args],
        "env": [{"name": k, "value": v} for k, v in sorted(env.items())],
        "readyz": {"httpGet": {"path": "/readyz", "port": agent.port}},
    }
    spec: Obj = {
        "pauseImage": cfg.templates.pause_image,
        "sandboxClass": cfg.sandbox_class,
        "workerSelector": {"matchLabels": {"workload": cfg.pool.workload}},
        "containers": [container],
        "snapshotsConfig": {"location": ""},
    }
    if agent.mount == "image-volume":
        # For Substrate versions whose ActorTemplate accepts image volumes (not the pinned one).
        # Kubernetes' image-volume form: the agent image's own /opt/sandbox-agent directory
        # (subPath) mounted at the same place, so the command path is the same in both modes.
        binary_dir = agent.binary_path.rsplit("/", 1)[0]
        container["volumeMounts"] = [
            {"name": "sandbox-agent", "mountPath": binary_dir, "subPath": binary_dir.lstrip("/")}
        ]
        spec["volumes"] = [
            {
                "name": "sandbox-agent",
                "image": {"reference": agent_image, "pullPolicy": "IfNotPresent"},
            }
        ]
    return spec


def template_name(workload: str, spec: Mapping[str, Any]) -> str:
    """Templates are immutable upstream: the name carries a hash of the spec, so any change
    creates a new template instead of failing on update."""
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:10]
    return f"{workload}-{digest}"


def actor_template(
    cfg: StackConfig,
    workload: WorkloadConfig,
    *,
    image: str,
    agent_image: str | None = None,
    await_ready: bool = False,
) -> Obj:
    """The ActorTemplate for one workload.

    `image` is the container image by digest: the derived image (workload + agent) in
    `derived-image` mode, or the workload itself in `image-volume` mode. `await_ready` makes
    the Kubernetes provider itself wait for the Ready condition (the golden snapshot), up to
    `templates.readyTimeoutSeconds`, where no shell step can run the wait.
    """
    spec = _template_spec(cfg, workload, image=image, agent_image=agent_image)
    name = template_name(workload.name, spec)
    spec["snapshotsConfig"]["location"] = (
        f"gs://{cfg.substrate.bucket}/{cfg.pool.namespace}/{name}/"
    )
    metadata: Obj = {
        "name": name,
        "namespace": cfg.pool.namespace,
        "labels": {**PART_OF, "gym-substrate/workload": workload.name},
    }
    if await_ready:
        # Annotations, not spec: they leave the content hash in the name alone.
        metadata["annotations"] = {
            "pulumi.com/waitFor": "condition=Ready",
            "pulumi.com/timeoutSeconds": str(cfg.templates.ready_timeout_s),
        }
    return {
        "apiVersion": "ate.dev/v1alpha1",
        "kind": "ActorTemplate",
        "metadata": metadata,
        "spec": spec,
    }


def prebuilt_actor_template(cfg: StackConfig, workload: WorkloadConfig) -> Obj:
    """Target `existing`: the template from the images the config pins, with the provider
    awaiting Ready."""
    if cfg.agent.mount == "image-volume":
        return actor_template(
            cfg, workload, image=workload.image, agent_image=cfg.agent.image, await_ready=True
        )
    if workload.agent_image is None:
        raise ValueError(f"workload {workload.name!r} has no agentImage (target 'existing')")
    return actor_template(cfg, workload, image=workload.agent_image, await_ready=True)


def nodeport_services(cfg: StackConfig) -> list[Obj]:
    api, router = _manifest("nodeports.yaml")
    api["spec"]["ports"][0]["nodePort"] = cfg.access.api_node_port
    router["spec"]["ports"][0]["nodePort"] = cfg.access.router_node_port
    return [api, router]


def local_registry_hosting(cfg: StackConfig) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "local-registry-hosting", "namespace": "kube-public"},
        "data": {
            "localRegistryHosting.v1": f'host: "localhost:{cfg.cluster.registry_port}"\n'
            'help: "https://kind.sigs.k8s.io/docs/user/local-registry/"\n'
        },
    }


def dashboard(cfg: StackConfig) -> Obj:
    doc: Obj = json.loads((manifests_dir() / "dashboards" / "sandbox-lifecycle.json").read_text())
    for var in doc["templating"]["list"]:
        if var["name"] == "pool_replicas":
            var["query"] = str(max(cfg.pool.replicas, 1))
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


def provider_config(
    cfg: StackConfig,
    *,
    api: str,
    router: str,
    ca_pem: str,
    templates: Mapping[str, str],
    token_file: str | None,
    token_env: str = "SUBSTRATE_TOKEN",
) -> Obj:
    """The NeMo Gym `sandbox:` block for the `substrate` provider (issue 4 §2 keys).

    `templates` maps each configured workload image to its `namespace/name` template; the first
    workload is the default.
    """
    connection: Obj = {
        "api": api,
        "router": router,
        "atespace": cfg.access.atespace,
        "tls": {"ca_pem": ca_pem, "server_name": API_SERVER_NAME},
    }
    if cfg.substrate.auth_mode == "jwt":
        # kind: a file on this machine, refreshed by `pulumi up`; host: the `clientToken`
        # stack output, exported into the environment by the operator.
        connection["token"] = {"file": token_file} if token_file else {"env": token_env}
    first = cfg.workloads[0].image
    return {
        "sandbox": {
            "substrate": {
                "connection": connection,
                "create": {"template": templates[first], "image_templates": dict(templates)},
            }
        }
    }


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings (the CA PEM) as `|` blocks, so the output pastes cleanly."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_BlockDumper.add_representer(str, _str)


def to_yaml(doc: Obj) -> str:
    return yaml.dump(doc, Dumper=_BlockDumper, sort_keys=False)
