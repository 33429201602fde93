"""(a) Gym's registry finds `substrate` through our entry point, and Gym's own config machinery
(GlobalConfigDictParser + resolve_provider_config) turns configs/substrate.yaml into a provider
that works against the backend named by SUBSTRATE_API / SUBSTRATE_ROUTER."""

from __future__ import annotations

import asyncio
import importlib.metadata
import os

from common import CONFIG, Steps, check, gym_config, provider_config

steps = Steps()


def entry_point() -> str:
    eps = [
        ep
        for ep in importlib.metadata.entry_points(group="nemo_gym.sandbox_providers")
        if ep.name == "substrate"
    ]
    check(len(eps) == 1, f"expected one `substrate` entry point, got {eps}")
    ep = eps[0]
    check(ep.value == "gym_substrate.nemo:SubstrateProvider", ep.value)
    check(ep.dist is not None and ep.dist.name.replace("_", "-") == "gym-substrate", str(ep.dist))
    return f"{ep.value} from {ep.dist.name} {ep.dist.version}"


def registry_lookup() -> str:
    from nemo_gym.sandbox.providers import registry

    registry._ENTRY_POINT_LOADERS = None  # rediscover, as a fresh process would
    cls = registry.get_provider_class("substrate")
    check(cls.__module__ == "gym_substrate.nemo.provider", cls.__module__)
    check(cls.__name__ == "SubstrateProvider" and cls.name == "substrate", repr(cls))
    names = registry.list_providers() if hasattr(registry, "list_providers") else None
    if names is not None:
        check("substrate" in names, f"list_providers() = {names}")
    return f"{cls.__module__}.{cls.__name__}; providers: {names}"


def gym_types() -> str:
    from nemo_gym.sandbox.providers import base

    import gym_substrate.nemo.types as ours

    for name in ("SandboxSpec", "SandboxHandle", "SandboxExecResult", "SandboxStatus"):
        check(getattr(ours, name) is getattr(base, name), f"{name} is not Gym's own class")
    check(
        ours.SandboxCreateError is base.SandboxCreateError
        or issubclass(ours.SandboxCreateError, base.SandboxCreateError),
        "SandboxCreateError",
    )
    return "SandboxSpec, SandboxHandle, SandboxExecResult, SandboxStatus are Gym's"


def resolve() -> dict:
    from nemo_gym.sandbox.config import resolve_provider_metadata

    cfg = provider_config("sandbox", CONFIG)
    check(list(cfg) == ["substrate"], f"provider keys {list(cfg)}")
    conn = cfg["substrate"]["connection"]
    check(conn["api"] == os.environ["SUBSTRATE_API"], f"api {conn['api']!r}")
    check(conn["router"] == os.environ["SUBSTRATE_ROUTER"], f"router {conn['router']!r}")
    check(cfg["substrate"]["create"]["template"] == "local/sandbox", "template")
    meta = resolve_provider_metadata("sandbox", gym_config(CONFIG))
    check(meta == {"sandbox-api": "substrate"}, f"default_metadata {meta}")
    return cfg


def works(cfg: dict) -> str:
    from nemo_gym.sandbox import AsyncSandbox, SandboxSpec, create_provider

    provider = create_provider(cfg)
    check(type(provider).__name__ == "SubstrateProvider", repr(provider))

    async def go() -> str:
        box = AsyncSandbox(provider)
        await box.start(SandboxSpec(env={"FROM_GYM": "yes"}))
        try:
            r = await box.exec("echo $FROM_GYM; id -u")
            check(r.return_code == 0 and r.stdout.split()[0] == "yes", repr(r))
            return f"exec through the resolved provider: {r.stdout.split()}"
        finally:
            await box.stop()

    return asyncio.run(go())


def env_defaults() -> str:
    """With no SUBSTRATE_* variables the YAML's defaults resolve and construct (no I/O)."""
    from nemo_gym.sandbox import create_provider

    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("SUBSTRATE_")}
    try:
        cfg = provider_config("sandbox", CONFIG)
        conn = cfg["substrate"]["connection"]
        check(conn["api"] == "127.0.0.1:7443", f"default api {conn['api']!r}")
        plaintext = conn["tls"]["plaintext"]
        provider = create_provider(cfg)
        check(provider.name == "substrate", "name")
        return f"defaults construct; tls.plaintext resolved to {plaintext!r}"
    finally:
        os.environ.update(saved)


def unknown_key() -> str:
    from nemo_gym.sandbox import create_provider

    cfg = provider_config("sandbox", CONFIG)
    cfg["substrate"]["exec"]["poll_wait"] = 3
    try:
        create_provider(cfg)
    except Exception as exc:  # noqa: BLE001
        check("poll_wait" in str(exc), f"error does not name the key: {exc}")
        return f"{type(exc).__name__}: {exc}"
    raise AssertionError("an unknown key was accepted")


def create_retry_telemetry() -> str:
    """Our report of a retried create goes through Gym 0.7.0's own recorder: off while Gym's
    `sandbox` span group is (as it is without nemo-lens), on it counts
    `gym.sandbox.create_retry_total` with the provider attribute, through Gym's own code."""
    from nemo_gym.telemetry import _fallbacks, gym_metrics

    from gym_substrate.nemo import _gym_telemetry

    counted: list[tuple[str, int, dict]] = []

    class Meter:
        def create_counter(self, name: str, unit: str = "", description: str = "") -> object:
            class Counter:
                def add(self, amount: int, attributes: dict) -> None:
                    counted.append((name, amount, dict(attributes)))

            return Counter()

    saved = (gym_metrics._meter, _fallbacks.is_span_group_enabled)
    gym_metrics._meter = lambda: Meter()
    try:
        _gym_telemetry.create_retried()
        gate = saved[1]("sandbox")
        check(counted == [] or gate, f"recorded with Gym's sandbox group off: {counted}")
        _fallbacks.is_span_group_enabled = lambda group: True
        _gym_telemetry.create_retried(RuntimeError("capacity"))
    finally:
        gym_metrics._meter, _fallbacks.is_span_group_enabled = saved
    want = ("gym.sandbox.create_retry_total", 1, {"nemo.gym.sandbox.provider": "substrate"})
    check(counted[-1:] == [want], f"Gym's counter saw {counted}")
    return f"gate off by default: {not gate}; counted {counted[-1]}"


steps.run("entry_point", entry_point)
steps.run("registry_lookup", registry_lookup)
steps.run("gym_types", gym_types)
resolved = steps.run("resolve_config", resolve)
steps.run("resolved_provider_works", lambda: works(resolved) if resolved else 1 / 0)
steps.run("yaml_defaults_construct", env_defaults)
steps.run("unknown_key_rejected", unknown_key)
steps.run("create_retry_telemetry", create_retry_telemetry)
steps.finish()
