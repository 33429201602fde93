"""Pulumi components: the agent image, the ActorTemplates, the NodePorts, observability.

ActorTemplates creates one ateapi ActorTemplate per workload (`templates.ActorTemplate`, our
dynamic provider) in the templates' atespace (`templates.Atespace`), through the API NodePort
with the stack's TLS and token settings: the workload image runs untouched (pinned by digest;
kind and host stacks resolve a tag with an `image-<name>` step) and the agent rides in on the
agent image, also pinned, as an image volume. Access (the NodePorts) comes first, since the
templates reach ateapi through it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pulumi
import pulumi_kubernetes as k8s

from gym_substrate.stack import objects, scripts
from gym_substrate.stack.api_era import ApiEra
from gym_substrate.stack.commands import CopyToHost
from gym_substrate.stack.config import StackConfig, WorkloadConfig
from gym_substrate.stack.runner import Runner
from gym_substrate.stack.templates import ActorTemplate, Atespace

__all__ = [
    "Access",
    "ActorTemplates",
    "AgentImage",
    "AgentImageArgs",
    "ObjectsArgs",
    "Observability",
    "TemplatesArgs",
    "WorkloadTemplate",
    "ateapi_connection",
]

_PKG = "gymsubstrate:index"
Obj = dict[str, Any]


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


def ateapi_connection(
    *,
    api: str,
    ca_pem: pulumi.Input[str],
    token: pulumi.Input[Mapping[str, Any]] | None,
    ssh: pulumi.Input[Mapping[str, Any]] | None = None,
) -> pulumi.Output[Obj]:
    """The templates' connection to ateapi (`stack/ateapi.py`): TLS pinned to the cluster's CA
    for `api.ate-system.svc`, the bearer token as the stack's auth mode says, and on a borrowed
    host the SSH connection the tunnel goes through."""
    parts: dict[str, Any] = {"api": api, "serverName": objects.API_SERVER_NAME, "caPem": ca_pem}
    if token is not None:
        parts["token"] = token
    if ssh is not None:
        parts["ssh"] = ssh
    return pulumi.Output.from_input(parts)  # type: ignore[arg-type]


@dataclass(frozen=True)
class WorkloadTemplate:
    """One workload's template: pin its image (kind and host), then the message to create."""

    name: str  # names the steps: image-<name>, template-<name>
    image: str  # the configured image: its key in ActorTemplates.names
    # The step that prints the workload by digest (a tag is resolved at `up`); None when the
    # config pins it already (target existing).
    pin: str | None
    template: Callable[[str, str], Obj]  # (workload by digest, agent image) -> the message

    @classmethod
    def from_config(cls, cfg: StackConfig, wl: WorkloadConfig) -> WorkloadTemplate:
        return cls(
            name=wl.name,
            image=wl.image,
            pin=None if cfg.existing is not None else scripts.pinned_workload_script(wl.image),
            template=functools.partial(_template, cfg, wl),
        )


def _template(cfg: StackConfig, wl: WorkloadConfig, image: str, agent_image: str) -> Obj:
    return objects.actor_template(cfg, wl, image=image, agent_image=agent_image)


def _spread(build: Callable[[str, str], Obj], values: list[Any]) -> Obj:
    return build(values[0], values[1])


@dataclass(frozen=True)
class TemplatesArgs:
    """What ActorTemplates creates, once the pool is ready and ateapi answers on its NodePort."""

    runner: Runner | None  # None with pinned images only (target existing)
    connection: pulumi.Output[Obj]  # `ateapi_connection`
    atespace: str  # where the templates live
    ready_timeout_s: int  # the golden snapshot's wait, per template
    agent_image: pulumi.Input[str]
    after: tuple[pulumi.Resource, ...]  # the pool's readiness, the API's NodePort
    cluster: pulumi.Resource | None  # the image steps need the cluster machine ready
    workloads: tuple[WorkloadTemplate, ...]
    era: ApiEra = ApiEra()  # the era the templates are written for (checked at `up`)


class ActorTemplates(pulumi.ComponentResource):
    """The templates' atespace, and per workload: its image by digest, its ActorTemplate.
    `api_era` is the era they were written for (the server's, as each create read it)."""

    names: pulumi.Output[dict[str, str]]
    api_era: pulumi.Output[str]

    def __init__(self, name: str, args: TemplatesArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(f"{_PKG}:ActorTemplates", name, {}, opts)
        self.atespace = Atespace(
            "atespace",
            connection=args.connection,
            atespace=args.atespace,
            opts=pulumi.ResourceOptions(parent=self, depends_on=list(args.after)),
        )
        refs: dict[str, pulumi.Output[str]] = {}
        self.templates: dict[str, ActorTemplate] = {}
        for wl in args.workloads:
            image: pulumi.Input[str] = wl.image
            if wl.pin is not None:
                if args.runner is None or args.cluster is None:
                    raise ValueError(f"workload {wl.name!r}: pinning its image needs a runner")
                step = args.runner.run(
                    f"image-{wl.name}", wl.pin, parent=self, depends_on=[args.cluster]
                )
                image = step.stdout.apply(
                    functools.partial(scripts.result_line, f"image-{wl.name}")
                )
            message = pulumi.Output.all(image, args.agent_image).apply(
                functools.partial(_spread, wl.template)
            )
            resource = ActorTemplate(
                f"template-{wl.name}",
                connection=args.connection,
                template=message,
                ready_timeout_s=args.ready_timeout_s,
                era=args.era.props(),
                opts=pulumi.ResourceOptions(parent=self, depends_on=[self.atespace, *args.after]),
            )
            self.templates[wl.image] = resource
            refs[wl.image] = resource.ref
        self.names = pulumi.Output.all(**refs)  # type: ignore[assignment]
        eras = [t.apiEra for t in self.templates.values()]
        self.api_era = pulumi.Output.all(*eras).apply(_one_era)
        self.register_outputs({"templates": self.names, "apiEra": self.api_era})


def _one_era(eras: list[str | None]) -> str:
    """The templates' era: they all reach one server, so one era (", "-joined otherwise)."""
    return ", ".join(sorted({e for e in eras if e})) or ""


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
