"""Driven by NeMo Gym's own code (nemo-gym 0.7.0 installed without its dependencies).

Collected only inside the subprocess started by `tests/provider/test_gym_conformance.py`, which
puts the wheel on PYTHONPATH *before* anything imports `gym_substrate.nemo.types`, so the provider
really hands Gym's own dataclasses to Gym's own facade.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
from pathlib import Path

import pytest
from nemo_gym.sandbox import AsyncSandbox, Sandbox
from nemo_gym.sandbox.providers import base, registry

from gym_substrate import SubstrateProvider
from gym_substrate.nemo.types import NEMO_GYM_TYPES

from ..conftest import Stack

PROTOCOLS = [
    base.SandboxProvider,
    base.SupportsSandboxPauseResume,
    base.ConnectableProvider,
    base.SupportsSandboxEndpoint,
    base.SupportsSandboxPty,
    base.SupportsSandboxPtyAttach,
    base.SupportsSandboxBackgroundServices,
    base.SupportsSandboxNetwork,
    base.SupportsSandboxRuntimeRequirements,
    base.SupportsSandboxPortForwarding,
    base.SupportsSandboxSharedStorage,
]


def test_types_are_gyms_own() -> None:
    import gym_substrate.nemo.types as t

    assert NEMO_GYM_TYPES
    for name in (
        "SandboxSpec",
        "SandboxHandle",
        "SandboxExecResult",
        "SandboxStatus",
        "SandboxEndpoint",
        "SandboxCreateError",
    ):
        assert getattr(t, name) is getattr(base, name), name


def test_registry_resolves_our_entry_point() -> None:
    registry._ENTRY_POINT_LOADERS = None
    assert registry.get_provider_class("substrate") is SubstrateProvider
    assert "substrate" in registry.list_providers()


@pytest.mark.parametrize("protocol", PROTOCOLS, ids=lambda p: p.__name__)
def test_methods_match_protocol_signatures(protocol: type) -> None:
    for name, member in vars(protocol).items():
        if name.startswith("_") or not inspect.isfunction(member):
            continue
        ours = getattr(SubstrateProvider, name)
        assert inspect.iscoroutinefunction(ours) == inspect.iscoroutinefunction(member), name
        theirs_sig, ours_sig = inspect.signature(member), inspect.signature(ours)
        theirs_params = [(p.name, p.kind, p.default) for p in theirs_sig.parameters.values()]
        ours_params = list(ours_sig.parameters.values())
        # Gym's parameters exactly, then only optional keyword-only ones of our own (such as
        # create's `snapshot=`): every call Gym makes binds the same way.
        assert [(p.name, p.kind, p.default) for p in ours_params][: len(theirs_params)] == (
            theirs_params
        ), name
        for extra in ours_params[len(theirs_params) :]:
            assert extra.kind == extra.KEYWORD_ONLY, (name, extra.name)
            assert extra.default is not extra.empty, (name, extra.name)
        params = theirs_sig.parameters.values()
        args = [object()] * sum(p.kind == p.POSITIONAL_OR_KEYWORD for p in params)
        required = {p.name: object() for p in params if p.kind == p.KEYWORD_ONLY}
        ours_sig.bind(*args, **{k: v for k, v in required.items() if k != "self"})
    assert SubstrateProvider.name == "substrate"


def test_capability_protocols_by_isinstance(stack: Stack) -> None:
    p = stack.provider()
    assert isinstance(p, base.SupportsSandboxPauseResume)
    assert isinstance(p, base.ConnectableProvider)
    assert isinstance(p, base.SupportsSandboxEndpoint)
    for protocol in PROTOCOLS[4:]:
        assert isinstance(p, protocol), protocol.__name__


async def test_async_facade_end_to_end(stack: Stack, tmp_path: Path) -> None:
    work = str(tmp_path / "w")
    box = AsyncSandbox({"substrate": stack.kwargs()})
    await box.start(
        base.SandboxSpec(workdir=work, files={f"{work}/a.txt": "gym\n"}, env={"K": "v"}, ports=[80])
    )
    r = await box.exec("cat a.txt; echo $K; exit 4")
    assert isinstance(r, base.SandboxExecResult)
    assert (r.return_code, r.stdout, r.error_type) == (4, "gym\nv\n", None)
    r = await box.exec("sleep 10", timeout_s=0.5)
    assert (r.return_code, r.error_type) == (125, "timeout")
    src = tmp_path / "up.txt"
    src.write_text("payload")
    await box.upload(src, f"{work}/b.txt")
    await box.download(f"{work}/b.txt", tmp_path / "down.txt")
    assert (tmp_path / "down.txt").read_text() == "payload"
    ep = await box.endpoint(80)
    assert isinstance(ep, base.SandboxEndpoint)
    assert "ate-target-actor" in ep.headers
    await box.pause()
    assert await box.status() == base.SandboxStatus.PAUSED
    await box.resume()
    assert await box.status() == base.SandboxStatus.RUNNING
    desc = json.loads(json.dumps(await box.serialize()))
    other = await AsyncSandbox.connect(desc, provider=SubstrateProvider(**stack.kwargs()))
    assert (await other.exec("cat a.txt")).stdout == "gym\n"
    await other.disconnect()
    await box.stop()
    assert await box.status() == base.SandboxStatus.STOPPED
    assert await stack.actors() == []


async def test_gym_facade_starts_a_sandbox_from_a_snapshot(stack: Stack, tmp_path: Path) -> None:
    """A snapshot taken through the provider is a `provider_options` entry to Gym's facade."""
    provider = SubstrateProvider(**stack.kwargs())
    source = AsyncSandbox(provider, owns_provider=False)
    await source.start(base.SandboxSpec(workdir=str(tmp_path / "w"), env={"K": "v"}))
    await source.exec("echo before > state.txt")
    snap = await provider.take_snapshot(source._handle)
    child = AsyncSandbox(provider, owns_provider=False)
    await child.start(base.SandboxSpec(provider_options={"from_snapshot": snap.ref}))
    r = await child.exec("cat state.txt; echo $K; pwd")
    assert (r.return_code, r.stdout) == (0, f"before\nv\n{tmp_path / 'w'}\n")
    assert (await source.exec("cat state.txt")).stdout == "before\n"  # resumed transparently
    await child.stop()
    await provider.delete_snapshot(snap)
    await source.stop()
    await provider.aclose()
    assert await stack.actors() == []


