"""The stack's Pulumi components, in dependency order.

BorrowedHost (host stacks) -> KindCluster -> SubstrateInstall -> Runtime -> WorkerPool,
AgentImage -> ActorTemplates; Access and Observability hang off the install. Destroy runs the
same graph backwards, which is what makes the host's wipe-then-revert order hold.

Components only wire resources: every object and script comes from the Pulumi-free builders
beside this module (`objects`, `scripts`), which are tested without mocks. Each component takes
one frozen args object, parents every child to itself, uses the explicit Kubernetes provider it
is given, and ends with `register_outputs`.
"""

from __future__ import annotations

import datetime
import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
from pulumi_command import remote

from gym_substrate.stack import objects, scripts
from gym_substrate.stack.config import StackConfig, WorkloadConfig
from gym_substrate.stack.runner import Runner

__all__ = [
    "Access",
    "ActorTemplates",
    "AgentImage",
    "BorrowedHost",
    "KindCluster",
    "Observability",
    "Runtime",
    "SubstrateInstall",
    "WorkerPool",
]

_PKG = "gymsubstrate:index"


def _custom(
    name: str,
    obj: pulumi.Input[dict[str, Any]],
    opts: pulumi.ResourceOptions,
    api_version: str,
    kind: str,
) -> k8s.apiextensions.CustomResource:
    out = pulumi.Output.from_input(obj)
    return k8s.apiextensions.CustomResource(
        name,
        api_version=api_version,
        kind=kind,
        metadata=out.apply(lambda o: o["metadata"]),
        spec=out.apply(lambda o: o["spec"]),
        opts=opts,
    )


@dataclass(frozen=True)
class HostArgs:
    cfg: StackConfig
    connection: remote.ConnectionArgs


