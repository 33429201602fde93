"""The provider against the local backend's real failure modes (no injected faults).

The backend fails as Agent Substrate does (tests/local/test_fidelity_control.py): ABORTED from a
lock held by another caller, a failed resume that leaves the actor RESUMING on its worker, a
workload that dies while RUNNING. These tests shorten the 28 s workflow deadline to 6 s.
"""

from __future__ import annotations

import asyncio
import dataclasses
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
from gym_substrate.types import SandboxSpec, SandboxStatus

from .conftest import Stack, make_stack

# the agent's --host/--port stay in argv, where the process runtime points them at the worker's
# own address (a shell string would keep them out of its reach)
_AGENT = 'exec "$0" "$@"'
_AGENT_ARGV = (sys.executable, "-m", "sandbox_agent", "--host", "0.0.0.0", "--port", "80")


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    async with make_stack(tmp_path, workflow_timeout_s=6.0) as s:
        yield s


async def _template(stack: Stack, name: str, script: str) -> str:
    plane = stack.backend.plane
    default = plane.templates["local/sandbox"]
    await plane.add_template(
        dataclasses.replace(default, name=name, command=("/bin/sh", "-c", script, *_AGENT_ARGV))
    )
    return f"local/{name}"


def _stub(stack: Stack) -> tuple[Any, grpc.aio.Channel]:
    channel = grpc.aio.insecure_channel(stack.backend.api_address)
    return pb_grpc.ControlStub(channel), channel  # type: ignore[no-untyped-call]


async def test_a_resume_aborted_by_another_callers_lock_is_retried(stack: Stack) -> None:
    """Real: ResumeActor is ABORTED while another operation holds the actor (workflow.go)."""
    template = await _template(stack, "slow1", f"sleep 1; {_AGENT}")
    p = stack.provider()
    handle = await p.create(SandboxSpec(provider_options={"template": template}))
    stub, channel = _stub(stack)
    ref = pb.ObjectRef(atespace=handle.raw.atespace, name=handle.sandbox_id)
    await stub.SuspendActor(pb.SuspendActorRequest(actor=ref))
    other = asyncio.ensure_future(stub.ResumeActor(pb.ResumeActorRequest(actor=ref)))
    await asyncio.sleep(0.2)  # the other caller's resume holds the lock for about a second
    before = stack.grpc_proxy.calls["ResumeActor"]
    await p.resume(handle)
    assert stack.grpc_proxy.calls["ResumeActor"] - before >= 2  # ABORTED, then retried
    assert (await other).actor.status.state == pb.ACTOR_STATE_RUNNING
    assert (await p.exec(handle, "echo ok")).stdout == "ok\n"
    await channel.close()
    await p.close(handle)
    await p.aclose()


async def test_a_resume_that_never_gets_ready_fails_create_and_leaks_nothing(
    stack: Stack,
) -> None:
    """Real: the resume fails at the workflow deadline and leaves the actor RESUMING on its
    worker (workflow_resume.go); create() reports SubstrateCreateError and still deletes it."""
    template = await _template(stack, "exits", "exit 1")
    p = stack.provider(create={"ready_timeout_s": 5})
    started = time.monotonic()
    with pytest.raises(SubstrateCreateError):
        await p.create(SandboxSpec(provider_options={"template": template}))
    assert time.monotonic() - started < 30
    assert await stack.actors() == []
    workers = stack.backend.plane.workers_list()
    assert [actor for _, actor in workers] == [None] * len(workers)  # no worker kept
    await p.aclose()


async def test_close_of_an_actor_left_resuming_deletes_it(stack: Stack) -> None:
    """Real: a resume cut off by its caller's deadline leaves the actor RESUMING on its worker
    (workflow.go runs it under the request's context); close() still deletes the actor."""
    template = await _template(stack, "slow1", f"sleep 1; {_AGENT}")
    p = stack.provider()
    handle = await p.create(SandboxSpec(provider_options={"template": template}))
    stub, channel = _stub(stack)
    ref = pb.ObjectRef(atespace=handle.raw.atespace, name=handle.sandbox_id)
    await stub.SuspendActor(pb.SuspendActorRequest(actor=ref))
    with pytest.raises(grpc.aio.AioRpcError):
        await stub.ResumeActor(pb.ResumeActorRequest(actor=ref), timeout=0.3)
    left = await stub.GetActor(pb.GetActorRequest(actor=ref))
    assert left.status.state == pb.ACTOR_STATE_RESUMING
    await channel.close()
    await p.close(handle)
    assert await stack.actors() == []
    await p.aclose()


@pytest.mark.parametrize("runtime", ["process", pytest.param("gvisor", marks=pytest.mark.runsc)])
async def test_a_dead_workload_is_a_sandbox_error_and_status_says_so(
    tmp_path: Path, runtime: str
) -> None:
    """Real: a dead workload leaves its actor RUNNING and the router answers 503 (syncer.go);
    exec() returns 125 with error_type "sandbox" without waiting out its timeout, and status()
    reports ERROR, not RUNNING. Under gVisor each 503 takes Envoy's 5 s connect timeout."""
    async with make_stack(tmp_path, runtime=runtime, workflow_timeout_s=6.0) as stack:
        p = stack.provider()
        handle = await p.create(SandboxSpec())
        assert await p.status(handle) == SandboxStatus.RUNNING
        record = stack.backend.plane.lookup(handle.raw.atespace, handle.sandbox_id)
        await stack.backend.runtime.stop(record.handle)
        started = time.monotonic()
        result = await p.exec(handle, "echo hi", timeout_s=60)
        assert (result.return_code, result.error_type) == (125, "sandbox")
        assert "workload" in (result.stderr or "")
        assert time.monotonic() - started < 20
        assert await p.status(handle) == SandboxStatus.ERROR
        await p.close(handle)  # one DeleteActor with any_state, whatever the state
        assert await stack.actors() == []
        await p.aclose()
