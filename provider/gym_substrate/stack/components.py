"""The stack's Pulumi components, in dependency order.

BorrowedHost (host stacks) -> KindCluster -> SubstrateInstall -> RuntimeSetup -> WorkerPool,
AgentImage -> ActorTemplates; Access and Observability hang off the install. Destroy runs the
same graph backwards, which is what makes the host's wipe-then-revert order hold. Target
`existing` replaces everything up to RuntimeSetup with ExistingCluster (the provider and reads of
what the Substrate install left) and runs no command at all: WorkerPool, ActorTemplates, Access
and Observability are the same components, given prebuilt images and no shell steps.

Components only wire resources. Each takes one frozen `*Args` object that holds exactly what it
reads: the scripts it runs, the objects it applies, the resources it waits for, and, where a
value exists only once an earlier step has run, a pure function from that step's result (for
example the ActorTemplate from what the image step printed). `*Args.from_config` builds them
from the validated `StackConfig` with the Pulumi-free builders beside this module (`objects`,
`scripts`, `host`), which are tested without mocks; ObjectsArgs and TemplatesArgs, whose config
part is one builder call, are built in `infra/__main__.py`. Every child is parented to its
component and uses the explicit Kubernetes provider it is given; each component ends with
`register_outputs`.
"""

from __future__ import annotations

import datetime
import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pulumi
import pulumi_kubernetes as k8s

from gym_substrate.stack import bundle, host, objects, scripts
from gym_substrate.stack.commands import Connection, CopyToHost
from gym_substrate.stack.config import StackConfig, WorkloadConfig
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


