"""The provider's logic against in-memory fakes, through its `control=` / `http=` seam.

No backend, no socket, no patching: what these tests pin down is the provider's own behaviour
(lifecycle and gauges, retry rules, one run per command), which the backend tests exercise only
as a side effect.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from gym_substrate import SubstrateProvider, _shared
from gym_substrate._metrics import METRICS
from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.types import SandboxSpec

from .fakes import FakeAgents, FakeControl

CONN = {"api": "127.0.0.1:1", "router": "http://router.invalid", "tls": {"plaintext": True}}


def _provider(control: FakeControl, **sections: Any) -> SubstrateProvider:
    sections.setdefault("create", {"retry": {"initial": 0.001, "maximum": 0.01, "deadline": 5}})
    return SubstrateProvider(connection=CONN, control=control, http=FakeAgents(control), **sections)


def _gauge(gauge: Any) -> float:
    return float(gauge._value.get())


async def test_a_rollout_runs_on_fakes_and_opens_no_shared_connection() -> None:
    control = FakeControl()
    before = _shared.shared_count()
    async with _provider(control) as p:
        handle = await p.create(SandboxSpec(files={"/work/a.txt": "hello"}))
        result = await p.exec(handle, "echo hi")
        assert (result.return_code, result.stdout) == (0, "hi\n")
        agents = p._injected[1]
        assert isinstance(agents, FakeAgents)
        assert agents.files == {}  # spec.files are the facade's to upload
        assert _shared.shared_count() == before
        await p.close(handle)
    assert control.actors == {}


async def test_connect_to_a_parked_actor_then_exec_keeps_the_parked_gauge_balanced() -> None:
    """Regression: connect() marked the sandbox parked without counting it, so the resume of
    the first exec drove `gym_substrate_parked` below zero."""
    control = FakeControl()
    async with _provider(control) as creator:
        handle = await creator.create(SandboxSpec())
        descriptor = await creator.serialize_handle(handle)
        await creator.pause(handle)
        parked = _gauge(METRICS.parked)
        async with _provider(control) as other:
            again = await other.connect(descriptor)
            assert _gauge(METRICS.parked) == parked + 1  # the connected view counts it too
            assert (await other.exec(again, "echo back")).stdout == "back\n"
            assert _gauge(METRICS.parked) == parked
            await other.close(again)
        # The creator still believes it parked; its handle is stale but its books balance.
        await creator.aclose()
    assert _gauge(METRICS.parked) >= 0


async def test_a_lost_worker_is_resumed_and_the_command_runs_once() -> None:
    control = FakeControl()
    async with _provider(control) as p:
        handle = await p.create(SandboxSpec())
        # Someone else suspends it: the next request meets the router's 503.
        control.actors[("gym", handle.sandbox_id)].status = pb.Actor.STATUS_SUSPENDED
        agents = p._injected[1]
        assert isinstance(agents, FakeAgents)
        agents.fail(502)  # and a glitch on the way, answered by resubmitting the same id
        result = await p.exec(handle, "echo once")
        assert result.stdout == "once\n"
        assert list(agents.runs.values()) == [1]
        assert control.calls["ResumeActor"] == 2  # create, then the recovery
        await p.close(handle)


async def test_resume_retries_through_aborted_and_no_free_workers() -> None:
    control = FakeControl()
    control.fail("ResumeActor", grpc.StatusCode.ABORTED, "concurrent operation", times=2)
    control.fail("ResumeActor", grpc.StatusCode.FAILED_PRECONDITION, "no free workers")
    async with _provider(control) as p:
        handle = await p.create(SandboxSpec())
        assert control.calls["ResumeActor"] == 4
        await p.close(handle)


async def test_a_create_that_never_gets_a_worker_deletes_its_actor() -> None:
    control = FakeControl(workers=0)
    async with _provider(control, create={"ready_timeout_s": 0.2}) as p:
        with pytest.raises(Exception, match="did not become ready within 0.2 s"):
            await p.create(SandboxSpec())
    assert control.actors == {}


async def test_close_waits_out_a_refused_delete() -> None:
    control = FakeControl()
    async with _provider(control) as p:
        handle = await p.create(SandboxSpec())
        control.fail("DeleteActor", grpc.StatusCode.FAILED_PRECONDITION, "resuming", times=2)
        await p.close(handle)
        await p.close(handle)  # idempotent: no second round of RPCs
        assert control.calls["DeleteActor"] == 3
    assert control.actors == {}


async def test_idle_policy_parks_and_the_next_call_resumes() -> None:
    control = FakeControl()
    lifecycle = {"idle_policy": "pause", "idle_after_s": 0.02}
    async with _provider(control, lifecycle=lifecycle) as p:
        handle = await p.create(SandboxSpec())
        parked = _gauge(METRICS.parked)
        for _ in range(200):
            await asyncio.sleep(0.01)
            if control.actors[("gym", handle.sandbox_id)].status == pb.Actor.STATUS_PAUSED:
                break
        assert control.actors[("gym", handle.sandbox_id)].status == pb.Actor.STATUS_PAUSED
        assert _gauge(METRICS.parked) == parked + 1
        assert (await p.exec(handle, "echo awake")).stdout == "awake\n"
        assert _gauge(METRICS.parked) == parked
        await p.close(handle)


async def test_teardown_looks_again_after_a_failed_checkpoint() -> None:
    """The local backend (and Substrate) answer INTERNAL when a suspend's checkpoint fails and
    then mark the actor SUSPENDED; a close that gave up there leaked the actor."""
    control = FakeControl()
    async with _provider(control) as p:
        handle = await p.create(SandboxSpec())
        control.fail("SuspendActor", grpc.StatusCode.INTERNAL, "CallAteletCheckpoint failed")
        await p.close(handle)
    assert control.actors == {}
    assert control.calls["SuspendActor"] == 2


async def test_teardown_gives_up_at_once_on_a_request_the_server_refuses() -> None:
    control = FakeControl()
    async with _provider(control) as p:
        handle = await p.create(SandboxSpec())
        control.fail("SuspendActor", grpc.StatusCode.PERMISSION_DENIED, "not yours")
        with pytest.raises(Exception, match="PERMISSION_DENIED"):
            await p.close(handle)
        assert control.calls["SuspendActor"] == 1
        await p.close(handle)  # the failure left it open: a second close deletes it
    assert control.actors == {}


async def test_close_of_an_actor_someone_else_deleted_is_done_at_once() -> None:
    control = FakeControl()
    async with _provider(control) as p:
        handle = await p.create(SandboxSpec())
        control.actors.clear()
        await p.close(handle)
        assert control.calls["GetActor"] == 1
