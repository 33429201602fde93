"""The stack's Pulumi components, in dependency order.

BorrowedHost (host stacks) -> KindCluster -> SubstrateInstall -> RuntimeSetup -> WorkerPool,
AgentImage -> Access -> ActorTemplates; Observability hangs off the install. Destroy runs the
same graph backwards, which is what makes the host's wipe-then-revert order hold and what deletes
the templates (through ateapi) before the release is uninstalled. Target `existing` replaces
everything up to RuntimeSetup with ExistingCluster (the provider and reads of what the Substrate
install left) and runs no command at all: WorkerPool, ActorTemplates, Access and Observability
are the same components, given prebuilt images and no shell steps.

Components only wire resources. Each takes one frozen `*Args` object that holds exactly what it
reads: the scripts it runs, the objects it applies, the resources it waits for, and, where a
value exists only once an earlier step has run, a pure function from that step's result. The
host and cluster components are here; the install, runtime and pool in `substrate_components`;
the agent image, the templates, access and observability in `template_components`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from gym_substrate.stack import bundle, host, objects, scripts
from gym_substrate.stack.commands import Connection, CopyToHost
from gym_substrate.stack.config import StackConfig
from gym_substrate.stack.runner import Runner

__all__ = [
    "Access",
    "ActorTemplates",
    "AgentImage",
    "AgentImageArgs",
    "BorrowedHost",
    "ClusterArgs",
    "ExistingArgs",
    "ExistingCluster",
    "HostArgs",
    "InstallArgs",
    "KindCluster",
    "MicrovmSteps",
    "ObjectsArgs",
    "Observability",
    "PoolArgs",
    "RuntimeSetup",
    "RuntimeSetupArgs",
    "SubstrateInstall",
    "TemplatesArgs",
    "WorkerPool",
    "WorkloadTemplate",
    "borrowed_host",
]

_PKG = "gymsubstrate:index"
Obj = dict[str, Any]


@dataclass(frozen=True)
class HostArgs:
    """What BorrowedHost runs over `connection`: three steps up, two at destroy."""

    connection: Connection
    prep_root: str  # records the host once; prints where the record is
    revert_root: str  # prep-root's delete: puts back what the record holds
    install_tools: str
    sshd_priority: str
    wipe: str  # the wipe step's delete: cluster, registry and what Docker gained since the record
    # Offline installs: the local tool folder, the host folder it is copied into (install-tools
    # reads it there), and what re-copies it (its manifest's hash).
    tools_dir: str | None = None
    tools_remote_dir: str = ""
    tools_hash: str = ""

    @classmethod
    def from_config(cls, cfg: StackConfig, connection: Connection) -> HostArgs:
        offline = cfg.tools.offline_dir
        return cls(
            tools_dir=offline,
            tools_remote_dir=host.offline_remote_dir(cfg),
            tools_hash=bundle.manifest_hash(Path(offline)) if offline else "",
            connection=connection,
            prep_root=host.prep_root_script(cfg),
            revert_root=host.revert_root_script(cfg),
            install_tools=host.install_tools_script(cfg),
            sshd_priority=host.sshd_priority_script(cfg),
            wipe=host.wipe_script(cfg),
        )


class BorrowedHost(pulumi.ComponentResource):
    """prep-root (records the host; its delete is revert-root), install-tools, sshd-priority,
    and a wipe step whose delete removes cluster, registry, images and volumes first."""

    runner: Runner
    state_dir: pulumi.Output[str]

    def __init__(self, name: str, args: HostArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(f"{_PKG}:BorrowedHost", name, {}, opts)
        steps = Runner(connection=args.connection)
        self.prep_root = steps.run(
            "prep-root", args.prep_root, parent=self, delete=args.revert_root
        )
        before_tools: list[pulumi.Resource] = [self.prep_root]
        if args.tools_dir is not None:
            target = steps.run(
                "tools-dir",
                f"mkdir -p {args.tools_remote_dir}",
                parent=self,
                depends_on=[self.prep_root],
            )
            before_tools.append(
                CopyToHost(
                    "tools-bundle",
                    connection=args.connection,
                    source=args.tools_dir,
                    remote_dir=args.tools_remote_dir,
                    triggers=[args.tools_hash],
                    opts=pulumi.ResourceOptions(parent=self, depends_on=[target]),
                )
            )
        self.install_tools = steps.run(
            "install-tools", args.install_tools, parent=self, depends_on=before_tools
        )
        self.sshd_priority = steps.run(
            "sshd-priority", args.sshd_priority, parent=self, depends_on=[self.install_tools]
        )
        self.wipe = steps.run(
            "wipe",
            "echo armed",
            parent=self,
            delete=args.wipe,
            depends_on=[self.prep_root, self.install_tools, self.sshd_priority],
        )
        self.runner = Runner(connection=args.connection, after=(self.wipe,))
        self.state_dir = self.prep_root.stdout
        self.register_outputs({"stateDir": self.state_dir})


def borrowed_host(cfg: StackConfig, private_key: pulumi.Input[str]) -> BorrowedHost:
    """The host stack's BorrowedHost `host`, once an offline tool folder, if one is set, holds
    what install-tools needs (a ConfigError naming what is missing otherwise)."""
    assert cfg.host is not None
    if cfg.tools.offline_dir is not None:
        bundle.check_bundle(
            Path(cfg.tools.offline_dir), packages=host.packages(cfg), tools=cfg.tools.versions()
        )
    connection = Connection(
        host=cfg.host.address,
        user=cfg.host.user,
        port=cfg.host.port,
        private_key=private_key,
        host_key=cfg.host.host_key,
    )
    return BorrowedHost("host", HostArgs.from_config(cfg, connection))


@dataclass(frozen=True)
class ClusterArgs:
    """What KindCluster runs and applies."""

    runner: Runner
    create: str  # registry, kind cluster, node setup; its delete is `delete`
    delete: str
    kubeconfig: str  # prints the kubeconfig this machine reaches the cluster with
    context: str  # that kubeconfig's context
    registry_hosting: Obj  # the local-registry-hosting ConfigMap

    @classmethod
    def from_config(cls, cfg: StackConfig, runner: Runner) -> ClusterArgs:
        return cls(
            runner=runner,
            create=scripts.kind_create_script(cfg),
            delete=scripts.kind_delete_script(cfg),
            kubeconfig=scripts.kubeconfig_script(cfg),
            context=f"kind-{cfg.cluster.name}",
            registry_hosting=objects.local_registry_hosting(cfg),
        )


class KindCluster(pulumi.ComponentResource):
    """Registry, kind cluster with Substrate's feature gates, node setup, registry ConfigMap."""

    kubeconfig: pulumi.Output[str]
    provider: k8s.Provider

    def __init__(self, name: str, args: ClusterArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(f"{_PKG}:KindCluster", name, {}, opts)
        self.create = args.runner.run("kind-create", args.create, parent=self, delete=args.delete)
        read = args.runner.run(
            "kubeconfig",
            args.kubeconfig,
            parent=self,
            depends_on=[self.create],
            triggers=[self.create.stdout],
            secret_stdout=True,
        )
        self.kubeconfig = pulumi.Output.secret(read.stdout)
        self.provider = k8s.Provider(
            "kind",
            kubeconfig=self.kubeconfig,
            context=args.context,
            delete_unreachable=True,
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.registry_hosting = k8s.yaml.v2.ConfigGroup(
            "local-registry-hosting",
            objs=[args.registry_hosting],
            opts=pulumi.ResourceOptions(parent=self, provider=self.provider),
        )
        self.register_outputs({"kubeconfig": self.kubeconfig})


@dataclass(frozen=True)
class ExistingArgs:
    """What ExistingCluster connects with and reads: the cluster runs Substrate already."""

    kubeconfig: str  # the file's path: the provider reads it, so no credential enters the state
    context: str
    sandbox_config: str  # the SandboxConfig the pool and templates name, which the install made
    ca_bundle: str  # the ClusterTrustBundle whose PEM clients pin
    bundled_database: bool  # the install's in-cluster PostgreSQL (StatefulSet ate-system/postgres)

    @classmethod
    def from_config(cls, cfg: StackConfig, *, kubeconfig: str, context: str) -> ExistingArgs:
        assert cfg.existing is not None
        return cls(
            kubeconfig=kubeconfig,
            context=context,
            sandbox_config=cfg.sandbox_config_name,
            ca_bundle=cfg.existing.ca_bundle,
            bundled_database=cfg.existing.database.mode == "bundled",
        )


class ExistingCluster(pulumi.ComponentResource):
    """The Kubernetes provider for a cluster that already runs Substrate, and reads of what its
    install left that this stack needs (the `ate-system` namespace, the SandboxConfig, the CA,
    the bundled PostgreSQL when `existing.database.mode` says so): a missing one fails `preview`
    naming it, before anything is created."""

    provider: k8s.Provider
    ca_pem: pulumi.Output[str]

    def __init__(self, name: str, args: ExistingArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(f"{_PKG}:ExistingCluster", name, {}, opts)
        self.provider = k8s.Provider(
            "existing",
            kubeconfig=args.kubeconfig,
            context=args.context,
            # The Prometheus and Grafana ConfigMaps have fixed names their Deployments mount:
            # update them in place rather than delete and re-create them on every change.
            enable_config_map_mutable=True,
            opts=pulumi.ResourceOptions(parent=self),
        )
        read = pulumi.ResourceOptions(parent=self, provider=self.provider)
        self.namespace = k8s.core.v1.Namespace.get("ate-system", "ate-system", opts=read)
        self.sandbox_config = k8s.apiextensions.CustomResource.get(
            "sandbox-config", "ate.dev/v1alpha1", "SandboxConfig", args.sandbox_config, opts=read
        )
        if args.bundled_database:
            # cmd/ate-setup/internal/steps/postgres.go: the bundled database is StatefulSet
            # `postgres` in the install's namespace.
            k8s.apps.v1.StatefulSet.get("postgres", "ate-system/postgres", opts=read)
        # certificates.k8s.io/v1beta1, the version Substrate's pod-certificate controller writes.
        bundle = k8s.certificates.v1beta1.ClusterTrustBundle.get(
            "ca-bundle", args.ca_bundle, opts=read
        )
        self.ca_pem = bundle.spec.apply(lambda spec: str(spec.trust_bundle))
        self.register_outputs({"caPem": self.ca_pem})


# The other components, re-exported so the program imports them from one place.
from gym_substrate.stack.substrate_components import (  # noqa: E402
    InstallArgs,
    MicrovmSteps,
    PoolArgs,
    RuntimeSetup,
    RuntimeSetupArgs,
    SubstrateInstall,
    WorkerPool,
)
from gym_substrate.stack.template_components import (  # noqa: E402
    Access,
    ActorTemplates,
    AgentImage,
    AgentImageArgs,
    ObjectsArgs,
    Observability,
    TemplatesArgs,
    WorkloadTemplate,
)
