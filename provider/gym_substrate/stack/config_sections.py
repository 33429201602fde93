"""The stack config's sections: one frozen dataclass per section, and the function that reads it.

Each `parse_*` reads one section of the validated mapping with `config_base.Section`, so a
mistake names its key (`gym-substrate:pool.perWorker`) and the fix. Keys that earlier versions
of this project read and that mean something else now (`substrate.commit`, `pool.replicas`,
`agent.mount`, ...) are refused with what replaced them, not silently ignored.

Upstream facts these sections encode (see docs/infra.md for the full list):
- releases are `vX.Y.Z` tags (`vX.Y.Z-rc.N` for candidates) with images at
  `ghcr.io/agent-substrate/substrate/<image>:<tag>` (docs/dev/releasing.md@3683e551);
- a WorkerPool names its worker image in `spec.workerImage` and one sandbox class
  (pkg/api/v1alpha1/workerpool_types.go, stored version id 70182249026);
- a worker's capacity is its ateom container's resource limits, and an actor fits while the
  template's `resources.limits` fit in what is left (scheduling.HasRoom, read in
  cmd/ateapi's scheduler; docs/infra.md "The pinned release"), so `pool.perWorker` sandboxes of
  `cpu / perWorker` and `memory / perWorker` share one worker.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from gym_substrate.stack.api_era import ApiEra, parse_api_era
from gym_substrate.stack.config_base import (
    ADDRESS,
    COMMIT,
    PINNED,
    Section,
    digest_image,
    env,
    fail,
    label,
    quantity,
    quantity_value,
    refuse,
)

__all__ = [
    "PAUSE_IMAGE",
    "SUBSTRATE_IMAGES",
    "SUBSTRATE_REPO",
    "SUBSTRATE_VERSION",
    "AgentImageConfig",
    "DatabaseConfig",
    "ExistingConfig",
    "PoolConfig",
    "SourceConfig",
    "SubstrateConfig",
    "TemplatesConfig",
    "WorkloadConfig",
    "parse_agent",
    "parse_existing",
    "parse_pool",
    "parse_substrate",
    "parse_templates",
    "parse_workloads",
]

# The newest release whose install facts we could read (docs/infra.md, "The pinned release").
SUBSTRATE_VERSION = "v0.3.0"
SUBSTRATE_REPO = "https://github.com/agent-substrate/substrate.git"
SUBSTRATE_IMAGES = "ghcr.io/agent-substrate/substrate"
PAUSE_IMAGE = (
    "registry.k8s.io/pause:3.10.2"
    "@sha256:f548e0e8e3dc1896ca956272154dde3314e8cc4fde0a57577ee9fa1c63f5baf4"
)
_NUM = "(0|[1-9][0-9]*)"
_RELEASE = re.compile(rf"^v{_NUM}\.{_NUM}\.{_NUM}(-rc\.{_NUM})?$")
_REGISTRY_PATH = re.compile(
    r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?(:[0-9]{1,5})?(/[a-z0-9]+([._-][a-z0-9]+)*)+$"
)
_GIT_URL = re.compile(r"^(https://|ssh://|git@|file://|/)[^\s'\"`$\\]+$")
_STORAGE = re.compile(r"^[a-z][a-z0-9+.-]*://[^\s'\"`$\\]*/$")
# The smallest sandbox a worker share may be: the agent alone takes about 100 MiB (PSS).
_MIN_SANDBOX_CPU_M = 100
_MIN_SANDBOX_MEMORY_MI = 256


@dataclass(frozen=True)
class SourceConfig:
    """`substrate.source`: an unreleased Substrate commit, built with ko instead of pulled."""

    commit: str
    repo: str = SUBSTRATE_REPO
    path: str | None = None  # a local checkout at `commit` (kind stacks)


@dataclass(frozen=True)
class SubstrateConfig:
    version: str = SUBSTRATE_VERSION
    repo: str = SUBSTRATE_REPO  # where the release's source tree (manifests, ate-setup) is cloned
    images: str = SUBSTRATE_IMAGES  # the release's images: <images>/<image>:<version>
    source: SourceConfig | None = None
    auth_mode: str = "jwt"
    bucket: str = "ate-snapshots"
    api_era: ApiEra = ApiEra()  # the era its templates are written for (stack/api_era.py)

    @property
    def prebuilt(self) -> bool:
        return self.source is None

    @property
    def checkout(self) -> str:
        """What the source tree is checked out at: the release tag, or the source commit."""
        return self.source.commit if self.source else self.version

    def image(self, name: str) -> str:
        """A release image by tag, e.g. `ghcr.io/agent-substrate/substrate/ateapi:v0.3.0`."""
        return f"{self.images}/{name}:{self.version}"


@dataclass(frozen=True)
class DatabaseConfig:
    """Target `existing`: the PostgreSQL the cluster's Substrate keeps its state in."""

    mode: str = "bundled"  # bundled: the install's StatefulSet ate-system/postgres
    address: str | None = None  # external: host:port of the operator's PostgreSQL


