"""Driven by NeMo Gym's own code (nemo-gym 0.7.0 installed without its dependencies).

Collected only inside the subprocess started by `tests/provider/test_gym_conformance.py`, which
puts the wheel on PYTHONPATH *before* anything imports `gym_substrate.types`, so the provider
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
from gym_substrate.types import NEMO_GYM_TYPES

from ..conftest import Stack

PROTOCOLS = [
    base.SandboxProvider,
    base.SupportsSandboxPauseResume,
    base.ConnectableProvider,
    base.SupportsSandboxEndpoint,
]


def test_types_are_gyms_own() -> None:
    import gym_substrate.types as t

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
        if name.startswith("_") or not inspect.iscoroutinefunction(member):
            continue
        ours = getattr(SubstrateProvider, name)
        assert inspect.iscoroutinefunction(ours), name
        theirs_sig, ours_sig = inspect.signature(member), inspect.signature(ours)
        assert [(p.name, p.kind, p.default) for p in ours_sig.parameters.values()] == [
            (p.name, p.kind, p.default) for p in theirs_sig.parameters.values()
        ], name
        args = [object()] * sum(
            p.kind == p.POSITIONAL_OR_KEYWORD for p in theirs_sig.parameters.values()
        )
        ours_sig.bind(*args)
    assert SubstrateProvider.name == "substrate"


def test_capability_protocols_by_isinstance(stack: Stack) -> None:
    p = stack.provider()
    assert isinstance(p, base.SupportsSandboxPauseResume)
    assert isinstance(p, base.ConnectableProvider)
    assert isinstance(p, base.SupportsSandboxEndpoint)
    assert not isinstance(p, base.SupportsSandboxPty)


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
    assert "Host" in ep.headers
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