async def test_sync_facade_on_its_private_loop(stack: Stack) -> None:
    kwargs = stack.kwargs()

    def drive() -> tuple[int, str | None, object, object]:
        box = Sandbox({"substrate": kwargs})
        box.start(base.SandboxSpec(env={"S": "sync"}))
        try:
            r = box.exec("echo $S")
            box.pause()
            paused = box.status()
            box.resume()
            return r.return_code, r.stdout, paused, box.status()
        finally:
            box.stop()

    code, out, paused, running = await asyncio.to_thread(drive)
    assert (code, out) == (0, "sync\n")
    assert (paused, running) == (base.SandboxStatus.PAUSED, base.SandboxStatus.RUNNING)
    assert await stack.actors() == []
    assert os.environ["GYM_SUBSTRATE_GYM_CONFORMANCE"] == "1"


async def test_gym_pty_api_drives_our_sessions(stack: Stack) -> None:
    """Gym's own `AsyncSandbox.pty` (nemo_gym/sandbox/api.py): one-shot `pty.exec` in a private
    session, the default shell session reused by `pty.exec`, `detach=True` through our
    `run_detached`, and pipe mode; the session satisfies Gym's `SandboxPtySession` protocol."""
    box = AsyncSandbox({"substrate": stack.kwargs()})
    await box.start(base.SandboxSpec(workdir="/tmp", env={"K": "v"}))
    r = await box.pty.exec("stty size; echo $K; exit 3", rows=33, cols=99)
    assert (r.return_code, r.error_type) == (3, None)
    assert r.stdout == "33 99\r\nv\r\n"
    shell = await box.pty.create()
    assert isinstance(shell, base.SandboxPtySession)
    r = await box.pty.exec("cd /; export Q=1")
    assert r.return_code == 0
    r = await box.pty.exec("echo $(pwd) $Q")
    assert (r.return_code, r.error_type) == (0, None)
    assert "/ 1" in (r.stdout or ""), "the default shell session kept its state"
    r = await box.pty.exec(
        "echo detached; (exit 5)", session=shell, detach=True, poll_interval_s=0.2
    )
    assert (r.stdout, r.return_code) == ("detached\r\n", 5)
    r = await box.pty.exec("echo out; echo err >&2", pty=False)
    assert (r.stdout, r.stderr, r.return_code) == ("out\n", "err\n", 0)
    r = await box.pty.exec("sleep 30", timeout_s=0.5, rows=25)  # a private session
    assert (r.return_code, r.error_type) == (125, "timeout")
    await box.pause()  # detaches the open sessions
    with pytest.raises(base.SandboxPtyError, match="detached"):
        await shell.read(timeout_s=0.1)
    await box.resume()
    await shell.reattach()
    r = await box.pty.exec("echo $Q again", session=shell)
    assert "1 again" in (r.stdout or "")
    attached = await box.pty.attach(shell.session_id, since=0)  # takes it over
    assert shell.closed
    r = await box.pty.exec("echo $Q attached", session=attached)
    assert "1 attached" in (r.stdout or "")
    await attached.close()
    await shell.close()
    await box.stop()
    assert await stack.actors() == []


