"""Pulumi components: the Substrate release's install, the runtime's SandboxConfig, the pool.

SubstrateInstall runs the release's own installer (`install_scripts`): the source tree at the
release tag, `ate-setup deploy ate-system` from a SubstrateInstall document (its delete is
`ate-setup delete ate-system`), the pinned worker image, the CA clients pin and, in jwt mode,
a client token. RuntimeSetup adds what the release does not install for the runtime: nothing for
gVisor (the installer applies `gvisor-default`), the kata assets and the `microvm`
SandboxConfig for microVMs. WorkerPool applies the namespace and the WorkerPool, and on kind and
host stacks waits until its workers are ready.
"""

from __future__ import annotations

import datetime
import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from gym_substrate.stack import install_scripts, objects, scripts
from gym_substrate.stack.config import StackConfig
from gym_substrate.stack.runner import Runner

__all__ = [
    "InstallArgs",
    "MicrovmSteps",
    "PoolArgs",
    "RuntimeSetup",
    "RuntimeSetupArgs",
    "SubstrateInstall",
    "WorkerPool",
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
class InstallArgs:
    """What SubstrateInstall runs, after `cluster`."""

    runner: Runner
    cluster: pulumi.Resource
    source: str  # the release's source tree at the tag (or commit); prints its path
    source_triggers: tuple[str, ...]  # what re-fetches it: the checkout and where it comes from
    install: str  # writes the SubstrateInstall document, runs `deploy ate-system`
    uninstall: str  # `delete ate-system`: the install step's delete
    worker_image: str  # prints the worker image, tag@digest (or a ko build's ref)
    ca: str  # prints the CA PEM clients pin
    token: str | None = None  # jwt: writes the client token file; prints its path
    token_value: str | None = None  # jwt on a borrowed host: prints the token (a secret)

    @classmethod
    def from_config(
        cls, cfg: StackConfig, runner: Runner, *, cluster: pulumi.Resource
    ) -> InstallArgs:
        s = cfg.substrate
        jwt = s.auth_mode == "jwt"
        repo = s.source.repo if s.source else s.repo
        return cls(
            runner=runner,
            cluster=cluster,
            source=install_scripts.source_script(cfg),
            source_triggers=(s.checkout, repo),
            install=install_scripts.install_script(cfg),
            uninstall=install_scripts.uninstall_script(cfg),
            worker_image=install_scripts.worker_image_script(cfg),
            ca=install_scripts.ca_script(cfg),
            token=install_scripts.token_script(cfg) if jwt else None,
            token_value=install_scripts.token_value_script(cfg) if jwt and runner.remote else None,
        )


class SubstrateInstall(pulumi.ComponentResource):
    """The release's source tree, its installer (and uninstaller), its worker image, the CA."""

    worker_image: pulumi.Output[str]
    ca_pem: pulumi.Output[str]
    # jwt mode: where the client token file is on this machine (kind stacks), or the token
    # itself as a secret (host stacks, where the file is on the host).
    token_file: pulumi.Output[str] | None
    client_token: pulumi.Output[str] | None

    def __init__(self, name: str, args: InstallArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(f"{_PKG}:SubstrateInstall", name, {}, opts)
        run = args.runner
        self.source = run.run(
            "substrate-source",
            args.source,
            parent=self,
            depends_on=[args.cluster],
            triggers=list(args.source_triggers),
        )
        self.install = run.run(
            "install",
            args.install,
            parent=self,
            delete=args.uninstall,
            depends_on=[self.source],
            triggers=[self.source.stdout],
        )
        worker = run.run(
            "worker-image",
            args.worker_image,
            parent=self,
            depends_on=[self.install],
            triggers=[self.source.stdout],
        )
        ca = run.run("ca", args.ca, parent=self, depends_on=[self.install])
        self.worker_image = worker.stdout.apply(
            functools.partial(scripts.result_line, "worker-image")
        )
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
        self.register_outputs({"workerImage": self.worker_image, "caPem": self.ca_pem})


@dataclass(frozen=True)
class MicrovmSteps:
    """microVM: the steps the SandboxConfig comes out of."""

    node_label: str  # checks /dev/kvm on every node and labels them for microVM pools
    stage_assets: str  # stages the kata assets in the bucket; prints their sha256 as JSON
    sandbox_config: Callable[[str], Obj]  # the SandboxConfig, from what stage_assets printed


@dataclass(frozen=True)
class RuntimeSetupArgs:
    """What RuntimeSetup adds once Substrate is installed: nothing for gVisor (the release's
    installer applies `gvisor-default`), the staged kata assets' SandboxConfig for microVM."""

    runner: Runner
    provider: k8s.Provider
    install: pulumi.Resource
    microvm: MicrovmSteps | None

    @classmethod
    def from_config(
        cls, cfg: StackConfig, runner: Runner, *, provider: k8s.Provider, install: pulumi.Resource
    ) -> RuntimeSetupArgs:
        steps = None
        if cfg.runtime == "microvm":
            steps = MicrovmSteps(
                node_label=install_scripts.node_label_script(cfg),
                stage_assets=install_scripts.microvm_assets_script(cfg),
                sandbox_config=functools.partial(_staged_sandbox_config, cfg),
            )
        return cls(runner=runner, provider=provider, install=install, microvm=steps)


def _staged_sandbox_config(cfg: StackConfig, stdout: str) -> Obj:
    keys = ("arch", *objects.MICROVM_ASSET_FILES)
    sums = scripts.result_json("microvm-assets", stdout, keys=keys)
    return objects.sandbox_config(cfg, asset_sha256=sums)


class RuntimeSetup(pulumi.ComponentResource):
    """microVM: KVM check + node label, kata assets staged to the bucket, SandboxConfig
    `microvm` pinned to their checksums. gVisor: nothing of its own."""

    def __init__(
        self, name: str, args: RuntimeSetupArgs, opts: pulumi.ResourceOptions | None = None
    ):
        # The type token keeps the component's old name, Runtime: it is part of the URN of the
        # component and of every child, so renaming it would make Pulumi replace them.
        super().__init__(f"{_PKG}:Runtime", name, {}, opts)
        if args.microvm is not None:
            steps = args.microvm
            label = args.runner.run(
                "kvm-node-label", steps.node_label, parent=self, depends_on=[args.install]
            )
            assets = args.runner.run(
                "microvm-assets", steps.stage_assets, parent=self, depends_on=[label]
            )
            self.sandbox_config = _custom(
                "sandbox-config",
                assets.stdout.apply(steps.sandbox_config),
                pulumi.ResourceOptions(
                    parent=self, provider=args.provider, depends_on=[args.install, assets]
                ),
                "ate.dev/v1alpha1",
                "SandboxConfig",
            )
        self.register_outputs({})


@dataclass(frozen=True)
class PoolArgs:
    """What WorkerPool applies once Substrate's CRDs and the SandboxConfig it names exist
    (`after`: the install and the runtime setup, or the existing cluster's reads)."""

    runner: Runner | None
    provider: k8s.Provider
    after: tuple[pulumi.Resource, ...]
    worker_image: pulumi.Input[str]
    namespace: Obj
    worker_pool: Callable[[str], Obj]  # the WorkerPool, given the worker image
    # Waits for the pool's workers. None (target `existing`, which runs no command): the
    # templates' golden wait covers it, since a golden snapshot needs a running worker.
    wait: str | None

    @classmethod
    def from_config(
        cls,
        cfg: StackConfig,
        runner: Runner | None,
        *,
        provider: k8s.Provider,
        after: tuple[pulumi.Resource, ...],
        worker_image: pulumi.Input[str],
    ) -> PoolArgs:
        return cls(
            runner=runner,
            provider=provider,
            after=after,
            worker_image=worker_image,
            namespace=objects.pool_namespace(cfg),
            worker_pool=functools.partial(objects.worker_pool, cfg),
            wait=scripts.pool_wait_script(cfg) if runner is not None else None,
        )


class WorkerPool(pulumi.ComponentResource):
    """Namespace, the WorkerPool from manifests/, and a wait until its workers are ready."""

    ready: pulumi.Resource

    def __init__(self, name: str, args: PoolArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(f"{_PKG}:WorkerPool", name, {}, opts)
        k8s_opts = pulumi.ResourceOptions(parent=self, provider=args.provider)
        self.namespace = k8s.yaml.v2.ConfigGroup(
            "namespace",
            objs=[args.namespace],
            opts=pulumi.ResourceOptions.merge(
                k8s_opts, pulumi.ResourceOptions(depends_on=list(args.after))
            ),
        )
        pool = pulumi.Output.from_input(args.worker_image).apply(args.worker_pool)
        self.pool = _custom(
            "worker-pool",
            pool,
            pulumi.ResourceOptions.merge(
                k8s_opts, pulumi.ResourceOptions(depends_on=[self.namespace, *args.after])
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
