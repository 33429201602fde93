"""The provider against the local backend's real failure modes (no injected faults).

The backend fails as Agent Substrate does (cmd/ateapi/internal/controlapi; the local fidelity
suite cites each handler): ABORTED while another operation holds the actor, a template whose
golden build failed, a sandbox that dies while RUNNING (CRASHED). Templates are made with
CreateActorTemplate from a copy of `local/sandbox` with another command.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from gym_substrate import SubstrateCreateError
from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.ateapi import ateapi_pb2_grpc as pb_grpc
from gym_substrate.nemo.types import SandboxSpec, SandboxStatus

from .conftest import TEMPLATE, Stack, make_stack

# the agent's --host/--port stay in argv, where the process runtime points them at the worker's
# own address (a shell string would keep them out of its reach)
_AGENT = 'exec "$0" "$@"'
_AGENT_ARGV = (sys.executable, "-m", "sandbox_agent", "--host", "0.0.0.0", "--port", "80")


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    async with make_stack(tmp_path) as s:
        yield s


def _stub(stack: Stack) -> tuple[Any, grpc.aio.Channel]:
    channel = grpc.aio.insecure_channel(stack.backend.api_address)
    return pb_grpc.ControlStub(channel), channel  # type: ignore[no-untyped-call]


async def _template(stack: Stack, name: str, script: str, *, built: bool = True) -> str:
    """`local/<name>`: the default template running `script` before the agent."""
    stub, channel = _stub(stack)
    try:
        ts, _, tn = TEMPLATE.partition("/")
        found = await stub.GetActorTemplate(
            pb.GetActorTemplateRequest(actor_template=pb.ObjectRef(atespace=ts, name=tn))
        )
        template = pb.ActorTemplate()
        template.CopyFrom(found)
        template.ClearField("status")
        template.metadata.Clear()
        template.metadata.atespace, template.metadata.name = ts, name
        container = template.containers[0]
        del container.command[:], container.args[:]
        container.command.extend(["/bin/sh", "-c", script, *_AGENT_ARGV])
        await stub.CreateActorTemplate(pb.CreateActorTemplateRequest(actor_template=template))
    finally:
        await channel.close()
    if built:
        await stack.golden_built(f"{ts}/{name}")
    return f"{ts}/{name}"


async def test_a_resume_aborted_by_another_callers_lease_is_retried(stack: Stack) -> None:
    """Real: ResumeActor is ABORTED while another operation holds the actor's lease."""
    template = await _template(stack, "slow1", f"sleep 1; {_AGENT}")
    p = stack.provider()
    handle = await p.create(SandboxSpec(provider_options={"template": template}))
    stub, channel = _stub(stack)
    ref = pb.ObjectRef(atespace=handle.raw.atespace, name=handle.sandbox_id)
    await stub.SuspendActor(pb.SuspendActorRequest(actor=ref))
    other = asyncio.ensure_future(stub.ResumeActor(pb.ResumeActorRequest(actor=ref)))
    await asyncio.sleep(0.2)  # the other caller's resume holds the lease for about a second
    before = stack.grpc_proxy.calls["ResumeActor"]
    await p.resume(handle)
    assert stack.grpc_proxy.calls["ResumeActor"] - before >= 2  # ABORTED, then retried
    assert (await other).actor.status.state == pb.ACTOR_STATE_RUNNING
    assert (await p.exec(handle, "echo ok")).stdout == "ok\n"
    await channel.close()
    await p.close(handle)
    await p.aclose()


async def test_a_template_whose_golden_build_failed_fails_create_before_any_actor(
    stack: Stack,
) -> None:
    """Real: a workload that never answers its wakeup probe fails the golden build for good
    (error_message); create() says so and makes nothing."""
    template = await _template(stack, "exits", "exit 1", built=False)
    p = stack.provider(create={"ready_timeout_s": 60})
    started = time.monotonic()
    with pytest.raises(SubstrateCreateError, match="cannot make actors: building its golden"):
        await p.create(SandboxSpec(provider_options={"template": template}))
    assert time.monotonic() - started < 60
    assert stack.grpc_proxy.calls["CreateActor"] == 0
    assert await stack.actors() == []
    await p.aclose()


async def test_close_of_an_actor_left_resuming_deletes_it(stack: Stack) -> None:
    """A resume whose caller gave up may leave the actor RESUMING; close() deletes it anyway
    (DeleteActor with any_state)."""
    template = await _template(stack, "slow1", f"sleep 1; {_AGENT}")
    p = stack.provider()
    handle = await p.create(SandboxSpec(provider_options={"template": template}))
    stub, channel = _stub(stack)
    ref = pb.ObjectRef(atespace=handle.raw.atespace, name=handle.sandbox_id)
    await stub.SuspendActor(pb.SuspendActorRequest(actor=ref))
    with pytest.raises(grpc.aio.AioRpcError):
        await stub.ResumeActor(pb.ResumeActorRequest(actor=ref), timeout=0.3)
    await channel.close()
    await p.close(handle)
    assert stack.grpc_proxy.calls["SuspendActor"] == 0
    assert await stack.actors() == []
    await p.aclose()


@pytest.mark.parametrize("runtime", ["process", pytest.param("gvisor", marks=pytest.mark.runsc)])
async def test_a_dead_sandbox_is_a_sandbox_error_and_status_says_so(
    tmp_path: Path, runtime: str
) -> None:
    """A sandbox that dies while RUNNING crashes its actor; exec() returns 125 with
    error_type "sandbox" and the crash, without waiting out its timeout, and status() is
    ERROR."""
    async with make_stack(tmp_path, runtime=runtime) as stack:
        p = stack.provider()
        handle = await p.create(SandboxSpec())
        assert await p.status(handle) == SandboxStatus.RUNNING
        record = stack.backend.plane.lookup(handle.raw.atespace, handle.sandbox_id)
        await stack.backend.runtime.stop(record.handle)
        started = time.monotonic()
        result = await p.exec(handle, "echo hi", timeout_s=60)
        assert (result.return_code, result.error_type) == (125, "sandbox")
        assert "crashed" in (result.stderr or "") or "workload" in (result.stderr or "")
        assert time.monotonic() - started < 30
        assert await p.status(handle) == SandboxStatus.ERROR
        await p.close(handle)  # one DeleteActor with any_state, whatever the state
        assert await stack.actors() == []
        await p.aclose()


async def test_on_crash_revert_brings_a_dead_sandbox_back_and_says_so(tmp_path: Path) -> None:
    async with make_stack(tmp_path) as stack:
        p = stack.provider(lifecycle={"on_crash": "revert"})
        handle = await p.create(SandboxSpec())
        record = stack.backend.plane.lookup(handle.raw.atespace, handle.sandbox_id)
        await stack.backend.runtime.stop(record.handle)
        result = await p.exec(handle, "echo back", timeout_s=60)
        assert (result.return_code, result.stdout) == (0, "back\n")
        assert "was reverted to its last durable snapshot" in (result.stderr or "")
        assert stack.grpc_proxy.calls["RevertActor"] == 1
        assert await p.status(handle) == SandboxStatus.RUNNING
        await p.close(handle)
        await p.aclose()