async def test_gym_background_services_exec(stack: Stack, tmp_path: Path) -> None:
    """`AsyncSandbox.exec(preserve_background_services=True)` reaches our
    `exec_with_background_services`; Gym refuses env/user overrides for it itself."""
    box = AsyncSandbox({"substrate": stack.kwargs()})
    await box.start(base.SandboxSpec(workdir=str(tmp_path / "w")))
    r = await box.exec(
        "(while :; do echo tick; date >> svc.log; sleep 0.1; done) & echo up",
        preserve_background_services=True,
    )
    assert r.return_code == 0
    await asyncio.sleep(0.8)
    first = int((await box.exec("wc -l < svc.log")).stdout or "0")
    await asyncio.sleep(0.5)
    assert int((await box.exec("wc -l < svc.log")).stdout or "0") > first
    with pytest.raises(ValueError, match="env or user"):
        await box.exec("true", env={"A": "1"}, preserve_background_services=True)
    await box.stop()


@pytest.mark.parametrize(
    ("service", "extra", "reason"),
    [
        ({}, {}, "cannot reach each other on service ports"),
        ({"cap_add": ["SYS_ADMIN"]}, {}, "CAP_SYS_ADMIN cannot be granted"),
        ({"network_mode": "service:db"}, {}, "cannot forward ports to one another"),
        (
            {"volumes": [{"type": "volume", "source": "data", "target": "/data"}]},
            {"volumes": {"data": {}}},
            "no storage shared between sandboxes",
        ),
    ],
)
async def test_gym_compose_adapter_reports_our_reason(
    stack: Stack, tmp_path: Path, service: dict, extra: dict, reason: str
) -> None:
    """Gym's Compose adapter (nemo_gym/sandbox/adapters/docker_compose.py) validates before it
    provisions anything; it must fail with Substrate's reason, and create no sandbox."""
    import yaml
    from nemo_gym.sandbox.adapters.docker_compose import AsyncSandboxCompose

    services = {"db": {"image": "db:1", "command": ["sleep", "1"], "expose": [5432]}}
    services["app"] = {"image": "app:1", "command": ["sleep", "1"], **service}
    compose = tmp_path / "compose.yaml"
    compose.write_text(yaml.safe_dump({"services": services, **extra}))
    collection = AsyncSandboxCompose({"substrate": stack.kwargs()}, compose)
    with pytest.raises(NotImplementedError, match=reason):
        await collection.start()
    assert await stack.actors() == []
