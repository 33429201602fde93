"""Stack configuration: one frozen, validated object built from `Pulumi.<stack>.yaml`.

Why a separate parser instead of `pulumi.Config.require_*` calls spread over the components:
every mistake is reported before a single resource is registered (at `pulumi preview`), the
message names the exact key (`gym-substrate:pool.replicas`) and the fix, and the same parser
serves `gym-substrate render`, which runs without Pulumi.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gym_substrate._errors import ConfigError
from gym_substrate._names import is_dns_label

__all__ = [
    "PROJECT",
    "SECRET_KEYS",
    "AccessConfig",
    "AgentConfig",
    "ClusterConfig",
    "ConfigError",
    "ExistingConfig",
    "HostConfig",
    "ObservabilityConfig",
    "PoolConfig",
    "StackConfig",
    "SubstrateConfig",
    "TemplatesConfig",
    "WorkloadConfig",
    "existing_kubeconfig",
    "load_stack_file",
    "stack_file",
]

PROJECT = "gym-substrate"
# Keys that hold secrets: never parsed into the plain config object; the program reads them as
# Pulumi secrets and the parser only checks that they are present when the target needs them.
SECRET_KEYS = frozenset({"sshPrivateKey"})

PAUSE_IMAGE = (
    "registry.k8s.io/pause:3.10.2"
    "@sha256:f548e0e8e3dc1896ca956272154dde3314e8cc4fde0a57577ee9fa1c63f5baf4"
)
SUBSTRATE_REPO = "https://github.com/agent-substrate/substrate.git"
SUBSTRATE_COMMIT = "86e138f628e419426be5ac9bbc68507e8333a4c4"

# Substrate commits known to lack image volumes in ActorTemplate (reference §2.3).
_NO_IMAGE_VOLUMES = frozenset({SUBSTRATE_COMMIT})
_DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")
# A whole image reference pinned by digest: a name without spaces or `@`, then the digest.
_PINNED = re.compile(r"^[a-z0-9][^\s@]*@sha256:[0-9a-f]{64}$")
# A node's DNS name or IPv4 address, or a bracketed IPv6 address: what providerConfig dials.
_ADDRESS = re.compile(r"^([A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\])$")
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|Ki|Mi|Gi|Ti|k|M|G|T)?$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_HOST_KEY = re.compile(
    r"^(ssh-[a-z0-9-]+|ecdsa-sha2-nistp(256|384|521)|sk-[a-z0-9@.-]+) [A-Za-z0-9+/]+={0,2}$"
)
_VERSION = re.compile(r"^v?[0-9]+\.[0-9]+\.[0-9]+([-+.][0-9A-Za-z.-]+)?$")


def _host_key(section: _Section) -> str | None:
    value = section.opt_string("hostKey")
    if value is None:
        return None
    # A known_hosts line may start with the host name(s): keep the key type and blob only.
    words = value.split()
    if len(words) >= 3 and not _HOST_KEY.match(" ".join(words[:2])):
        words = words[1:]
    key = " ".join(words[:2])
    if not _HOST_KEY.match(key):
        raise _fail(
            section.sub("hostKey"),
            f"{value[:60]!r} is not an SSH host key",
            "paste the host's line from `ssh-keyscan -t ed25519 <host>` "
            "(`ssh-ed25519 AAAA...`), or remove the key to record the one the host shows at "
            "the first `pulumi up`",
        )
    return key


def _key(path: str) -> str:
    return f"{PROJECT}:{path}"


def _fail(path: str, problem: str, fix: str) -> ConfigError:
    return ConfigError(f"{_key(path)}: {problem}. Fix: {fix}")


class _Section:
    """Reads one mapping section, remembering which keys were consumed."""

    def __init__(self, path: str, raw: object) -> None:
        if raw is None:
            raw = {}
        if not isinstance(raw, Mapping):
            raise _fail(
                path,
                f"expected a mapping, got {type(raw).__name__}",
                f"write `{path}:` as a YAML mapping of keys",
            )
        self.path = path
        self.raw: Mapping[str, Any] = raw
        self.used: set[str] = set()

    def sub(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def get(self, key: str, default: Any = None, *, required: bool = False, fix: str = "") -> Any:
        self.used.add(key)
        if key not in self.raw or self.raw[key] is None:
            if required:
                raise _fail(
                    self.sub(key),
                    "is required but missing",
                    fix or f"set `{self.sub(key)}` in the stack file",
                )
            return default
        return self.raw[key]

    def string(
        self, key: str, default: str | None = None, *, required: bool = False, fix: str = ""
    ) -> str:
        value = self.get(key, default, required=required, fix=fix)
        if not isinstance(value, str) or not value:
            raise _fail(
                self.sub(key),
                f"expected a non-empty string, got {value!r}",
                fix or f"set `{self.sub(key)}` to a string",
            )
        return value

    def opt_string(self, key: str) -> str | None:
        value = self.get(key)
        if value is None:
            return None
        if not isinstance(value, str) or not value:
            raise _fail(
                self.sub(key),
                f"expected a non-empty string, got {value!r}",
                f"set `{self.sub(key)}` to a string or remove it",
            )
        return value

    def integer(self, key: str, default: int, lo: int, hi: int) -> int:
        value = self.get(key, default)
        if isinstance(value, str) and value.strip().isdigit():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise _fail(
                self.sub(key),
                f"expected an integer in [{lo}, {hi}], got {value!r}",
                f"set `{self.sub(key)}` to a whole number between {lo} and {hi}",
            )
        return value

    def boolean(self, key: str, default: bool) -> bool:
        value = self.get(key, default)
        if isinstance(value, str) and value.lower() in {"true", "false"}:
            value = value.lower() == "true"
        if not isinstance(value, bool):
            raise _fail(
                self.sub(key),
                f"expected true or false, got {value!r}",
                f"set `{self.sub(key)}` to true or false",
            )
        return value

    def choice(self, key: str, default: str, choices: tuple[str, ...]) -> str:
        value = self.get(key, default)
        if value not in choices:
            raise _fail(
                self.sub(key),
                f"unknown value {value!r}",
                f"set `{self.sub(key)}` to one of: {', '.join(choices)}",
            )
        return str(value)

    def done(self) -> None:
        unknown = sorted(set(self.raw) - self.used)
        if unknown:
            where = self.sub(unknown[0])
            raise _fail(
                where,
                "is not a known key",
                f"remove it or correct the spelling; known keys under "
                f"`{self.path or 'the project'}`: {', '.join(sorted(self.used))}",
            )


def _digest_image(
    section: _Section,
    key: str,
    default: str | None = None,
    *,
    required: bool = False,
    fix: str = "",
) -> str:
    value = section.string(key, default, required=required, fix=fix)
    if not _DIGEST.search(value) or not _PINNED.match(value):
        problem = (
            f"{value!r} is not `<name>@sha256:<64 lower-case hex>`"
            if "@" in value
            else f"{value!r} is a tag, but a digest is required"
        )
        raise _fail(
            section.sub(key),
            problem,
            "pin it as `<image>@sha256:<64 hex>` (get the digest with "
            "`docker buildx imagetools inspect <image>`)",
        )
    return value


def _versioned_image(section: _Section, key: str, default: str) -> str:
    """Images that may be a digest or an exact version tag, never `latest` or no tag."""
    value = section.string(key, default)
    if _DIGEST.search(value):
        return value
    name, _, tag = value.rpartition(":")
    if not name or "/" in tag or tag == "latest" or not re.search(r"[0-9]", tag):
        raise _fail(
            section.sub(key),
            f"{value!r} is not pinned",
            "use an exact version tag (e.g. `:v3.5.3`) or `@sha256:<digest>`",
        )
    return value


def _quantity(section: _Section, key: str, default: str) -> str:
    value = section.get(key, default)
    value = str(value) if isinstance(value, int | float) and not isinstance(value, bool) else value
    if not isinstance(value, str) or not _QUANTITY.match(value):
        raise _fail(
            section.sub(key),
            f"{value!r} is not a Kubernetes quantity",
            f"write it like `1`, `500m`, `4Gi` for `{section.sub(key)}`",
        )
    return value


def _label(section: _Section, key: str, default: str) -> str:
    value = section.string(key, default)
    if not is_dns_label(value):
        raise _fail(
            section.sub(key),
            f"{value!r} is not a DNS-1123 label",
            "use lower-case letters, digits and '-', at most 63 characters",
        )
    return value


def _node_port(section: _Section, key: str, default: int) -> int:
    return section.integer(key, default, 30000, 32767)


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
class ExistingConfig:
    """Target `existing`: a cluster that already runs Substrate, reached through a kubeconfig."""

    kubeconfig: str  # path, `~` allowed; read by the Kubernetes provider, never copied to state
    context: str | None  # None: the kubeconfig's current-context at each run
    address: str  # where the NodePorts answer (a node, or 127.0.0.1 through a tunnel)
    ateom_image: str  # the WorkerPool's ateom image, as the platform's Substrate release built it


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
class SubstrateConfig:
    repo: str = SUBSTRATE_REPO
    commit: str = SUBSTRATE_COMMIT
    path: str | None = None
    auth_mode: str = "mtls"
    bucket: str = "ate-snapshots"

    @property
    def overlay(self) -> str:
        return (
            "manifests/ate-install/kind-jwt"
            if self.auth_mode == "jwt"
            else ("manifests/ate-install/kind")
        )


@dataclass(frozen=True)
class PoolConfig:
    name: str = "sandbox-pool"
    namespace: str = "sandboxes"
    replicas: int = 8
    cpu: str = "1"
    memory: str = "4Gi"
    workload: str = "sandbox"


@dataclass(frozen=True)
class AgentConfig:
    mount: str = "derived-image"
    port: int = 80
    args: tuple[str, ...] = ("--host", "0.0.0.0", "--port", "80")
    build_script: str = "agent/build/build-static.sh"
    dockerfile: str = "agent/build/Dockerfile"
    binary_path: str = "/opt/sandbox-agent/sandbox-agent"
    # Target `existing` in image-volume mode: the prebuilt agent image, pinned by digest.
    image: str | None = None


@dataclass(frozen=True)
class WorkloadConfig:
    name: str
    image: str
    env: tuple[tuple[str, str], ...] = ()
    # Target `existing`: the prebuilt image the template runs (this workload with the sandbox
    # agent added), pinned by digest, instead of one `pulumi up` builds.
    agent_image: str | None = None


@dataclass(frozen=True)
class TemplatesConfig:
    ready_timeout_s: int = 300
    pause_image: str = PAUSE_IMAGE
    env: tuple[tuple[str, str], ...] = (("HOME", "/root"),)


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
    """The whole validated stack. `target` picks kind on this machine or a borrowed host."""

    target: str
    runtime: str
    cluster: ClusterConfig
    substrate: SubstrateConfig
    pool: PoolConfig
    agent: AgentConfig
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
        return "gvisor-default" if self.runtime == "gvisor" else "microvm"

    @property
    def ateom_package(self) -> str:
        return f"./cmd/ateom-{self.runtime}"

    @classmethod
    def from_mapping(
        cls, raw: Mapping[str, Any], *, secrets: frozenset[str] = frozenset()
    ) -> StackConfig:
        """Validate the project's config keys (without the `gym-substrate:` prefix).

        `secrets` names the secret keys that are set (their values never reach this object).
        """
        top = _Section("", raw)
        top.used.update(SECRET_KEYS)
        target = top.choice("target", "kind", ("kind", "host", "existing"))
        runtime = top.choice("runtime", "gvisor", ("gvisor", "microvm"))

        if target == "existing" and top.get("cluster") is not None:
            raise _fail(
                "cluster",
                "is not used with target 'existing' (the cluster already exists)",
                "remove `cluster`; set `existing.kubeconfig` and `existing.context` instead",
            )
        c = _Section("cluster", top.get("cluster"))
        node_image = c.opt_string("nodeImage")
        if node_image is not None:
            node_image = _digest_image(c, "nodeImage")
        cluster = ClusterConfig(
            name=_label(c, "name", "substrate"),
            registry_port=c.integer("registryPort", 5001, 1024, 65535),
            node_image=node_image,
            kvm=c.boolean("kvm", False),
            workdir=_workdir(c),
        )
        c.done()
        if runtime == "microvm" and not cluster.kvm and target != "existing":
            raise _fail(
                "cluster.kvm",
                "runtime 'microvm' needs /dev/kvm on the node host, but cluster.kvm is false",
                "on a host where `ls -l /dev/kvm` shows the device, set "
                "`gym-substrate:cluster: {kvm: true}`; otherwise use "
                "`gym-substrate:runtime: gvisor`",
            )

        host: HostConfig | None = None
        tools = ToolVersions()
        if target == "host":
            h = _Section(
                "host",
                top.get(
                    "host", required=True, fix="add `gym-substrate:host: {address: ..., user: ...}`"
                ),
            )
            host = HostConfig(
                address=h.string(
                    "address",
                    required=True,
                    fix="set `host.address` to the borrowed host's IP or DNS name",
                ),
                user=h.string(
                    "user",
                    required=True,
                    fix="set `host.user` to an SSH user with passwordless sudo",
                ),
                port=h.integer("port", 22, 1, 65535),
                api_port=h.integer("apiPort", 6443, 1024, 65535),
                sshd_cpu_weight=h.integer("sshdCpuWeight", 10000, 1, 10000),
                host_key=_host_key(h),
            )
            h.done()
            if "sshPrivateKey" not in secrets:
                raise _fail(
                    "sshPrivateKey",
                    "is required for target 'host' but missing",
                    "run `pulumi config set --secret sshPrivateKey < ~/.ssh/id_ed25519`",
                )
            t = _Section("tools", top.get("tools"))
            tools = ToolVersions(
                docker=t.string("docker", "docker.io"),
                kind=_version(t, "kind", "v0.32.0"),
                kubectl=_version(t, "kubectl", "v1.36.0"),
                go=_version(t, "go", "1.26.3"),
                ko=_version(t, "ko", "v0.18.1"),
                offline_dir=_offline_dir(t),
            )
            t.done()
        elif top.get("host") is not None:
            raise _fail(
                "host",
                "is only used with target 'host'",
                "remove `host` or set `gym-substrate:target: host`",
            )
        existing = _existing(top, target)

        s = _Section("substrate", top.get("substrate"))
        commit = s.string("commit", SUBSTRATE_COMMIT)
        if not _COMMIT.match(commit):
            raise _fail(
                "substrate.commit",
                f"{commit!r} is not a full commit id",
                "pin the Substrate checkout by its 40-character commit hash "
                "(`git rev-parse HEAD`), not a branch or tag",
            )
        substrate = SubstrateConfig(
            repo=s.string("repo", SUBSTRATE_REPO),
            commit=commit,
            path=s.opt_string("path"),
            auth_mode=s.choice("authMode", "mtls", ("mtls", "jwt")),
            bucket=_label(s, "bucket", "ate-snapshots"),
        )
        s.done()
        if target == "existing" and ("repo" in s.raw or "path" in s.raw):
            raise _fail(
                "substrate.repo" if "repo" in s.raw else "substrate.path",
                "is not used with target 'existing' (Substrate is already installed there)",
                "remove it; `substrate.commit` names the Substrate version the cluster runs",
            )
        if substrate.path is not None and target == "host":
            raise _fail(
                "substrate.path",
                "a local checkout cannot be used on a borrowed host",
                "remove `substrate.path`; the host clones `substrate.repo` at `substrate.commit`",
            )

        p = _Section("pool", top.get("pool"))
        agent_raw = top.raw.get("agent")
        if (
            isinstance(agent_raw, Mapping)
            and agent_raw.get("mount") == "image-volume"
            and substrate.commit in _NO_IMAGE_VOLUMES
        ):
            raise _fail(
                "agent.mount",
                f"'image-volume' needs an ActorTemplate with image volumes, which Substrate "
                f"{substrate.commit[:8]} does not have (the API server would drop the volume)",
                "use `mount: derived-image`, or pin a newer `substrate.commit` that supports "
                "image volumes",
            )
        pool = PoolConfig(
            name=_label(p, "name", "sandbox-pool"),
            namespace=_label(p, "namespace", "sandboxes"),
            replicas=p.integer("replicas", 8, 0, 10000),
            cpu=_quantity(p, "cpu", "1"),
            memory=_quantity(p, "memory", "4Gi"),
            workload=_label(p, "workload", "sandbox"),
        )
        p.done()

        a = _Section("agent", top.get("agent"))
        mount = a.choice("mount", "derived-image", ("derived-image", "image-volume"))
        args = a.get("args", list(AgentConfig.args))
        if not isinstance(args, list) or not all(isinstance(x, str) for x in args):
            raise _fail(
                "agent.args",
                f"expected a list of strings, got {args!r}",
                'write e.g. `args: [--host, 0.0.0.0, --port, "80"]`',
            )
        agent_image: str | None = None
        if target == "existing" and mount == "image-volume":
            agent_image = _digest_image(
                a,
                "image",
                required=True,
                fix="set `agent.image` to the prebuilt sandbox-agent image, "
                "`<registry>/sandbox-agent@sha256:<64 hex>`",
            )
        elif a.get("image") is not None:
            raise _fail(
                "agent.image",
                "is only used with target 'existing' and `agent.mount: image-volume`",
                "remove it; kind and host stacks build the agent image at `pulumi up`",
            )
        agent = AgentConfig(
            mount=mount,
            args=tuple(args),
            build_script=a.string("buildScript", AgentConfig.build_script),
            dockerfile=a.string("dockerfile", AgentConfig.dockerfile),
            image=agent_image,
        )
        a.done()

        workloads_raw = top.get(
            "workloads",
            required=True,
            fix="list at least one workload, e.g. "
            "`workloads: [{name: python, image: python:3.12-slim}]`",
        )
        if not isinstance(workloads_raw, list) or not workloads_raw:
            raise _fail(
                "workloads",
                "expected a non-empty list",
                "list at least one `{name: ..., image: ...}` entry",
            )
        workloads: list[WorkloadConfig] = []
        for i, item in enumerate(workloads_raw):
            w = _Section(f"workloads[{i}]", item)
            image = w.string("image", required=True)
            untagged = ":" not in image.rsplit("/", 1)[-1] and "@" not in image
            if image.endswith(":latest") or untagged:
                raise _fail(
                    w.sub("image"),
                    f"{image!r} has no version",
                    "give a tag (`python:3.12-slim`, resolved to a digest at `pulumi up`) "
                    "or a digest (`image@sha256:...`); `latest` is not allowed",
                )
            workloads.append(
                WorkloadConfig(
                    name=_label(w, "name", ""),
                    image=image,
                    env=_env(w, "env"),
                    agent_image=_workload_agent_image(w, target, mount, image),
                )
            )
            w.done()
        names = [wl.name for wl in workloads]
        if len(set(names)) != len(names):
            raise _fail(
                "workloads",
                f"duplicate workload names {names}",
                "give every workload a distinct `name`",
            )

        tp = _Section("templates", top.get("templates"))
        templates = TemplatesConfig(
            ready_timeout_s=tp.integer(
                "readyTimeoutSeconds", 600 if runtime == "microvm" else 300, 30, 7200
            ),
            pause_image=_digest_image(tp, "pauseImage", PAUSE_IMAGE),
            env=_env(tp, "env") or TemplatesConfig.env,
        )
        tp.done()

        ac = _Section("access", top.get("access"))
        access = AccessConfig(
            api_node_port=_node_port(ac, "apiNodePort", 30443),
            router_node_port=_node_port(ac, "routerNodePort", 30080),
            grafana_node_port=_node_port(ac, "grafanaNodePort", 30300),
            prometheus_node_port=_node_port(ac, "prometheusNodePort", 30090),
            atespace=_label(ac, "atespace", "gym"),
        )
        ac.done()
        ports = [
            access.api_node_port,
            access.router_node_port,
            access.grafana_node_port,
            access.prometheus_node_port,
        ]
        if len(set(ports)) != len(ports):
            raise _fail(
                "access",
                f"node ports collide: {ports}",
                "give the API, router, Grafana and Prometheus distinct nodePorts",
            )

        o = _Section("observability", top.get("observability"))
        targets = o.get("providerTargets", [])
        if not isinstance(targets, list) or not all(
            isinstance(x, str) and re.match(r"^[^\s:/]+:[0-9]{1,5}$", x) for x in targets
        ):
            raise _fail(
                "observability.providerTargets",
                f"expected host:port strings, got {targets!r}",
                'list the provider metrics endpoints as `["172.18.0.1:9464"]`',
            )
        observability = ObservabilityConfig(
            enabled=o.boolean("enabled", True),
            namespace=_label(o, "namespace", "gym-observability"),
            prometheus_image=_versioned_image(o, "prometheusImage", "prom/prometheus:v3.5.3"),
            grafana_image=_versioned_image(o, "grafanaImage", "grafana/grafana:11.6.0"),
            provider_targets=tuple(targets),
        )
        o.done()
        top.done()
        return cls(
            target=target,
            runtime=runtime,
            cluster=cluster,
            substrate=substrate,
            pool=pool,
            agent=agent,
            workloads=tuple(workloads),
            templates=templates,
            access=access,
            observability=observability,
            host=host,
            tools=tools,
            existing=existing,
        )


def _existing(top: _Section, target: str) -> ExistingConfig | None:
    if target != "existing":
        if top.get("existing") is not None:
            raise _fail(
                "existing",
                "is only used with target 'existing'",
                "remove `existing` or set `gym-substrate:target: existing`",
            )
        return None
    e = _Section(
        "existing",
        top.get(
            "existing",
            required=True,
            fix="add `gym-substrate:existing: {kubeconfig: ~/.kube/config, address: ..., "
            "ateomImage: ...}`",
        ),
    )
    kubeconfig = e.string(
        "kubeconfig", "~/.kube/config", fix="set `existing.kubeconfig` to your kubeconfig's path"
    )
    if not (kubeconfig.startswith("/") or kubeconfig.startswith("~/")) or "\n" in kubeconfig:
        raise _fail(
            "existing.kubeconfig",
            f"{kubeconfig!r} is not an absolute or ~/ path",
            "write the kubeconfig's full path, e.g. `~/.kube/config`",
        )
    address = e.string(
        "address",
        required=True,
        fix="set `existing.address` to a node's address where the NodePorts answer "
        "(`kubectl get nodes -o wide`), or 127.0.0.1 if you tunnel them here",
    )
    if not _ADDRESS.match(address):
        raise _fail(
            "existing.address",
            f"{address!r} is not a host name or IP address",
            "give a node's DNS name or IP without scheme or port, e.g. `10.0.0.5`",
        )
    cfg = ExistingConfig(
        kubeconfig=kubeconfig,
        context=e.opt_string("context"),
        address=address,
        ateom_image=_digest_image(
            e,
            "ateomImage",
            required=True,
            fix="set `existing.ateomImage` to the ateom image your Substrate install runs, "
            "`<registry>/ateom-gvisor@sha256:<64 hex>` (see `kubectl -n ate-system get deploy "
            "-o yaml`)",
        ),
    )
    e.done()
    return cfg


def _workload_agent_image(w: _Section, target: str, mount: str, image: str) -> str | None:
    """Target `existing` builds nothing: in derived-image mode each workload names its prebuilt
    image with the agent; in image-volume mode the workload itself must already be a digest."""
    if target != "existing":
        if w.get("agentImage") is not None:
            raise _fail(
                w.sub("agentImage"),
                "is only used with target 'existing'",
                "remove it; kind and host stacks build the workload's image at `pulumi up`",
            )
        return None
    if mount == "image-volume":
        if w.get("agentImage") is not None:
            raise _fail(
                w.sub("agentImage"),
                "is not used with `agent.mount: image-volume` (the template mounts `agent.image`)",
                "remove it, or use `agent.mount: derived-image`",
            )
        if not _PINNED.match(image):
            raise _fail(
                w.sub("image"),
                f"{image!r} is not pinned by digest, and target 'existing' resolves nothing",
                "write it as `<name>@sha256:<64 hex>`",
            )
        return None
    return _digest_image(
        w,
        "agentImage",
        required=True,
        fix=f"set `{w.sub('agentImage')}` to the prebuilt image the template runs (this "
        "workload with the sandbox agent at /opt/sandbox-agent/sandbox-agent), "
        "`<registry>/<name>@sha256:<64 hex>`",
    )


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
        raise _fail(
            key, f"{path} does not exist", "point it at the kubeconfig of the Substrate cluster"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise _fail(
            key, f"{path} cannot be read ({exc})", "check the file and its permissions"
        ) from None
    except yaml.YAMLError as exc:
        detail = " ".join(str(exc).split())
        raise _fail(
            key, f"{path} is not valid YAML ({detail})", "point it at a kubeconfig file"
        ) from None
    contexts = doc.get("contexts") if isinstance(doc, Mapping) else None
    names = [
        c["name"]
        for c in contexts or []
        if isinstance(c, Mapping) and isinstance(c.get("name"), str)
    ]
    if not names:
        raise _fail(key, f"{path} has no contexts", "point it at a kubeconfig with a context")
    assert isinstance(doc, Mapping)
    context = cfg.existing.context or doc.get("current-context")
    if not context:
        raise _fail(
            "existing.context",
            f"is not set and {path} has no current-context",
            f"set `existing.context` to one of: {', '.join(names)}",
        )
    if context not in names:
        raise _fail(
            "existing.context" if cfg.existing.context else key,
            f"context {context!r} is not in {path}",
            f"use one of: {', '.join(names)}",
        )
    return str(path), str(context)


def _workdir(section: _Section) -> str:
    value = section.string("workdir", "~/.gym-substrate")
    if not (value.startswith("/") or value == "~" or value.startswith("~/")) or any(
        c in value for c in "\"'$`\\ \n"
    ):
        raise _fail(
            section.sub("workdir"),
            f"{value!r} is not an absolute or ~/ path without quotes, spaces or `$`",
            "use e.g. `~/.gym-substrate` or `/var/lib/gym-substrate`",
        )
    return value


def _offline_dir(section: _Section) -> str | None:
    value = section.opt_string("offlineDir")
    if value is None:
        return None
    path = Path(value).expanduser()
    if not path.is_absolute() or any(c in value for c in "\"'$`\\ \n") or path.name in {"", "."}:
        raise _fail(
            section.sub("offlineDir"),
            f"{value!r} is not an absolute or ~/ path of a folder without quotes, spaces or `$`",
            "point it at the folder `gym-substrate infra tools-bundle --out <dir>` filled, "
            "e.g. `~/gym-substrate-tools`",
        )
    return str(path)


def _version(section: _Section, key: str, default: str) -> str:
    value = section.string(key, default)
    if not _VERSION.match(value):
        raise _fail(
            section.sub(key),
            f"{value!r} is not an exact version",
            "pin an exact release such as `v0.32.0` or `1.26.3`",
        )
    return value


def _env(section: _Section, key: str) -> tuple[tuple[str, str], ...]:
    value = section.get(key, {})
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and re.match(r"^[ -<>-~]+$", k) and isinstance(v, str | int | float)
        for k, v in value.items()
    ):
        raise _fail(
            section.sub(key),
            f"expected a mapping of NAME: value, got {value!r}",
            "write env as `{NAME: value}` with printable names without '='",
        )
    return tuple((str(k), str(v)) for k, v in value.items())


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