@dataclass(frozen=True)
class ExistingConfig:
    """Target `existing`: a cluster that already runs Substrate, reached through a kubeconfig."""

    kubeconfig: str  # path, `~` allowed; read by the Kubernetes provider, never copied to state
    context: str | None  # None: the kubeconfig's current-context at each run
    address: str  # where the NodePorts answer (a node, or 127.0.0.1 through a tunnel)
    worker_image: str  # the WorkerPool's worker (ateom) image, as the platform's release has it
    database: DatabaseConfig = DatabaseConfig()
    # The ClusterTrustBundle whose PEM clients pin: the servicedns signer's live bundle.
    ca_bundle: str = "servicedns.podcert.ate.dev:identity:primary-bundle"


@dataclass(frozen=True)
class PoolConfig:
    name: str = "sandbox-pool"
    namespace: str = "sandboxes"
    workload: str = "sandbox"
    sandboxes: int = 8  # how many sandboxes may run at once
    per_worker: int = 4  # sandboxes one worker holds
    cpu: str = "4"  # each worker pod's limits: the capacity its sandboxes share
    memory: str = "16Gi"
    sandbox_config: str = "gvisor-default"
    pause_image: str = PAUSE_IMAGE  # microVM: our SandboxConfig's (required by its schema)

    @property
    def replicas(self) -> int:
        """Workers needed for `sandboxes` at `per_worker` each."""
        return math.ceil(self.sandboxes / self.per_worker)

    @property
    def sandbox_cpu(self) -> str:
        """One sandbox's share of a worker's CPU, the template's `resources.limits.cpu`."""
        return f"{_sandbox_cpu_m(self.cpu, self.per_worker)}m"

    @property
    def sandbox_memory(self) -> str:
        return f"{_sandbox_memory_mi(self.memory, self.per_worker)}Mi"


