"""gym-substrate stack: read and validate the config, build the components, export outputs.

Nothing else happens here: objects, scripts and the components that wire them come from
`gym_substrate.stack`. A bad config key stops the program before any resource is registered, so
`pulumi preview` reports it with the key and the fix.
"""

from __future__ import annotations

from pathlib import Path

import pulumi
from pulumi.runtime import config as runtime_config

from gym_substrate.stack import objects
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

REPO_ROOT = Path(__file__).resolve().parent.parent

raw, secrets = parse_config_values(
    {**runtime_config.get_config_env(), **runtime_config.CONFIG.get()}
)
try:
    cfg = StackConfig.from_mapping(raw, secrets=secrets)
except ConfigError as exc:
    raise pulumi.RunError(str(exc)) from None


def _existing(cfg: StackConfig) -> tuple[ExistingCluster, ActorTemplates]:
    """A cluster that already runs Substrate: only what this project adds, and no command."""
    try:
        kubeconfig, context = existing_kubeconfig(cfg)
    except ConfigError as exc:
        raise pulumi.RunError(str(exc)) from None
    assert cfg.existing is not None
    cluster = ExistingCluster(
        "cluster", ExistingArgs.from_config(cfg, kubeconfig=kubeconfig, context=context)
    )
    kube = cluster.provider
    pool = WorkerPool(
        "pool",
        PoolArgs.from_config(
            cfg, None, provider=kube, runtime=cluster, ateom_image=cfg.existing.ateom_image
        ),
    )
    templates = ActorTemplates(
        "templates",
        TemplatesArgs(
            runner=None,
            provider=kube,
            agent=None,
            pool_ready=pool.ready,
            install=cluster,
            cluster=cluster,
            namespace=cfg.pool.namespace,
            workloads=tuple(WorkloadTemplate.from_config(cfg, wl) for wl in cfg.workloads),
        ),
    )
    Access("access", ObjectsArgs(kube, cluster, tuple(objects.nodeport_services(cfg))))
    if cfg.observability.enabled:
        Observability(
            "observability", ObjectsArgs(kube, cluster, tuple(objects.observability_objects(cfg)))
        )
    return cluster, templates


if cfg.target == "existing":
    assert cfg.existing is not None
    existing, templates = _existing(cfg)
    api = f"{cfg.existing.address}:{cfg.access.api_node_port}"
    router = f"http://{cfg.existing.address}:{cfg.access.router_node_port}"
    ui = f"http://{cfg.existing.address}:{cfg.access.grafana_node_port}"
    pulumi.export("apiAddress", api)
    pulumi.export("routerUrl", router)
    pulumi.export("grafanaUrl", ui if cfg.observability.enabled else None)
    pulumi.export("caPem", existing.ca_pem)
    pulumi.export("templates", templates.names)
    # jwt: the token is the operator's (`kubectl create token`), read from SUBSTRATE_TOKEN.
    provider_config = pulumi.Output.all(existing.ca_pem, templates.names).apply(
        lambda v: objects.to_yaml(
            objects.provider_config(
                cfg, api=api, router=router, ca_pem=v[0], templates=v[1], token_file=None
            )
        )
    )
    pulumi.export("providerConfig", provider_config)
else:
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
            cfg, runner, provider=kube, runtime=runtime, ateom_image=install.ateom_image
        ),
    )
    agent = AgentImage(
        "agent", AgentImageArgs.from_config(cfg, runner, repo_root=REPO_ROOT, cluster=cluster)
    )
    templates = ActorTemplates(
        "templates",
        TemplatesArgs(
            runner=runner,
            provider=kube,
            agent=agent,
            pool_ready=pool.ready,
            install=install,
            cluster=cluster,
            namespace=cfg.pool.namespace,
            workloads=tuple(WorkloadTemplate.from_config(cfg, wl) for wl in cfg.workloads),
        ),
    )
    Access("access", ObjectsArgs(kube, install, tuple(objects.nodeport_services(cfg))))
    if cfg.observability.enabled:
        Observability(
            "observability", ObjectsArgs(kube, install, tuple(objects.observability_objects(cfg)))
        )

    api = f"127.0.0.1:{cfg.access.api_node_port}"
    router = f"http://127.0.0.1:{cfg.access.router_node_port}"
    pulumi.export("kubeconfig", cluster.kubeconfig)
    pulumi.export("apiAddress", api)
    pulumi.export("routerUrl", router)
    pulumi.export(
        "grafanaUrl",
        f"http://127.0.0.1:{cfg.access.grafana_node_port}" if cfg.observability.enabled else None,
    )
    pulumi.export("caPem", install.ca_pem)
    pulumi.export("templates", templates.names)
    # jwt on kind: the token file the install's client-token step wrote (and printed) on this
    # machine; on a host the token itself is exported as `clientToken` instead.
    provider_config = pulumi.Output.all(install.ca_pem, templates.names, install.token_file).apply(
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
