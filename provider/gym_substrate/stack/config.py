"""Stack configuration: one frozen, validated object built from `Pulumi.<stack>.yaml`.

Why a separate parser instead of `pulumi.Config.require_*` calls spread over the components:
every mistake is reported before a single resource is registered (at `pulumi preview`), the
message names the exact key (`gym-substrate:pool.sandboxes`) and the fix, and the same parser
serves `gym-substrate render`, which runs without Pulumi. The reading machinery is in
`config_base`, the sections (Substrate release, pool sizing, templates, ...) in
`config_sections`; this module holds the whole `StackConfig` and the file loading.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gym_substrate.stack.config_base import (
    PROJECT,
    ConfigError,
    Section,
    digest_image,
    fail,
    host_key,
    label,
    node_port,
    offline_dir,
    version,
    versioned_image,
    workdir,
)
from gym_substrate.stack.config_sections import (
    PAUSE_IMAGE,
    SUBSTRATE_IMAGES,
    SUBSTRATE_REPO,
    SUBSTRATE_VERSION,
    AgentImageConfig,
    DatabaseConfig,
    ExistingConfig,
    PoolConfig,
    SourceConfig,
    SubstrateConfig,
    TemplatesConfig,
    WorkloadConfig,
    parse_agent,
    parse_existing,
    parse_pool,
    parse_substrate,
    parse_templates,
    parse_workloads,
)

__all__ = [
    "PAUSE_IMAGE",
    "PROJECT",
    "SECRET_KEYS",
    "SUBSTRATE_IMAGES",
    "SUBSTRATE_REPO",
    "SUBSTRATE_VERSION",
    "AccessConfig",
    "AgentImageConfig",
    "ClusterConfig",
    "ConfigError",
    "DatabaseConfig",
    "ExistingConfig",
    "HostConfig",
    "ObservabilityConfig",
    "PoolConfig",
    "SourceConfig",
    "StackConfig",
    "SubstrateConfig",
    "TemplatesConfig",
    "ToolVersions",
    "WorkloadConfig",
    "existing_kubeconfig",
    "load_stack_file",
    "parse_config_values",
    "stack_file",
]

# Keys that hold secrets: never parsed into the plain config object; the program reads them as
# Pulumi secrets and the parser only checks that they are present when the target needs them.
SECRET_KEYS = frozenset({"sshPrivateKey"})


@dataclass(frozen=True)
class ClusterConfig:
    name: str = "substrate"
    registry_port: int = 5001
    node_image: str | None = None
    kvm: bool = False
    workdir: str = "~/.gym-substrate"


@dataclass(frozen=True)
class HostConfig:
    address: str
    user: str
    port: int = 22
    api_port: int = 6443
    sshd_cpu_weight: int = 10000
    # The host's SSH key as in known_hosts ("ssh-ed25519 AAAA..."); None: the key the host shows
    # at the first `up` is recorded in the state and required from then on.
    host_key: str | None = None


@dataclass(frozen=True)
class ToolVersions:
    docker: str = "docker.io"
    kind: str = "v0.32.0"
    kubectl: str = "v1.36.0"
    go: str = "1.26.3"
    ko: str = "v0.18.1"
    # A local folder from `gym-substrate infra tools-bundle`: install-tools installs from its
    # copy on the host and downloads nothing. None: apt and the release downloads.
    offline_dir: str | None = None

    def versions(self) -> dict[str, str]:
        return {"kind": self.kind, "kubectl": self.kubectl, "go": self.go, "ko": self.ko}


@dataclass(frozen=True)
class AccessConfig:
    api_node_port: int = 30443
    router_node_port: int = 30080
    grafana_node_port: int = 30300
    prometheus_node_port: int = 30090
    atespace: str = "gym"


@dataclass(frozen=True)
class ObservabilityConfig:
    enabled: bool = True
    namespace: str = "gym-observability"
    prometheus_image: str = "prom/prometheus:v3.5.3"
    grafana_image: str = "grafana/grafana:11.6.0"
    provider_targets: tuple[str, ...] = ()


@dataclass(frozen=True)
class StackConfig:
    """The whole validated stack. `target` picks kind on this machine, a borrowed host, or a
    cluster that already runs Substrate (`existing`)."""

    target: str
    runtime: str
    cluster: ClusterConfig
    substrate: SubstrateConfig
    pool: PoolConfig
    agent: AgentImageConfig
    workloads: tuple[WorkloadConfig, ...]
    templates: TemplatesConfig
    access: AccessConfig
    observability: ObservabilityConfig
    host: HostConfig | None = None
    tools: ToolVersions = field(default_factory=ToolVersions)
    existing: ExistingConfig | None = None

    @property
    def sandbox_class(self) -> str:
        return self.runtime

    @property
    def sandbox_config_name(self) -> str:
        return self.pool.sandbox_config

    @property
    def worker_package(self) -> str:
        return f"./cmd/ateom-{self.runtime}"

    @classmethod
    def from_mapping(
        cls, raw: Mapping[str, Any], *, secrets: frozenset[str] = frozenset()
    ) -> StackConfig:
        """Validate the project's config keys (without the `gym-substrate:` prefix).

        `secrets` names the secret keys that are set (their values never reach this object).
        """
        top = Section("", raw)
        top.used.update(SECRET_KEYS)
        target = top.choice("target", "kind", ("kind", "host", "existing"))
        runtime = top.choice("runtime", "gvisor", ("gvisor", "microvm"))
        cluster = _cluster(top, target, runtime)
        host, tools = _host(top, target, secrets)
        existing = parse_existing(top, target)
        substrate = parse_substrate(top, target)
        pool = parse_pool(top, target, runtime)
        agent = parse_agent(top, target)
        workloads = parse_workloads(top, target)
        access = parse_access(top)
        templates = parse_templates(top, runtime, substrate.bucket, access.atespace)
        observability = parse_observability(top)
        top.done()
        return cls(
            target=target,
            runtime=runtime,
            cluster=cluster,
            substrate=substrate,
            pool=pool,
            agent=agent,
            workloads=workloads,
            templates=templates,
            access=access,
            observability=observability,
            host=host,
            tools=tools,
            existing=existing,
        )


def _cluster(top: Section, target: str, runtime: str) -> ClusterConfig:
    if target == "existing" and top.get("cluster") is not None:
        raise fail(
            "cluster",
            "is not used with target 'existing' (the cluster already exists)",
            "remove `cluster`; set `existing.kubeconfig` and `existing.context` instead",
        )
    c = Section("cluster", top.get("cluster"))
    node_image = c.opt_string("nodeImage")
    if node_image is not None:
        node_image = digest_image(c, "nodeImage")
    cluster = ClusterConfig(
        name=label(c, "name", "substrate"),
        registry_port=c.integer("registryPort", 5001, 1024, 65535),
        node_image=node_image,
        kvm=c.boolean("kvm", False),
        workdir=workdir(c),
    )
    c.done()
    if runtime == "microvm" and not cluster.kvm and target != "existing":
        raise fail(
            "cluster.kvm",
            "runtime 'microvm' needs /dev/kvm on the node host, but cluster.kvm is false",
            "on a host where `ls -l /dev/kvm` shows the device, set "
            "`gym-substrate:cluster: {kvm: true}`; otherwise use "
            "`gym-substrate:runtime: gvisor`",
        )
    return cluster


def _host(
    top: Section, target: str, secrets: frozenset[str]
) -> tuple[HostConfig | None, ToolVersions]:
    if target != "host":
        if top.get("host") is not None:
            raise fail(
                "host",
                "is only used with target 'host'",
                "remove `host` or set `gym-substrate:target: host`",
            )
        return None, ToolVersions()
    h = Section(
        "host",
        top.get("host", required=True, fix="add `gym-substrate:host: {address: ..., user: ...}`"),
    )
    host = HostConfig(
        address=h.string(
            "address",
            required=True,
            fix="set `host.address` to the borrowed host's IP or DNS name",
        ),
        user=h.string(
            "user", required=True, fix="set `host.user` to an SSH user with passwordless sudo"
        ),
        port=h.integer("port", 22, 1, 65535),
        api_port=h.integer("apiPort", 6443, 1024, 65535),
        sshd_cpu_weight=h.integer("sshdCpuWeight", 10000, 1, 10000),
        host_key=host_key(h),
    )
    h.done()
    if "sshPrivateKey" not in secrets:
        raise fail(
            "sshPrivateKey",
            "is required for target 'host' but missing",
            "run `pulumi config set --secret sshPrivateKey < ~/.ssh/id_ed25519`",
        )
    t = Section("tools", top.get("tools"))
    tools = ToolVersions(
        docker=t.string("docker", "docker.io"),
        kind=version(t, "kind", "v0.32.0"),
        kubectl=version(t, "kubectl", "v1.36.0"),
        go=version(t, "go", "1.26.3"),
        ko=version(t, "ko", "v0.18.1"),
        offline_dir=offline_dir(t),
    )
    t.done()
    return host, tools


def parse_access(top: Section) -> AccessConfig:
    ac = Section("access", top.get("access"))
    access = AccessConfig(
        api_node_port=node_port(ac, "apiNodePort", 30443),
        router_node_port=node_port(ac, "routerNodePort", 30080),
        grafana_node_port=node_port(ac, "grafanaNodePort", 30300),
        prometheus_node_port=node_port(ac, "prometheusNodePort", 30090),
        atespace=label(ac, "atespace", "gym"),
    )
    ac.done()
    ports = [
        access.api_node_port,
        access.router_node_port,
        access.grafana_node_port,
        access.prometheus_node_port,
    ]
    if len(set(ports)) != len(ports):
        raise fail(
            "access",
            f"node ports collide: {ports}",
            "give the API, router, Grafana and Prometheus distinct nodePorts",
        )
    return access


def parse_observability(top: Section) -> ObservabilityConfig:
    o = Section("observability", top.get("observability"))
    targets: Any = o.get("providerTargets", [])
    if not isinstance(targets, list) or not all(
        isinstance(x, str) and re.match(r"^[^\s:/]+:[0-9]{1,5}$", x) for x in targets
    ):
        raise fail(
            "observability.providerTargets",
            f"expected host:port strings, got {targets!r}",
            'list the provider metrics endpoints as `["172.18.0.1:9464"]`',
        )
    observability = ObservabilityConfig(
        enabled=o.boolean("enabled", True),
        namespace=label(o, "namespace", "gym-observability"),
        prometheus_image=versioned_image(o, "prometheusImage", "prom/prometheus:v3.5.3"),
        grafana_image=versioned_image(o, "grafanaImage", "grafana/grafana:11.6.0"),
        provider_targets=tuple(targets),
    )
    o.done()
    return observability


def existing_kubeconfig(cfg: StackConfig) -> tuple[str, str]:
    """Target `existing`: the kubeconfig's expanded path and the context to use, checked now so
    `pulumi preview` names the key and the fix instead of failing inside the provider."""
    if cfg.existing is None:
        raise ValueError("existing_kubeconfig needs target 'existing'")
    path = Path(cfg.existing.kubeconfig).expanduser()
    key = "existing.kubeconfig"
    try:
        doc = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise fail(
            key, f"{path} does not exist", "point it at the kubeconfig of the Substrate cluster"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise fail(
            key, f"{path} cannot be read ({exc})", "check the file and its permissions"
        ) from None
    except yaml.YAMLError as exc:
        detail = " ".join(str(exc).split())
        raise fail(
            key, f"{path} is not valid YAML ({detail})", "point it at a kubeconfig file"
        ) from None
    contexts = doc.get("contexts") if isinstance(doc, Mapping) else None
    names = [
        c["name"]
        for c in contexts or []
        if isinstance(c, Mapping) and isinstance(c.get("name"), str)
    ]
    if not names:
        raise fail(key, f"{path} has no contexts", "point it at a kubeconfig with a context")
    assert isinstance(doc, Mapping)
    context = cfg.existing.context or doc.get("current-context")
    if not context:
        raise fail(
            "existing.context",
            f"is not set and {path} has no current-context",
            f"set `existing.context` to one of: {', '.join(names)}",
        )
    if context not in names:
        raise fail(
            "existing.context" if cfg.existing.context else key,
            f"context {context!r} is not in {path}",
            f"use one of: {', '.join(names)}",
        )
    return str(path), str(context)


def stack_file(repo_root: Path, stack: str) -> Path:
    return repo_root / "infra" / "stacks" / f"Pulumi.{stack}.yaml"


def parse_config_values(values: Mapping[str, Any]) -> tuple[dict[str, Any], frozenset[str]]:
    """Turn `gym-substrate:<key>` entries (YAML values or Pulumi's JSON strings) into a mapping.

    Returns the plain values and the names of secret keys that are present.
    """
    raw: dict[str, Any] = {}
    secrets: set[str] = set()
    prefix = f"{PROJECT}:"
    for full_key, value in values.items():
        if not full_key.startswith(prefix):
            continue
        key = full_key[len(prefix) :]
        if key in SECRET_KEYS:
            secrets.add(key)
            continue
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                pass
        raw[key] = value
    return raw, frozenset(secrets)


def load_stack_file(path: Path) -> StackConfig:
    """Parse and validate a stack file without Pulumi (used by `render` and the tests).

    Secret keys count as present when the file lists them (`secure:` values) or when the stack
    targets a host, since render never touches the host.
    """
    if not path.is_file():
        raise ConfigError(
            f"stack file {path} does not exist. Fix: pick one of the stacks in "
            f"{path.parent} (Pulumi.<stack>.yaml)"
        )
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        detail = " ".join(str(exc).split())
        raise ConfigError(
            f"not valid YAML ({detail}). Fix: correct the file's syntax "
            "(`pulumi config` writes it correctly)"
        ) from None
    if not isinstance(doc, Mapping):
        raise ConfigError(
            f"expected a mapping with a `config:` key, got {type(doc).__name__}. Fix: "
            "start the file with `config:` and list the `gym-substrate:<key>` entries under it"
        )
    values = doc.get("config") or {}
    if not isinstance(values, Mapping):
        raise ConfigError(f"{path}: `config` must be a mapping")
    raw, secrets = parse_config_values(values)
    if raw.get("target") == "host":
        secrets = secrets | {"sshPrivateKey"}
    return StackConfig.from_mapping(raw, secrets=secrets)
