"""gym-substrate stack: read and validate the config, build the components, export outputs.

Nothing else happens here: objects, scripts and the components that wire them come from
`gym_substrate.stack`. A bad config key stops the program before any resource is registered, so
`pulumi preview` reports it with the key and the fix.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pulumi
from pulumi.runtime import config as runtime_config

from gym_substrate.stack import objects, observability
from gym_substrate.stack.components import (
    Access,
    ActorTemplates,
    AgentImage,
    AgentImageArgs,
    BorrowedHost,
    ClusterArgs,
    ExistingArgs,
    ExistingCluster,
    InstallArgs,
    KindCluster,
    ObjectsArgs,
    Observability,
    PoolArgs,
    RuntimeSetup,
    RuntimeSetupArgs,
    SubstrateInstall,
    TemplatesArgs,
    WorkerPool,
    WorkloadTemplate,
    borrowed_host,
)
from gym_substrate.stack.config import (
    PROJECT,
    ConfigError,
    StackConfig,
    existing_kubeconfig,
    parse_config_values,
)
from gym_substrate.stack.runner import Runner
from gym_substrate.stack.template_components import ateapi_connection
from gym_substrate.stack.templates import token_source

REPO_ROOT = Path(__file__).resolve().parent.parent

raw, secrets = parse_config_values(
    {**runtime_config.get_config_env(), **runtime_config.CONFIG.get()}
)
try:
    cfg = StackConfig.from_mapping(raw, secrets=secrets)
except ConfigError as exc:
    raise pulumi.RunError(str(exc)) from None
pulumi.log.info(cfg.substrate.api_era.describe())


def _templates(
    runner: Runner | None,
    connection: pulumi.Output[dict[str, Any]],
    agent_image: pulumi.Input[str],
    after: list[pulumi.Resource],
    cluster: pulumi.Resource | None,
) -> ActorTemplates:
    return ActorTemplates(
        "templates",
        TemplatesArgs(
            runner=runner,
            connection=connection,
            atespace=cfg.templates.atespace,
            ready_timeout_s=cfg.templates.ready_timeout_s,
            agent_image=agent_image,
            after=tuple(after),
            cluster=cluster,
            workloads=tuple(WorkloadTemplate.from_config(cfg, wl) for wl in cfg.workloads),
            era=cfg.substrate.api_era,
        ),
    )


def _export(
    api: str, router: str, ui: str, ca_pem: pulumi.Output[str], templates: ActorTemplates
) -> pulumi.Output[dict[str, str]]:
    pulumi.export("substrateVersion", cfg.substrate.version if cfg.substrate.prebuilt else None)
    pulumi.export("apiAddress", api)
    pulumi.export("routerUrl", router)
    pulumi.export("grafanaUrl", ui if cfg.observability.enabled else None)
    pulumi.export("caPem", ca_pem)
    pulumi.export("templates", templates.names)
    # The era the templates are written for: the configured one (checked against the server at
    # `up`), else what the server declared; `preview` logs which.
    pulumi.export("apiEra", cfg.substrate.api_era.era or templates.api_era)
    return templates.names


def _existing(cfg: StackConfig) -> dict[str, Any]:
    """A cluster that already runs Substrate: only what this project adds, and no command."""
    try:
        kubeconfig, context = existing_kubeconfig(cfg)
    except ConfigError as exc:
        raise pulumi.RunError(str(exc)) from None
    assert cfg.existing is not None
    assert cfg.agent.image is not None
    cluster = ExistingCluster(
        "cluster", ExistingArgs.from_config(cfg, kubeconfig=kubeconfig, context=context)
    )
    kube = cluster.provider
    pool = WorkerPool(
        "pool",
        PoolArgs.from_config(
            cfg, None, provider=kube, after=(cluster,), worker_image=cfg.existing.worker_image
        ),
    )
    access = Access("access", ObjectsArgs(kube, cluster, tuple(objects.nodeport_services(cfg))))
    address = cfg.existing.address
    api = f"{address}:{cfg.access.api_node_port}"
    # jwt: the operator's token (`kubectl create token`), read from SUBSTRATE_TOKEN where
    # `pulumi` runs, so it never enters the state.
    connection = ateapi_connection(
        api=api, ca_pem=cluster.ca_pem, token=token_source(cfg.substrate.auth_mode)
    )
    templates = _templates(None, connection, cfg.agent.image, [pool.ready, access], None)
    if cfg.observability.enabled:
        Observability(
            "observability",
            ObjectsArgs(kube, cluster, tuple(observability.observability_objects(cfg))),
        )
    router = f"http://{address}:{cfg.access.router_node_port}"
    names = _export(
        api, router, f"http://{address}:{cfg.access.grafana_node_port}", cluster.ca_pem, templates
    )
    pulumi.export(
        "database",
        {"mode": cfg.existing.database.mode, "address": cfg.existing.database.address},
    )
    provider_config = pulumi.Output.all(cluster.ca_pem, names).apply(
        lambda v: objects.to_yaml(
            objects.provider_config(
                cfg, api=api, router=router, ca_pem=v[0], templates=v[1], token_file=None
            )
        )
    )
    pulumi.export("providerConfig", provider_config)
    return {
        "cluster": cluster,
        "pool": pool,
        "templates": templates,
        "ca_pem": cluster.ca_pem,
        "provider_config": provider_config,
    }


def _ssh_to(cfg: StackConfig, host: BorrowedHost) -> Any:
    """How the templates reach the API of a borrowed host: its NodePort answers on the host's
    loopback, so they tunnel over SSH, with the host key the host's first step recorded (or the
    configured one)."""
    return pulumi.Output.all(
        pulumi.Config(PROJECT).require_secret("sshPrivateKey"),
        host.prep_root.knownHostKey,
    ).apply(
        lambda v: {
            "host": cfg.host.address,  # type: ignore[union-attr]
            "port": cfg.host.port,  # type: ignore[union-attr]
            "user": cfg.host.user,  # type: ignore[union-attr]
            "privateKey": v[0],
            "hostKey": cfg.host.host_key or v[1],  # type: ignore[union-attr]
        }
    )


def _export_kind_or_host(
    cfg: StackConfig, cluster: KindCluster, install: SubstrateInstall, api: str, templates: Any
) -> Any:
    """The stack's outputs on kind or a host: kubeconfig, addresses, worker image, the
    provider config (returned), the client token and the SSH tunnel of a host."""
    router = f"http://127.0.0.1:{cfg.access.router_node_port}"
    pulumi.export("kubeconfig", cluster.kubeconfig)
    names = _export(
        api, router, f"http://127.0.0.1:{cfg.access.grafana_node_port}", install.ca_pem, templates
    )
    pulumi.export("workerImage", install.worker_image)
    # jwt on kind: the token file the install's client-token step wrote (and printed) on this
    # machine; on a host the token itself is exported as `clientToken` instead.
    provider_config = pulumi.Output.all(install.ca_pem, names, install.token_file).apply(
        lambda v: objects.to_yaml(
            objects.provider_config(
                cfg, api=api, router=router, ca_pem=v[0], templates=v[1], token_file=v[2]
            )
        )
    )
    pulumi.export("providerConfig", provider_config)
    if install.client_token is not None:
        pulumi.export("clientToken", install.client_token)
    if cfg.host is not None:
        ports = [cfg.access.api_node_port, cfg.access.router_node_port]
        if cfg.observability.enabled:
            ports += [cfg.access.grafana_node_port, cfg.access.prometheus_node_port]
        forwards = " ".join(f"-L {p}:127.0.0.1:{p}" for p in ports)
        pulumi.export(
            "sshTunnel", f"ssh -N {forwards} -p {cfg.host.port} {cfg.host.user}@{cfg.host.address}"
        )
    return provider_config


def _kind_or_host(cfg: StackConfig) -> dict[str, Any]:
    runner = Runner(cwd=str(REPO_ROOT))
    host: BorrowedHost | None = None
    if cfg.host is not None:
        try:
            host = borrowed_host(cfg, pulumi.Config(PROJECT).require_secret("sshPrivateKey"))
        except ConfigError as exc:
            raise pulumi.RunError(str(exc)) from None
        runner = host.runner

    cluster = KindCluster("cluster", ClusterArgs.from_config(cfg, runner))
    kube = cluster.provider
    install = SubstrateInstall("substrate", InstallArgs.from_config(cfg, runner, cluster=cluster))
    runtime = RuntimeSetup(
        "runtime", RuntimeSetupArgs.from_config(cfg, runner, provider=kube, install=install)
    )
    pool = WorkerPool(
        "pool",
        PoolArgs.from_config(
            cfg,
            runner,
            provider=kube,
            after=(install, runtime),
            worker_image=install.worker_image,
        ),
    )
    agent = AgentImage(
        "agent", AgentImageArgs.from_config(cfg, runner, repo_root=REPO_ROOT, cluster=cluster)
    )
    access = Access("access", ObjectsArgs(kube, install, tuple(objects.nodeport_services(cfg))))
    api = f"127.0.0.1:{cfg.access.api_node_port}"
    ssh = _ssh_to(cfg, host) if host is not None else None
    token = token_source(
        cfg.substrate.auth_mode, file=install.token_file, value=install.client_token
    )
    connection = ateapi_connection(api=api, ca_pem=install.ca_pem, token=token, ssh=ssh)
    templates = _templates(runner, connection, agent.image, [pool.ready, access, agent], cluster)
    if cfg.observability.enabled:
        Observability(
            "observability",
            ObjectsArgs(kube, install, tuple(observability.observability_objects(cfg))),
        )

    provider_config = _export_kind_or_host(cfg, cluster, install, api, templates)
    return {
        "cluster": cluster,
        "install": install,
        "pool": pool,
        "agent": agent,
        "templates": templates,
        "ca_pem": install.ca_pem,
        "provider_config": provider_config,
    }


# The program's parts, by name (the component tests read them).
parts = _existing(cfg) if cfg.target == "existing" else _kind_or_host(cfg)
