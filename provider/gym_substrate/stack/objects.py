"""What the stack creates, as plain data built from the validated config.

Kubernetes objects (the pool's namespace, the WorkerPool, the microVM SandboxConfig, the NodePort
Services) come from `manifests/` where a static shape exists, so the YAML a GitOps user reads is
the YAML Pulumi applies; the WorkerPool and SandboxConfig are checked against the schemas in
`manifests/crds/`, written from upstream's `pkg/api/v1alpha1` types. ActorTemplates are not
Kubernetes objects any more: `actor_template` builds the ateapi `ActorTemplate` message in the
proto's JSON mapping, which the stack's `ActorTemplate` resource sends with CreateActorTemplate
(`stack/templates.py`) and `gym-substrate render` writes out. `install_document` is the
release installer's `SubstrateInstall` document. Values that exist only after `pulumi up`
(image digests, the worker image) are parameters. Prometheus and Grafana are in `observability`.
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
from gym_substrate.stack.config_base import quantity_value

__all__ = [
    "CA_BUNDLE",
    "INSTALL_API_VERSION",
    "PART_OF",
    "actor_template",
    "install_document",
    "local_registry_hosting",
    "manifests_dir",
    "nodeport_services",
    "pool_namespace",
    "provider_config",
    "sandbox_config",
    "template_name",
    "template_ref",
    "to_yaml",
    "worker_pool",
]

Obj = dict[str, Any]
PART_OF = {"app.kubernetes.io/part-of": "gym-substrate"}
CA_BUNDLE = "servicedns.podcert.ate.dev:identity:primary-bundle"
API_SERVER_NAME = "api.ate-system.svc"
# The installer's document (docs/operator-install.md@0b343ddc, "The document").
INSTALL_API_VERSION = "install.ate.dev/v1alpha1"
# `deploy ate-system` refuses to run without a credential provider choice
# (cmd/ate-setup/commands.md@02891806); the bundled Kubernetes Secrets provider is the default
# the upstream docs show for a self-contained install.
CREDENTIAL_PROVIDER = '{"name":"k8s.io"}'

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


def worker_pool(cfg: StackConfig, worker_image: str) -> Obj:
    """The WorkerPool: `replicas` workers of `pool.cpu` x `pool.memory` each, every one holding
    up to `pool.perWorker` sandboxes of the configured sandbox class."""
    (pool,) = _manifest("workerpool.yaml")
    pool["metadata"]["name"] = cfg.pool.name
    pool["metadata"]["namespace"] = cfg.pool.namespace
    pool["metadata"]["labels"]["workload"] = cfg.pool.workload
    spec = pool["spec"]
    spec["replicas"] = cfg.pool.replicas
    spec["workerImage"] = worker_image
    spec["sandboxClasses"] = [
        {"name": cfg.sandbox_class, "configRef": {"name": cfg.sandbox_config_name}}
    ]
    resources = spec["template"]["resources"]
    resources["limits"] = {"cpu": cfg.pool.cpu, "memory": cfg.pool.memory}
    # CPU can be squeezed: request a quarter of the limit (at least one sandbox's share, at most
    # the limit) so the pool places on a small node; memory cannot: request the limit.
    share = quantity_value(cfg.pool.sandbox_cpu)
    limit = quantity_value(cfg.pool.cpu)
    request_m = int(min(limit, max(limit / 4, share)) * 1000)
    resources["requests"] = {"cpu": f"{request_m}m", "memory": cfg.pool.memory}
    return pool


def sandbox_config(cfg: StackConfig, asset_sha256: Mapping[str, str] | None = None) -> Obj:
    """The microVM SandboxConfig (kata assets staged in the bucket, pinned to their checksums).
    gVisor stacks create none: the release's installer applies `gvisor-default`."""
    if cfg.runtime != "microvm":
        raise ValueError("a kind or host stack creates a SandboxConfig for runtime microvm only")
    sums = dict(asset_sha256 or {})
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
        "metadata": {"name": cfg.sandbox_config_name, "labels": dict(PART_OF)},
        "spec": {
            "sandboxClass": "microvm",
            "default": True,
            "pauseImage": cfg.pool.pause_image,
            "assets": {arch: copy.deepcopy(assets) for arch in arches},
        },
    }


# ---------------------------------------------------------------------------------------------
# ActorTemplates: ateapi messages (proto JSON), one per workload