class BorrowedHost(pulumi.ComponentResource):
    """prep-root (records the host; its delete is revert-root), install-tools, sshd-priority,
    and a wipe step whose delete removes cluster, registry, images and volumes first."""

    runner: Runner
    state_dir: pulumi.Output[str]

    def __init__(self, name: str, args: HostArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(f"{_PKG}:BorrowedHost", name, {}, opts)
        cfg = args.cfg
        steps = Runner(connection=args.connection)
        self.prep_root = steps.run(
            "prep-root",
            scripts.host_prep_root_script(cfg),
            parent=self,
            delete=scripts.host_revert_root_script(cfg),
        )
        self.install_tools = steps.run(
            "install-tools",
            scripts.host_install_tools_script(cfg),
            parent=self,
            depends_on=[self.prep_root],
        )
        self.sshd_priority = steps.run(
            "sshd-priority",
            scripts.host_sshd_priority_script(cfg),
            parent=self,
            depends_on=[self.install_tools],
        )
        self.wipe = steps.run(
            "wipe",
            "echo armed",
            parent=self,
            delete=scripts.host_wipe_script(cfg),
            depends_on=[self.prep_root, self.install_tools, self.sshd_priority],
        )
        self.runner = Runner(connection=args.connection, after=(self.wipe,))
        self.state_dir = self.prep_root.stdout
        self.register_outputs({"stateDir": self.state_dir})


@dataclass(frozen=True)
class ClusterArgs:
    cfg: StackConfig
    runner: Runner


class KindCluster(pulumi.ComponentResource):
    """Registry, kind cluster with Substrate's feature gates, node setup, registry ConfigMap."""

    kubeconfig: pulumi.Output[str]
    provider: k8s.Provider

    def __init__(self, name: str, args: ClusterArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(f"{_PKG}:KindCluster", name, {}, opts)
        cfg = args.cfg
        self.create = args.runner.run(
            "kind-create",
            scripts.kind_create_script(cfg),
            parent=self,
            delete=scripts.kind_delete_script(cfg),
        )
        read = args.runner.run(
            "kubeconfig",
            scripts.kubeconfig_script(cfg),
            parent=self,
            depends_on=[self.create],
            triggers=[self.create.stdout],
            secret_stdout=True,
        )
        self.kubeconfig = pulumi.Output.secret(read.stdout)
        self.provider = k8s.Provider(
            "kind",
            kubeconfig=self.kubeconfig,
            context=f"kind-{cfg.cluster.name}",
            delete_unreachable=True,
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.registry_hosting = k8s.yaml.v2.ConfigGroup(
            "local-registry-hosting",
            objs=[objects.local_registry_hosting(cfg)],
            opts=pulumi.ResourceOptions(parent=self, provider=self.provider),
        )
        self.register_outputs({"kubeconfig": self.kubeconfig})


@dataclass(frozen=True)
class InstallArgs:
    cfg: StackConfig
    runner: Runner
    cluster: KindCluster


class SubstrateInstall(pulumi.ComponentResource):
    """Checkout + ko build, then the documented install order with every wait."""

    ateom_image: pulumi.Output[str]
    ca_pem: pulumi.Output[str]
    token_file: pulumi.Output[str] | None

    def __init__(self, name: str, args: InstallArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(f"{_PKG}:SubstrateInstall", name, {}, opts)
        cfg, run = args.cfg, args.runner
        s = cfg.substrate
        self.build = run.run(
            "build",
            scripts.substrate_build_script(cfg),
            parent=self,
            depends_on=[args.cluster],
            triggers=[s.commit, s.auth_mode, cfg.runtime],
        )
        self.install = run.run(
            "install",
            scripts.substrate_install_script(cfg),
            parent=self,
            delete=scripts.substrate_delete_script(cfg),
            depends_on=[self.build],
            triggers=[self.build.stdout],
        )
        ca = run.run("ca", scripts.substrate_ca_script(cfg), parent=self, depends_on=[self.install])
        self.ateom_image = self.build.stdout.apply(functools.partial(scripts.result_line, "build"))
        self.ca_pem = ca.stdout
        self.token_file = None
        self.client_token: pulumi.Output[str] | None = None
        if s.auth_mode == "jwt":
            # The token lives 24 h; the UTC date as a trigger makes the first `pulumi up` of
            # each day write a fresh one.
            token = run.run(
                "client-token",
                scripts.token_script(cfg),
                parent=self,
                depends_on=[self.install],
                triggers=[datetime.datetime.now(datetime.UTC).date().isoformat()],
            )
            self.token_file = token.stdout.apply(
                functools.partial(scripts.result_line, "client-token")
            )
            if run.remote:
                value = run.run(
                    "client-token-value",
                    scripts.token_value_script(cfg),
                    parent=self,
                    depends_on=[token],
                    triggers=[token.id],
                    secret_stdout=True,
                )
                self.client_token = pulumi.Output.secret(value.stdout.apply(str.strip))
        self.register_outputs({"ateomImage": self.ateom_image, "caPem": self.ca_pem})


@dataclass(frozen=True)
class RuntimeArgs:
    cfg: StackConfig
    runner: Runner
    provider: k8s.Provider
    install: SubstrateInstall


class Runtime(pulumi.ComponentResource):
    """gVisor: SandboxConfig `gvisor-default`. microVM: KVM check + node label, kata assets
    staged to the bucket, SandboxConfig `microvm` pinned to their sha256."""

    def __init__(self, name: str, args: RuntimeArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(f"{_PKG}:Runtime", name, {}, opts)
        cfg = args.cfg
        k8s_opts = pulumi.ResourceOptions(
            parent=self, provider=args.provider, depends_on=[args.install]
        )
        if cfg.runtime == "gvisor":
            obj: pulumi.Input[dict[str, Any]] = objects.sandbox_config(cfg)
        else:
            label = args.runner.run(
                "kvm-node-label",
                scripts.node_label_script(cfg),
                parent=self,
                depends_on=[args.install],
            )
            assets = args.runner.run(
                "microvm-assets",
                scripts.microvm_assets_script(cfg),
                parent=self,
                depends_on=[label],
            )
            obj = assets.stdout.apply(
                lambda out: objects.sandbox_config(
                    cfg,
                    asset_sha256=scripts.result_json(
                        "microvm-assets", out, keys=("arch", *objects.MICROVM_ASSET_FILES)
                    ),
                )
            )
            k8s_opts = pulumi.ResourceOptions.merge(
                k8s_opts, pulumi.ResourceOptions(depends_on=[assets])
            )
        self.sandbox_config = _custom(
            "sandbox-config", obj, k8s_opts, "ate.dev/v1alpha1", "SandboxConfig"
        )
        self.register_outputs({})


@dataclass(frozen=True)
class PoolArgs:
    cfg: StackConfig
    runner: Runner
    provider: k8s.Provider
    ateom_image: pulumi.Input[str]
    runtime: Runtime


class WorkerPool(pulumi.ComponentResource):
    """Namespace, the WorkerPool from manifests/, and a wait for its worker Deployment."""

    ready: pulumi.Resource

    def __init__(self, name: str, args: PoolArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(f"{_PKG}:WorkerPool", name, {}, opts)
        cfg = args.cfg
        k8s_opts = pulumi.ResourceOptions(parent=self, provider=args.provider)
        self.namespace = k8s.yaml.v2.ConfigGroup(
            "namespace",
            objs=[objects.pool_namespace(cfg)],
            opts=pulumi.ResourceOptions.merge(
                k8s_opts, pulumi.ResourceOptions(depends_on=[args.runtime])
            ),
        )
        pool = pulumi.Output.from_input(args.ateom_image).apply(
            lambda image: objects.worker_pool(cfg, image)
        )
        self.pool = _custom(
            "worker-pool",
            pool,
            pulumi.ResourceOptions.merge(
                k8s_opts, pulumi.ResourceOptions(depends_on=[self.namespace, args.runtime])
            ),
            "ate.dev/v1alpha1",
            "WorkerPool",
        )
        self.ready = args.runner.run(
            "pool-ready",
            scripts.pool_wait_script(cfg),
            parent=self,
            depends_on=[self.pool],
            triggers=[pool.apply(lambda p: json.dumps(p))],
        )
        self.register_outputs({})


@dataclass(frozen=True)
class AgentImageArgs:
    cfg: StackConfig
    runner: Runner
    repo_root: Path
    cluster: KindCluster


class AgentImage(pulumi.ComponentResource):
    """The `FROM scratch` sandbox-agent image (agent/build/), pushed to the kind registry."""

    image: pulumi.Output[str]

    def __init__(self, name: str, args: AgentImageArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(f"{_PKG}:AgentImage", name, {}, opts)
        cfg = args.cfg
        source_hash = scripts.tree_hash(str(args.repo_root))
        depends: list[pulumi.Resource] = [args.cluster]
        src = str(args.repo_root)
        if args.runner.connection is not None:
            src = f"/var/tmp/gym-substrate-{cfg.cluster.name}/src"
            target = args.runner.run(
                "agent-source-dir", f"mkdir -p {src}", parent=self, depends_on=[args.cluster]
            )
            copy = remote.CopyToRemote(
                "agent-source",
                connection=args.runner.connection,
                source=pulumi.FileArchive(str(args.repo_root / "agent")),
                # An existing directory: the local `agent/` lands inside it as `<src>/agent`.
                remote_path=src,
                triggers=[source_hash],
                opts=pulumi.ResourceOptions(parent=self, depends_on=[target]),
            )
            # build-static.sh reads aiohttp's pinned version from the lock file.
            lock = remote.CopyToRemote(
                "agent-lockfile",
                connection=args.runner.connection,
                source=pulumi.FileAsset(str(args.repo_root / "uv.lock")),
                remote_path=src,
                triggers=[source_hash],
                opts=pulumi.ResourceOptions(parent=self, depends_on=[target]),
            )
            depends.extend([copy, lock])
        build = args.runner.run(
            "agent-image",
            scripts.agent_image_script(cfg, src, source_hash),
            parent=self,
            depends_on=depends,
            triggers=[source_hash],
        )
        self.image = build.stdout.apply(functools.partial(scripts.result_line, "agent-image"))
        self.register_outputs({"image": self.image})


@dataclass(frozen=True)
class TemplatesArgs:
    cfg: StackConfig
    runner: Runner
    provider: k8s.Provider
    agent_image: pulumi.Output[str]
    pool: WorkerPool
    install: SubstrateInstall
    agent: AgentImage
    cluster_ready: pulumi.Resource


class ActorTemplates(pulumi.ComponentResource):
    """Per workload: digest-pinned image, a content-hashed ActorTemplate, a Ready wait."""

    names: pulumi.Output[dict[str, str]]

    def __init__(self, name: str, args: TemplatesArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(f"{_PKG}:ActorTemplates", name, {}, opts)
        cfg = args.cfg
        refs: dict[str, pulumi.Output[str]] = {}
        for wl in cfg.workloads:
            if cfg.agent.mount == "derived-image":
                script: pulumi.Input[str] = args.agent_image.apply(
                    functools.partial(_derived_script, cfg, wl)
                )
                image_step = args.runner.run(
                    f"image-{wl.name}", script, parent=self, depends_on=[args.agent]
                )
            else:
                image_step = args.runner.run(
                    f"image-{wl.name}",
                    scripts.pinned_workload_script(wl.image),
                    parent=self,
                    depends_on=[args.cluster_ready],
                )
            template = pulumi.Output.all(image_step.stdout, args.agent_image).apply(
                functools.partial(_template_for, cfg, wl)
            )
            resource = _custom(
                f"template-{wl.name}",
                template,
                pulumi.ResourceOptions(
                    parent=self,
                    provider=args.provider,
                    depends_on=[args.pool.ready, args.install, args.agent],
                ),
                "ate.dev/v1alpha1",
                "ActorTemplate",
            )
            tname = template.apply(lambda t: str(t["metadata"]["name"]))
            args.runner.run(
                f"ready-{wl.name}",
                tname.apply(lambda n: scripts.template_wait_script(cfg, n)),
                parent=self,
                depends_on=[resource],
            )
            refs[wl.image] = tname.apply(lambda n: f"{cfg.pool.namespace}/{n}")
        self.names = pulumi.Output.all(**refs)
        self.register_outputs({"templates": self.names})


def _derived_script(cfg: StackConfig, wl: WorkloadConfig, agent_image: str) -> str:
    return scripts.derived_image_script(cfg, wl.name, wl.image, agent_image)


def _template_for(cfg: StackConfig, wl: WorkloadConfig, values: list[str]) -> dict[str, Any]:
    stdout, agent_image = values
    step = f"image-{wl.name}"
    if cfg.agent.mount == "derived-image":
        image = scripts.result_json(step, stdout, keys=("image",))["image"]
        return objects.actor_template(cfg, wl, image=image)
    image = scripts.result_line(step, stdout)
    return objects.actor_template(cfg, wl, image=image, agent_image=agent_image)


@dataclass(frozen=True)
class AccessArgs:
    cfg: StackConfig
    provider: k8s.Provider
    install: SubstrateInstall


class Access(pulumi.ComponentResource):
    """NodePort Services for the API (443) and the router (80) on the configured nodePorts."""

    def __init__(self, name: str, args: AccessArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(f"{_PKG}:Access", name, {}, opts)
        self.services = k8s.yaml.v2.ConfigGroup(
            "nodeports",
            objs=objects.nodeport_services(args.cfg),
            opts=pulumi.ResourceOptions(
                parent=self, provider=args.provider, depends_on=[args.install]
            ),
        )
        self.register_outputs({})


@dataclass(frozen=True)
class ObservabilityArgs:
    cfg: StackConfig
    provider: k8s.Provider
    install: SubstrateInstall


class Observability(pulumi.ComponentResource):
    """Prometheus (Substrate's pods + the provider) and Grafana with the lifecycle dashboard."""

    def __init__(
        self, name: str, args: ObservabilityArgs, opts: pulumi.ResourceOptions | None = None
    ):
        super().__init__(f"{_PKG}:Observability", name, {}, opts)
        self.objects = k8s.yaml.v2.ConfigGroup(
            "prometheus-grafana",
            objs=objects.observability_objects(args.cfg),
            opts=pulumi.ResourceOptions(
                parent=self, provider=args.provider, depends_on=[args.install]
            ),
        )
        self.register_outputs({})