def _sandbox_cpu_m(cpu: str, per_worker: int) -> int:
    return int(quantity_value(cpu) * 1000 // per_worker)


def _sandbox_memory_mi(memory: str, per_worker: int) -> int:
    return int(quantity_value(memory) / 2**20 // per_worker)


@dataclass(frozen=True)
class AgentImageConfig:
    """The stack's `agent:` section: how the sandbox agent is built and rides into templates
    (the agent's own runtime settings are `sandbox_agent.AgentConfig`)."""

    port: int = 80
    args: tuple[str, ...] = ("--host", "0.0.0.0", "--port", "80")
    build_script: str = "agent/build/build-static.sh"
    dockerfile: str = "agent/build/Dockerfile"
    binary_path: str = "/opt/sandbox-agent/sandbox-agent"
    # Target `existing`: the prebuilt agent image, pinned by digest (kind/host build it at `up`).
    image: str | None = None

    @property
    def mount_path(self) -> str:
        """Where the agent's image volume is mounted: the folder holding the binary."""
        return self.binary_path.rsplit("/", 1)[0]


@dataclass(frozen=True)
class WorkloadConfig:
    name: str
    image: str
    env: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class TemplatesConfig:
    ready_timeout_s: int = 300
    env: tuple[tuple[str, str], ...] = (("HOME", "/root"),)
    atespace: str = "gym"  # where the ActorTemplates are created
    storage_location: str = "gs://ate-snapshots/"  # snapshots go to <this><atespace>/<name>/
    resources: bool = True  # templates declare resources.limits (one worker share each)


# ---------------------------------------------------------------------------------------------
# substrate


def _release(s: Section) -> str:
    value = s.string("version", SUBSTRATE_VERSION)
    if COMMIT.match(value):
        raise fail(
            s.sub("version"),
            f"{value[:12]}... is a commit id, not a release",
            "set a release tag such as `v0.3.0`; for an unreleased commit use "
            "`substrate.source: {commit: <40 hex>}` instead",
        )
    if not _RELEASE.match(value):
        raise fail(
            s.sub("version"),
            f"{value!r} is not a release tag (vX.Y.Z, or vX.Y.Z-rc.N); a branch or other "
            "moving name would install whatever it points at on the day of `up`",
            "pin a release from https://github.com/agent-substrate/substrate/releases, "
            f"e.g. `{SUBSTRATE_VERSION}`",
        )
    return value


def _git_url(s: Section, name: str, default: str) -> str:
    value = s.string(name, default)
    if not _GIT_URL.match(value):
        raise fail(
            s.sub(name),
            f"{value!r} is not a git URL",
            "give an https://, ssh:// or git@ URL (or an absolute path) without quotes or `$`",
        )
    return value


def _source(s: Section, target: str, repo: str) -> SourceConfig | None:
    raw = s.get("source")
    if raw is None:
        return None
    src = Section("substrate.source", raw)
    commit = src.string(
        "commit",
        required=True,
        fix="set `substrate.source.commit` to the full 40-character commit (`git rev-parse HEAD`)",
    )
    if not COMMIT.match(commit):
        raise fail(
            src.sub("commit"),
            f"{commit!r} is not a full commit id",
            "pin the commit by its 40-character hash (`git rev-parse HEAD`), not a branch or "
            "tag; a release tag goes in `substrate.version`",
        )
    source = SourceConfig(
        commit=commit, repo=_git_url(src, "repo", repo), path=src.opt_string("path")
    )
    src.done()
    if source.path is not None and target == "host":
        raise fail(
            "substrate.source.path",
            "a local checkout cannot be used on a borrowed host",
            "remove `substrate.source.path`; the host clones `substrate.source.repo` at the commit",
        )
    if source.path is not None and not source.path.startswith("/"):
        raise fail(
            "substrate.source.path",
            f"{source.path!r} is not an absolute path",
            "give the checkout's absolute path",
        )
    return source


def parse_substrate(top: Section, target: str) -> SubstrateConfig:
    s = Section("substrate", top.get("substrate"))
    refuse(
        s,
        "commit",
        "was replaced by `substrate.version`, a release tag (Substrate publishes releases now)",
        f"set `substrate.version: {SUBSTRATE_VERSION}`; for an unreleased commit set "
        "`substrate.source: {commit: <40 hex>}`",
    )
    refuse(
        s,
        "path",
        "moved under `substrate.source`",
        "write `substrate.source: {commit: <40 hex>, path: <your checkout>}`",
    )
    if target == "existing":
        for name in ("repo", "images", "source"):
            if name in s.raw:
                raise fail(
                    s.sub(name),
                    "is not used with target 'existing' (Substrate is already installed there)",
                    "remove it; `substrate.version` names the release the cluster runs",
                )
    repo = _git_url(s, "repo", SUBSTRATE_REPO)
    source = _source(s, target, repo)
    if source is not None:
        for name in ("version", "images"):
            if name in s.raw:
                raise fail(
                    s.sub(name),
                    "is not used with `substrate.source` (the images are built from the commit)",
                    f"remove `substrate.{name}`, or remove `substrate.source` to install a release",
                )
    images = s.string("images", SUBSTRATE_IMAGES)
    if not _REGISTRY_PATH.match(images):
        raise fail(
            s.sub("images"),
            f"{images!r} is not a registry path",
            f"give the repository the release's images are under, e.g. `{SUBSTRATE_IMAGES}` "
            "(no tag, no trailing slash)",
        )
    version, given = _release(s), s.raw.get("version") is not None
    substrate = SubstrateConfig(
        version=version,
        repo=repo,
        images=images,
        source=source,
        auth_mode=s.choice("authMode", "jwt", ("jwt", "mtls")),
        bucket=label(s, "bucket", "ate-snapshots"),
        api_era=parse_api_era(
            s, target=target, version=version, version_given=given, source=source is not None
        ),
    )
    s.done()
    return substrate


# ---------------------------------------------------------------------------------------------
# existing


def _database(e: Section) -> DatabaseConfig:
    d = Section("existing.database", e.get("database"))
    mode = d.choice("mode", "bundled", ("bundled", "external"))
    address: str | None = None
    if mode == "external":
        address = d.string(
            "address",
            required=True,
            fix="set `existing.database.address` to the host:port of the PostgreSQL your "
            "platform team runs for Substrate (e.g. `db.internal:5432`)",
        )
        host, sep, port = address.rpartition(":")
        if not sep or not ADDRESS.match(host) or not port.isdigit() or not 0 < int(port) < 65536:
            raise fail(
                d.sub("address"),
                f"{address!r} is not host:port",
                "write it like `db.internal:5432`",
            )
    elif d.get("address") is not None:
        raise fail(
            d.sub("address"),
            "is only used with `mode: external`",
            "remove it, or set `existing.database.mode: external`",
        )
    d.done()
    return DatabaseConfig(mode=mode, address=address)


def parse_existing(top: Section, target: str) -> ExistingConfig | None:
    if target != "existing":
        if top.get("existing") is not None:
            raise fail(
                "existing",
                "is only used with target 'existing'",
                "remove `existing` or set `gym-substrate:target: existing`",
            )
        return None
    e = Section(
        "existing",
        top.get(
            "existing",
            required=True,
            fix="add `gym-substrate:existing: {kubeconfig: ~/.kube/config, address: ..., "
            "workerImage: ...}`",
        ),
    )
    refuse(
        e,
        "ateomImage",
        "was renamed `existing.workerImage` (the WorkerPool's field is `spec.workerImage` now)",
        "rename the key to `workerImage`",
    )
    kubeconfig = e.string(
        "kubeconfig", "~/.kube/config", fix="set `existing.kubeconfig` to your kubeconfig's path"
    )
    if not (kubeconfig.startswith("/") or kubeconfig.startswith("~/")) or "\n" in kubeconfig:
        raise fail(
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
    if not ADDRESS.match(address):
        raise fail(
            "existing.address",
            f"{address!r} is not a host name or IP address",
            "give a node's DNS name or IP without scheme or port, e.g. `10.0.0.5`",
        )
    cfg = ExistingConfig(
        kubeconfig=kubeconfig,
        context=e.opt_string("context"),
        address=address,
        worker_image=digest_image(
            e,
            "workerImage",
            required=True,
            fix="set `existing.workerImage` to the worker image your Substrate release runs, "
            "`<registry>/ateom-gvisor:<tag>@sha256:<64 hex>` (docs/upgrade.md: `crane digest`)",
        ),
        database=_database(e),
        ca_bundle=e.string("caBundle", ExistingConfig.ca_bundle),
    )
    e.done()
    return cfg


# ---------------------------------------------------------------------------------------------
# pool, agent, workloads, templates


def parse_pool(top: Section, target: str, runtime: str) -> PoolConfig:
    p = Section("pool", top.get("pool"))
    refuse(
        p,
        "replicas",
        "was replaced by `pool.sandboxes` and `pool.perWorker`: a worker holds several actors "
        "now, so the pool runs ceil(sandboxes / perWorker) workers",
        "set `pool.sandboxes` to how many sandboxes may run at once (and `pool.perWorker`)",
    )
    default_config = "gvisor-default" if runtime == "gvisor" else "microvm"
    if p.get("pauseImage") is not None and (runtime != "microvm" or target == "existing"):
        raise fail(
            "pool.pauseImage",
            "is only used by the microVM SandboxConfig a kind or host stack creates (gVisor "
            "uses the release's `gvisor-default`, which carries its own)",
            "remove it",
        )
    pool = PoolConfig(
        name=label(p, "name", "sandbox-pool"),
        namespace=label(p, "namespace", "sandboxes"),
        workload=label(p, "workload", "sandbox"),
        sandboxes=p.integer("sandboxes", 8, 0, 10000),
        per_worker=p.integer("perWorker", 4, 1, 64),
        cpu=quantity(p, "cpu", "4"),
        memory=quantity(p, "memory", "16Gi"),
        sandbox_config=label(p, "sandboxConfig", default_config),
        pause_image=digest_image(p, "pauseImage", PAUSE_IMAGE),
    )
    p.done()
    cpu_m = _sandbox_cpu_m(pool.cpu, pool.per_worker)
    memory_mi = _sandbox_memory_mi(pool.memory, pool.per_worker)
    if cpu_m < _MIN_SANDBOX_CPU_M or memory_mi < _MIN_SANDBOX_MEMORY_MI:
        raise fail(
            "pool.perWorker",
            f"{pool.per_worker} sandboxes on a worker of cpu {pool.cpu} and memory "
            f"{pool.memory} leave {cpu_m}m and {memory_mi}Mi each; a sandbox needs at least "
            f"{_MIN_SANDBOX_CPU_M}m and {_MIN_SANDBOX_MEMORY_MI}Mi",
            "raise `pool.cpu` / `pool.memory` (each worker pod's limits) or lower `pool.perWorker`",
        )
    return pool


def parse_agent(top: Section, target: str) -> AgentImageConfig:
    a = Section("agent", top.get("agent"))
    refuse(
        a,
        "mount",
        "was removed: the agent always rides on a digest-pinned image volume now, and the "
        "workload image runs untouched",
        "remove `agent.mount`",
    )
    args = a.get("args", list(AgentImageConfig.args))
    if not isinstance(args, list) or not all(isinstance(x, str) for x in args):
        raise fail(
            "agent.args",
            f"expected a list of strings, got {args!r}",
            'write e.g. `args: [--host, 0.0.0.0, --port, "80"]`',
        )
    image: str | None = None
    if target == "existing":
        image = digest_image(
            a,
            "image",
            required=True,
            fix="set `agent.image` to the prebuilt sandbox-agent image (agent/build/), "
            "`<registry>/sandbox-agent@sha256:<64 hex>`",
        )
    elif a.get("image") is not None:
        raise fail(
            "agent.image",
            "is only used with target 'existing'",
            "remove it; kind and host stacks build the agent image at `pulumi up`",
        )
    agent = AgentImageConfig(
        args=tuple(args),
        build_script=a.string("buildScript", AgentImageConfig.build_script),
        dockerfile=a.string("dockerfile", AgentImageConfig.dockerfile),
        image=image,
    )
    a.done()
    return agent


def parse_workloads(top: Section, target: str) -> tuple[WorkloadConfig, ...]:
    raw = top.get(
        "workloads",
        required=True,
        fix="list at least one workload, e.g. "
        "`workloads: [{name: python, image: python:3.12-slim}]`",
    )
    if not isinstance(raw, list) or not raw:
        raise fail(
            "workloads", "expected a non-empty list", "list at least one `{name: ..., image: ...}`"
        )
    workloads: list[WorkloadConfig] = []
    for i, item in enumerate(raw):
        w = Section(f"workloads[{i}]", item)
        refuse(
            w,
            "agentImage",
            "was removed: templates run the workload image itself and mount `agent.image` on "
            "an image volume",
            "remove it (target existing: set `agent.image` once)",
        )
        image = w.string("image", required=True)
        untagged = ":" not in image.rsplit("/", 1)[-1] and "@" not in image
        if image.endswith(":latest") or untagged:
            raise fail(
                w.sub("image"),
                f"{image!r} has no version",
                "give a tag (`python:3.12-slim`, resolved to a digest at `pulumi up`) "
                "or a digest (`image@sha256:...`); `latest` is not allowed",
            )
        if target == "existing" and not PINNED.match(image):
            raise fail(
                w.sub("image"),
                f"{image!r} is not pinned by digest, and target 'existing' resolves nothing",
                "write it as `<name>@sha256:<64 hex>`",
            )
        workloads.append(WorkloadConfig(name=label(w, "name", ""), image=image, env=env(w, "env")))
        w.done()
    names = [wl.name for wl in workloads]
    if len(set(names)) != len(names):
        raise fail(
            "workloads", f"duplicate workload names {names}", "give every workload a distinct name"
        )
    images = [wl.image for wl in workloads]
    if len(set(images)) != len(images):
        raise fail(
            "workloads",
            f"two workloads name the same image ({images})",
            "list each image once: providerConfig maps each image to one template",
        )
    return tuple(workloads)


def parse_templates(top: Section, runtime: str, bucket: str, atespace: str) -> TemplatesConfig:
    t = Section("templates", top.get("templates"))
    refuse(
        t,
        "pauseImage",
        "moved: the pause image belongs to the SandboxConfig now (its spec.pauseImage)",
        "remove it; microVM stacks may set `pool.pauseImage`",
    )
    location = t.string("storageLocation", f"gs://{bucket}/")
    if not _STORAGE.match(location):
        raise fail(
            t.sub("storageLocation"),
            f"{location!r} is not a storage URI ending in '/'",
            f"write it like `gs://{bucket}/` or `s3://bucket/prefix/`; each template's "
            "snapshots go to <storageLocation><atespace>/<template>/",
        )
    templates = TemplatesConfig(
        ready_timeout_s=t.integer(
            "readyTimeoutSeconds", 600 if runtime == "microvm" else 300, 30, 7200
        ),
        env=env(t, "env") or TemplatesConfig.env,
        atespace=label(t, "atespace", atespace),
        storage_location=location,
        resources=t.boolean("resources", True),
    )
    t.done()
    return templates