def _template_body(cfg: StackConfig, workload: WorkloadConfig, image: str, agent: str) -> Obj:
    a = cfg.agent
    env = dict(cfg.templates.env)
    env.update(dict(workload.env))
    container: Obj = {
        "name": "sandbox",
        "image": image,
        "command": [a.binary_path],
        "args": list(a.args),
        "env": [{"name": k, "value": v} for k, v in sorted(env.items())],
        "wakeupProbe": {"httpGet": {"path": "/readyz", "port": a.port}, "timeoutSeconds": 30},
        "volumeMounts": [{"name": "sandbox-agent", "mountPath": a.mount_path}],
    }
    body: Obj = {
        "workerSelector": {"matchLabels": {"workload": cfg.pool.workload}},
        "containers": [container],
        # The agent rides in read-only on its own digest-pinned image; the workload is untouched.
        "volumes": [{"name": "sandbox-agent", "image": {"reference": agent}}],
        "snapshotConfig": {"storageLocation": ""},
        "sandboxConfig": {
            "sandboxClass": f"SANDBOX_CLASS_{cfg.sandbox_class.upper()}",
            "configName": cfg.sandbox_config_name,
        },
    }
    if cfg.templates.resources:
        # One worker share: the scheduler fits perWorker of these into a worker's limits.
        body["resources"] = {
            "limits": [
                {"name": "cpu", "quantity": cfg.pool.sandbox_cpu},
                {"name": "memory", "quantity": cfg.pool.sandbox_memory},
            ]
        }
    return body


def template_name(workload: str, body: Mapping[str, Any]) -> str:
    """Templates are immutable: the name carries a hash of the content, so any change is a new
    template (created before the old one is deleted) and never an update."""
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:10]
    return f"{workload}-{digest}"


def actor_template(
    cfg: StackConfig, workload: WorkloadConfig, *, image: str, agent_image: str
) -> Obj:
    """The ActorTemplate message for one workload, in the proto's JSON mapping.

    `image` is the workload image by digest and `agent_image` the sandbox agent's, mounted on an
    image volume at /opt/sandbox-agent; the agent is the command, probed on /readyz.
    """
    body = _template_body(cfg, workload, image, agent_image)
    name = template_name(workload.name, body)
    atespace = cfg.templates.atespace
    body["snapshotConfig"]["storageLocation"] = (
        f"{cfg.templates.storage_location}{atespace}/{name}/"
    )
    return {"metadata": {"atespace": atespace, "name": name}, **body}


def template_ref(template: Mapping[str, Any]) -> str:
    """`atespace/name`, how the provider's config names a template."""
    meta = template["metadata"]
    return f"{meta['atespace']}/{meta['name']}"


# ---------------------------------------------------------------------------------------------
# The release installer's document


def install_document(cfg: StackConfig) -> Obj:
    """The `SubstrateInstall` document `ate-setup deploy ate-system --config` reads.

    Keys and their meaning: docs/operator-install.md@0b343ddc (settings table). A release
    install names the release's images (`images.repo`, `images.tag`), which ate-setup pins to
    digests before it applies anything; a `substrate.source` install builds them with ko into
    the kind registry instead. The bundled PostgreSQL is the default when no external database
    is set (cmd/ate-setup/internal/steps/postgres.go, planPostgres), which is what kind and host
    stacks want. The kubeconfig comes from the KUBECONFIG the step exports.
    """
    doc: Obj = {
        "apiVersion": INSTALL_API_VERSION,
        "kind": "SubstrateInstall",
        "namespace": "ate-system",
        "context": f"kind-{cfg.cluster.name}",
        "kindCluster": {"enabled": True, "name": cfg.cluster.name},
        "atenet": {
            "dataplane": "envoy",
            "egress": {"credentialProvider": CREDENTIAL_PROVIDER},
        },
        "rolloutTimeout": "5m",
    }
    if cfg.substrate.prebuilt:
        doc["images"] = {"repo": cfg.substrate.images, "tag": cfg.substrate.version}
    else:
        doc["ko"] = {"dockerRepo": f"localhost:{cfg.cluster.registry_port}"}
    return doc


# ---------------------------------------------------------------------------------------------
# Access


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
    """The NeMo Gym `sandbox:` block for the `substrate` provider (docs/provider.md).

    `templates` maps each workload image to its template as `atespace/name`; the first
    workload's is the default.
    """
    connection: Obj = {
        "api": api,
        "router": router,
        "atespace": cfg.access.atespace,
        "tls": {"ca_pem": ca_pem, "server_name": API_SERVER_NAME},
    }
    if cfg.substrate.auth_mode == "jwt":
        # kind: a file on this machine, refreshed by `pulumi up`; host and existing: an
        # environment variable the operator exports (`clientToken`, or `kubectl create token`).
        connection["token"] = {"file": token_file} if token_file else {"env": token_env}
    first = cfg.workloads[0].image
    return {
        "sandbox": {
            "default_metadata": {"sandbox-api": "substrate"},
            "substrate": {
                "connection": connection,
                "create": {"template": templates[first], "image_templates": dict(templates)},
            },
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