def _custom(
    name: str,
    obj: pulumi.Input[Obj],
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
    sandbox_config: str  # the SandboxConfig the pool names, which the install must have made
    ca_bundle: str  # the ClusterTrustBundle whose PEM clients pin

    @classmethod
    def from_config(cls, cfg: StackConfig, *, kubeconfig: str, context: str) -> ExistingArgs:
        return cls(
            kubeconfig=kubeconfig,
            context=context,
            sandbox_config=cfg.sandbox_config_name,
            ca_bundle=objects.CA_BUNDLE,
        )


class ExistingCluster(pulumi.ComponentResource):
    """The Kubernetes provider for a cluster that already runs Substrate, and reads of what its
    install left that this stack needs (the `ate-system` namespace, the SandboxConfig, the CA):
    a missing one fails `preview` naming it, before anything is created."""

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
        # certificates.k8s.io/v1beta1, the version Substrate's pod-certificate controller writes.
        bundle = k8s.certificates.v1beta1.ClusterTrustBundle.get(
            "ca-bundle", args.ca_bundle, opts=read
        )
        self.ca_pem = bundle.spec.apply(lambda spec: str(spec.trust_bundle))
        self.register_outputs({"caPem": self.ca_pem})


@dataclass(frozen=True)
class InstallArgs:
    """What SubstrateInstall runs, after `cluster`."""

    runner: Runner
    cluster: pulumi.Resource
    build: str  # checkout, `ko resolve` of the overlay; prints the ateom image
    build_triggers: tuple[str, ...]  # what rebuilds: the commit, the auth mode, the runtime
    install: str  # the documented install order with every wait; its delete is `uninstall`
    uninstall: str
    ca: str  # prints the CA PEM clients pin
    token: str | None = None  # jwt: writes the client token file; prints its path
    token_value: str | None = None  # jwt on a borrowed host: prints the token (a secret)

    @classmethod
    def from_config(
        cls, cfg: StackConfig, runner: Runner, *, cluster: pulumi.Resource
    ) -> InstallArgs:
        s = cfg.substrate
        jwt = s.auth_mode == "jwt"
        return cls(
            runner=runner,
            cluster=cluster,
            build=scripts.substrate_build_script(cfg),
            build_triggers=(s.commit, s.auth_mode, cfg.runtime),
            install=scripts.substrate_install_script(cfg),
            uninstall=scripts.substrate_delete_script(cfg),
            ca=scripts.substrate_ca_script(cfg),
            token=scripts.token_script(cfg) if jwt else None,
            token_value=scripts.token_value_script(cfg) if jwt and runner.remote else None,
        )


class SubstrateInstall(pulumi.ComponentResource):
    """Checkout + ko build, then the documented install order with every wait."""

    ateom_image: pulumi.Output[str]
    ca_pem: pulumi.Output[str]
    # jwt mode: where the client token file is on this machine (kind stacks), or the token
    # itself as a secret (host stacks, where the file is on the host).
    token_file: pulumi.Output[str] | None
    client_token: pulumi.Output[str] | None

    def __init__(self, name: str, args: InstallArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(f"{_PKG}:SubstrateInstall", name, {}, opts)
        run = args.runner
        self.build = run.run(
            "build",
            args.build,
            parent=self,
            depends_on=[args.cluster],
            triggers=list(args.build_triggers),
        )
        self.install = run.run(
            "install",
            args.install,
            parent=self,
            delete=args.uninstall,
            depends_on=[self.build],
            triggers=[self.build.stdout],
        )
        ca = run.run("ca", args.ca, parent=self, depends_on=[self.install])
        self.ateom_image = self.build.stdout.apply(functools.partial(scripts.result_line, "build"))
        self.ca_pem = ca.stdout
        self.token_file = None
        self.client_token = None
        if args.token is not None:
            # The token lives 24 h; the UTC date as a trigger makes the first `pulumi up` of
            # each day write a fresh one.
            token = run.run(
                "client-token",
                args.token,
                parent=self,
                depends_on=[self.install],
                triggers=[datetime.datetime.now(datetime.UTC).date().isoformat()],
            )
            if args.token_value is None:
                self.token_file = token.stdout.apply(
                    functools.partial(scripts.result_line, "client-token")
                )
            else:
                value = run.run(
                    "client-token-value",
                    args.token_value,
                    parent=self,
                    depends_on=[token],
                    triggers=[token.id],
                    secret_stdout=True,
                )
                # Not result_line: its error would print the token.
                self.client_token = pulumi.Output.secret(value.stdout.apply(str.strip))
        self.register_outputs({"ateomImage": self.ateom_image, "caPem": self.ca_pem})


@dataclass(frozen=True)
class MicrovmSteps:
    """microVM: the steps the SandboxConfig comes out of."""

    node_label: str  # checks /dev/kvm on every node and labels them for microVM pools
    stage_assets: str  # stages the kata assets in the bucket; prints their sha256 as JSON
    sandbox_config: Callable[[str], Obj]  # the SandboxConfig, from what stage_assets printed


@dataclass(frozen=True)
class RuntimeSetupArgs:
    """What RuntimeSetup applies once Substrate is installed: a SandboxConfig, as is (gVisor)
    or from the steps that stage its assets (microVM)."""

    runner: Runner
    provider: k8s.Provider
    install: pulumi.Resource
    sandbox_config: Obj | MicrovmSteps

    @classmethod
    def from_config(
        cls, cfg: StackConfig, runner: Runner, *, provider: k8s.Provider, install: pulumi.Resource
    ) -> RuntimeSetupArgs:
        config: Obj | MicrovmSteps
        if cfg.runtime == "microvm":
            config = MicrovmSteps(
                node_label=scripts.node_label_script(cfg),
                stage_assets=scripts.microvm_assets_script(cfg),
                sandbox_config=functools.partial(_staged_sandbox_config, cfg),
            )
        else:
            config = objects.sandbox_config(cfg)
        return cls(runner=runner, provider=provider, install=install, sandbox_config=config)


def _staged_sandbox_config(cfg: StackConfig, stdout: str) -> Obj:
    keys = ("arch", *objects.MICROVM_ASSET_FILES)
    sums = scripts.result_json("microvm-assets", stdout, keys=keys)
    return objects.sandbox_config(cfg, asset_sha256=sums)


class RuntimeSetup(pulumi.ComponentResource):
    """gVisor: SandboxConfig `gvisor-default`. microVM: KVM check + node label, kata assets
    staged to the bucket, SandboxConfig `microvm` pinned to their checksums."""

    def __init__(
        self, name: str, args: RuntimeSetupArgs, opts: pulumi.ResourceOptions | None = None
    ):
        # The type token keeps the component's old name, Runtime: it is part of the URN of the
        # component and of every child, so renaming it would make Pulumi replace them.
        super().__init__(f"{_PKG}:Runtime", name, {}, opts)
        k8s_opts = pulumi.ResourceOptions(
            parent=self, provider=args.provider, depends_on=[args.install]
        )
        obj: pulumi.Input[Obj]
        if isinstance(args.sandbox_config, MicrovmSteps):
            steps = args.sandbox_config
            label = args.runner.run(
                "kvm-node-label", steps.node_label, parent=self, depends_on=[args.install]
            )
            assets = args.runner.run(
                "microvm-assets", steps.stage_assets, parent=self, depends_on=[label]
            )
            obj = assets.stdout.apply(steps.sandbox_config)
            k8s_opts = pulumi.ResourceOptions.merge(
                k8s_opts, pulumi.ResourceOptions(depends_on=[assets])
            )
        else:
            obj = args.sandbox_config
        self.sandbox_config = _custom(
            "sandbox-config", obj, k8s_opts, "ate.dev/v1alpha1", "SandboxConfig"
        )
        self.register_outputs({})


@dataclass(frozen=True)
class PoolArgs:
    """What WorkerPool applies once the SandboxConfig it names (`runtime`) exists."""

    runner: Runner | None
    provider: k8s.Provider
    runtime: pulumi.Resource
    ateom_image: pulumi.Input[str]
    namespace: Obj
    worker_pool: Callable[[str], Obj]  # the WorkerPool, given the ateom image
    # Waits for the pool's worker Deployment. None (target `existing`, which runs no command):
    # the templates' Ready wait covers it, since a golden snapshot needs a running worker.
    wait: str | None

    @classmethod
    def from_config(
        cls,
        cfg: StackConfig,
        runner: Runner | None,
        *,
        provider: k8s.Provider,
        runtime: pulumi.Resource,
        ateom_image: pulumi.Input[str],
    ) -> PoolArgs:
        return cls(
            runner=runner,
            provider=provider,
            runtime=runtime,
            ateom_image=ateom_image,
            namespace=objects.pool_namespace(cfg),
            worker_pool=functools.partial(objects.worker_pool, cfg),
            wait=scripts.pool_wait_script(cfg) if runner is not None else None,
        )


class WorkerPool(pulumi.ComponentResource):
    """Namespace, the WorkerPool from manifests/, and a wait for its worker Deployment."""

    ready: pulumi.Resource

    def __init__(self, name: str, args: PoolArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(f"{_PKG}:WorkerPool", name, {}, opts)
        k8s_opts = pulumi.ResourceOptions(parent=self, provider=args.provider)
        self.namespace = k8s.yaml.v2.ConfigGroup(
            "namespace",
            objs=[args.namespace],
            opts=pulumi.ResourceOptions.merge(
                k8s_opts, pulumi.ResourceOptions(depends_on=[args.runtime])
            ),
        )
        pool = pulumi.Output.from_input(args.ateom_image).apply(args.worker_pool)
        self.pool = _custom(
            "worker-pool",
            pool,
            pulumi.ResourceOptions.merge(
                k8s_opts, pulumi.ResourceOptions(depends_on=[self.namespace, args.runtime])
            ),
            "ate.dev/v1alpha1",
            "WorkerPool",
        )
        self.ready = self.pool
        if args.runner is not None and args.wait is not None:
            self.ready = args.runner.run(
                "pool-ready",
                args.wait,
                parent=self,
                depends_on=[self.pool],
                triggers=[pool.apply(lambda p: json.dumps(p))],
            )
        self.register_outputs({})


@dataclass(frozen=True)
class AgentImageArgs:
    """What AgentImage builds, once the cluster (and its registry) exists."""

    runner: Runner
    cluster: pulumi.Resource
    repo_root: Path  # on a host, `agent/` and `uv.lock` are copied from here to `build_dir`
    build_dir: str  # where the build runs: `repo_root` here, its copy on a host
    source_hash: str  # of `agent/` and `uv.lock`: the image tag, so a change rebuilds
    build: str  # builds and pushes the image; prints it by digest

    @classmethod
    def from_config(
        cls, cfg: StackConfig, runner: Runner, *, repo_root: Path, cluster: pulumi.Resource
    ) -> AgentImageArgs:
        source_hash = scripts.tree_hash(str(repo_root))
        build_dir = f"{scripts.Paths(cfg).scratch}/src" if runner.remote else str(repo_root)
        return cls(
            runner=runner,
            cluster=cluster,
            repo_root=repo_root,
            build_dir=build_dir,
            source_hash=source_hash,
            build=scripts.agent_image_script(cfg, build_dir, source_hash),
        )


class AgentImage(pulumi.ComponentResource):
    """The `FROM scratch` sandbox-agent image (agent/build/), pushed to the kind registry."""

    image: pulumi.Output[str]

    def __init__(self, name: str, args: AgentImageArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(f"{_PKG}:AgentImage", name, {}, opts)
        depends: list[pulumi.Resource] = [args.cluster]
        if args.runner.connection is not None:
            target = args.runner.run(
                "agent-source-dir",
                f"mkdir -p {args.build_dir}",
                parent=self,
                depends_on=[args.cluster],
            )
            sources = {
                # Into an existing directory: the local `agent/` lands in it as `<dir>/agent`.
                "agent-source": args.repo_root / "agent",
                # build-static.sh reads aiohttp's pinned version from the lock file.
                "agent-lockfile": args.repo_root / "uv.lock",
            }
            for step, source in sources.items():
                copy = CopyToHost(
                    step,
                    connection=args.runner.connection,
                    source=str(source),
                    remote_dir=args.build_dir,
                    triggers=[args.source_hash],
                    opts=pulumi.ResourceOptions(parent=self, depends_on=[target]),
                )
                depends.append(copy)
        build = args.runner.run(
            "agent-image",
            args.build,
            parent=self,
            depends_on=depends,
            triggers=[args.source_hash],
        )
        self.image = build.stdout.apply(functools.partial(scripts.result_line, "agent-image"))
        self.register_outputs({"image": self.image})


@dataclass(frozen=True)
class WorkloadTemplate:
    """One workload's steps: pin its image, apply its ActorTemplate, wait for it to be Ready."""

    name: str  # names the steps: image-<name>, template-<name>, ready-<name>
    image: str  # the configured image: its key in ActorTemplates.names
    # The image step's script: derived-image mode builds on the agent image, so there it is a
    # function of that image; image-volume mode only pins the workload.
    pin: str | Callable[[str], str]
    template: Callable[[str, str], Obj]  # from what the image step printed and the agent image
    wait: Callable[[str], str]  # the Ready wait, given the template's name
    # Target `existing`: the whole template from pinned images, awaited Ready by the provider
    # (pin, template and wait are then unused).
    prebuilt: Obj | None = None

    @classmethod
    def from_config(cls, cfg: StackConfig, wl: WorkloadConfig) -> WorkloadTemplate:
        pin: str | Callable[[str], str]
        if cfg.agent.mount == "derived-image":
            pin = functools.partial(scripts.derived_image_script, cfg, wl.name, wl.image)
        else:
            pin = scripts.pinned_workload_script(wl.image)
        return cls(
            name=wl.name,
            image=wl.image,
            pin=pin,
            template=functools.partial(_template_for, cfg, wl),
            wait=functools.partial(scripts.template_wait_script, cfg),
            prebuilt=objects.prebuilt_actor_template(cfg, wl) if cfg.existing else None,
        )


def _template_for(cfg: StackConfig, wl: WorkloadConfig, stdout: str, agent_image: str) -> Obj:
    step = f"image-{wl.name}"
    if cfg.agent.mount == "derived-image":
        image = scripts.result_json(step, stdout, keys=("image",))["image"]
        return objects.actor_template(cfg, wl, image=image)
    image = scripts.result_line(step, stdout)
    return objects.actor_template(cfg, wl, image=image, agent_image=agent_image)


@dataclass(frozen=True)
class TemplatesArgs:
    """What ActorTemplates applies, once the pool is ready and the agent image is built."""

    runner: Runner | None  # None with prebuilt templates only (target `existing`)
    provider: k8s.Provider
    agent: AgentImage | None  # None with prebuilt templates only
    pool_ready: pulumi.Resource
    install: pulumi.Resource
    cluster: pulumi.Resource  # image-volume mode pins workloads as soon as the cluster is up
    namespace: str  # the templates' namespace (the pool's)
    workloads: tuple[WorkloadTemplate, ...]


def _spread(fn: Callable[..., Obj], values: list[Any]) -> Obj:
    return fn(*values)


class ActorTemplates(pulumi.ComponentResource):
    """Per workload: digest-pinned image, a content-hashed ActorTemplate, a Ready wait."""

    names: pulumi.Output[dict[str, str]]

    def __init__(self, name: str, args: TemplatesArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(f"{_PKG}:ActorTemplates", name, {}, opts)
        refs: dict[str, pulumi.Output[str]] = {}
        for wl in args.workloads:
            depends: list[pulumi.Resource] = [args.pool_ready, args.install]
            template: pulumi.Output[Obj]
            if wl.prebuilt is not None:
                template = pulumi.Output.from_input(wl.prebuilt)
            else:
                if args.runner is None or args.agent is None:
                    raise ValueError(f"workload {wl.name!r}: building its image needs a runner")
                if isinstance(wl.pin, str):
                    image_step = args.runner.run(
                        f"image-{wl.name}", wl.pin, parent=self, depends_on=[args.cluster]
                    )
                else:
                    image_step = args.runner.run(
                        f"image-{wl.name}",
                        args.agent.image.apply(wl.pin),
                        parent=self,
                        depends_on=[args.agent],
                    )
                template = pulumi.Output.all(image_step.stdout, args.agent.image).apply(
                    functools.partial(_spread, wl.template)
                )
                depends.append(args.agent)
            resource = _custom(
                f"template-{wl.name}",
                template,
                pulumi.ResourceOptions(parent=self, provider=args.provider, depends_on=depends),
                "ate.dev/v1alpha1",
                "ActorTemplate",
            )
            tname = template.apply(lambda t: str(t["metadata"]["name"]))
            if wl.prebuilt is None and args.runner is not None:
                args.runner.run(
                    f"ready-{wl.name}", tname.apply(wl.wait), parent=self, depends_on=[resource]
                )
            refs[wl.image] = tname.apply(lambda n: f"{args.namespace}/{n}")
        self.names = pulumi.Output.all(**refs)
        self.register_outputs({"templates": self.names})


@dataclass(frozen=True)
class ObjectsArgs:
    """What Access and Observability read: the objects they apply once Substrate is installed."""

    provider: k8s.Provider
    install: pulumi.Resource
    objs: tuple[Obj, ...]


class _AfterInstall(pulumi.ComponentResource):
    """Applies `args.objs` as one ConfigGroup, named `group`, once Substrate is installed."""

    type_name: ClassVar[str]
    group: ClassVar[str]

    def __init__(self, name: str, args: ObjectsArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(f"{_PKG}:{self.type_name}", name, {}, opts)
        self.objects = k8s.yaml.v2.ConfigGroup(
            self.group,
            objs=list(args.objs),
            opts=pulumi.ResourceOptions(
                parent=self, provider=args.provider, depends_on=[args.install]
            ),
        )
        self.register_outputs({})


class Access(_AfterInstall):
    """NodePort Services for the API (443) and the router (80) on the configured nodePorts."""

    type_name, group = "Access", "nodeports"


class Observability(_AfterInstall):
    """Prometheus (Substrate's pods + the provider) and Grafana with the lifecycle dashboard."""

    type_name, group = "Observability", "prometheus-grafana"
