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

from gym_substrate import SubstrateCreateError, SubstrateCreateVerificationError, SubstrateProvider
from gym_substrate.nemo import _shared
from gym_substrate.nemo._metrics import METRICS
from gym_substrate.nemo.types import SandboxSpec

from .fakes import PAUSED, SUSPENDED, FakeAgents, FakeControl, FakePace

CONN = {"api": "127.0.0.1:1", "router": "http://router.invalid", "tls": {"plaintext": True}}


def _provider(control: FakeControl, **sections: Any) -> SubstrateProvider:
    sections.setdefault("create", {"retry": {"initial": 0.001, "maximum": 0.01, "deadline": 5}})
    return SubstrateProvider(connection=CONN, control=control, http=FakeAgents(control), **sections)


def _gauge(gauge: Any) -> float:
    return float(gauge._value.get())


def _agents(p: SubstrateProvider) -> FakeAgents:
    agents = p._injected[1]
    assert isinstance(agents, FakeAgents)
    return agents


async def test_a_rollout_runs_on_fakes_and_opens_no_shared_connection() -> None:
    control = FakeControl()
    before = _shared.shared_count()
    async with _provider(control) as p:
        handle = await p.create(SandboxSpec(files={"/work/a.txt": "hello"}))
        result = await p.exec(handle, "echo hi")
        assert (result.return_code, result.stdout) == (0, "hi\n")
        agents = _agents(p)
        assert agents.files == {}  # spec.files are the facade's to upload
        # Every request named its actor in ate-target-actor (the fake refuses a Host header).
        assert set(agents.routed) == {f"gym/{handle.sandbox_id}"}
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


async def test_a_suspended_actor_is_resumed_by_the_router_and_the_command_runs_once() -> None:
    """Real: the router resumes the actor on every request (upstream-router.md §2), so a
    sandbox someone else suspended needs no ResumeActor of ours."""
    control = FakeControl()
    async with _provider(control) as p:
        handle = await p.create(SandboxSpec())
        control.actors[("gym", handle.sandbox_id)].state = SUSPENDED
        agents = _agents(p)
        agents.fail(502)  # and a glitch on the way, answered by resubmitting the same id
        result = await p.exec(handle, "echo once")
        assert result.stdout == "once\n"
        assert list(agents.runs.values()) == [1]
        assert control.calls["ResumeActor"] == 1  # create's; the router did the rest
        await p.close(handle)


async def test_a_router_503_resumes_over_grpc_and_the_command_runs_once() -> None:
    """Real: the router answers 503 when it cannot resume within its 5 s budget or its queue
    is full; ResumeActor of ours waits that out within the provider's own deadline."""
    control = FakeControl()
    async with _provider(control) as p:
        handle = await p.create(SandboxSpec())
        agents = _agents(p)
        agents.fail(503)
        result = await p.exec(handle, "echo once")
        assert result.stdout == "once\n"
        assert list(agents.runs.values()) == [1]
        assert control.calls["ResumeActor"] == 2  # create, then the recovery
        await p.close(handle)


async def test_resume_waits_out_aborted_and_no_free_capacity_and_counts_it() -> None:
    control = FakeControl()
    control.fail("ResumeActor", grpc.StatusCode.ABORTED, "another operation is in progress", 2)
    control.fail("ResumeActor", grpc.StatusCode.RESOURCE_EXHAUSTED, "no worker has room", 3)
    waits = METRICS.capacity_waits.labels("ResumeActor")
    before = _gauge(waits)
    async with _provider(control) as p:
        handle = await p.create(SandboxSpec())
        assert control.calls["ResumeActor"] == 6
        assert _gauge(waits) == before + 3
        await p.close(handle)


async def test_create_actor_waits_out_no_free_capacity() -> None:
    control = FakeControl()
    control.fail("CreateActor", grpc.StatusCode.RESOURCE_EXHAUSTED, "no room", times=2)
    waits = METRICS.capacity_waits.labels("CreateActor")
    before = _gauge(waits)
    async with _provider(control) as p:
        handle = await p.create(SandboxSpec())
        assert control.calls["CreateActor"] == 3
        assert _gauge(waits) == before + 2
        await p.close(handle)


async def test_a_create_that_never_gets_capacity_says_so_and_deletes_its_actor() -> None:
    control = FakeControl(workers=0)
    given_up = METRICS.failures.labels("no_capacity")
    before = _gauge(given_up)
    async with _provider(control, create={"ready_timeout_s": 0.2}) as p:
        with pytest.raises(SubstrateCreateError) as info:
            await p.create(SandboxSpec())
    assert "within 0.2 s (create.ready_timeout_s)" in str(info.value)
    assert "no free capacity (Substrate answered RESOURCE_EXHAUSTED" in str(info.value)
    assert not isinstance(info.value, SubstrateCreateVerificationError)  # it never started
    assert _gauge(given_up) == before + 1
    assert control.actors == {}


async def test_an_idle_parked_sandbox_waits_for_capacity_within_its_resume_deadline() -> None:
    """The resume of an idle-parked sandbox has its own deadline (create.ready_timeout_s from
    the call): no free capacity until then is a sandbox failure saying so, not a hang."""
    control = FakeControl(workers=1)
    lifecycle = {"idle_policy": "suspend", "idle_after_s": 0.01}
    async with _provider(control, lifecycle=lifecycle, create={"ready_timeout_s": 0.3}) as p:
        handle = await p.create(SandboxSpec())
        actor = control.actors[("gym", handle.sandbox_id)]
        for _ in range(200):
            await asyncio.sleep(0.01)
            if actor.state == SUSPENDED:
                break
        control.workers = 0  # someone else took the only slot
        result = await p.exec(handle, "echo hi")
        assert (result.return_code, result.error_type) == (125, "sandbox")
        assert "no free capacity" in (result.stderr or "")
        control.workers = 1
        assert (await p.exec(handle, "echo hi")).stdout == "hi\n"
        await p.close(handle)


async def test_close_waits_out_a_refused_delete() -> None:
    """Two refusals, two backoffs, on the provider's clock and sleep (none of them real)."""
    control, pace = FakeControl(), FakePace()
    async with _provider(control, pacer=pace.pacer) as p:
        handle = await p.create(SandboxSpec())
        control.fail("DeleteActor", grpc.StatusCode.ABORTED, "another operation", times=2)
        await p.close(handle)
        await p.close(handle)  # idempotent: no second round of RPCs
        assert control.calls["DeleteActor"] == 3
        assert len(pace.sleeps) == 2
    assert control.actors == {}


async def test_idle_policy_parks_and_the_next_call_resumes() -> None:
    control = FakeControl()
    lifecycle = {"idle_policy": "pause", "idle_after_s": 0.02}
    async with _provider(control, lifecycle=lifecycle) as p:
        handle = await p.create(SandboxSpec())
        parked = _gauge(METRICS.parked)
        for _ in range(200):
            await asyncio.sleep(0.01)
            if control.actors[("gym", handle.sandbox_id)].state == PAUSED:
                break
        assert control.actors[("gym", handle.sandbox_id)].state == PAUSED
        assert _gauge(METRICS.parked) == parked + 1
        assert (await p.exec(handle, "echo awake")).stdout == "awake\n"
        assert _gauge(METRICS.parked) == parked
        await p.close(handle)


@pytest.mark.parametrize("park", [None, "pause", "suspend"])
async def test_close_is_one_delete_with_any_state_whatever_the_state(park: str | None) -> None:
    """Real: DeleteActor with any_state deletes a RUNNING or PAUSED actor too
    (upstream-actors.md §4), so close() makes no suspend (or resume-then-suspend) first."""
    control = FakeControl()
    async with _provider(control) as p:
        handle = await p.create(SandboxSpec())
        if park == "pause":
            await p.pause(handle)
        elif park == "suspend":
            await control.suspend_actor("gym", handle.sandbox_id)
        calls = dict(control.calls)
        await p.close(handle)
        assert control.calls - type(control.calls)(calls) == {"DeleteActor": 1}
    assert control.actors == {}


async def test_teardown_looks_again_after_a_delete_that_failed_halfway() -> None:
    """Real: a cleanup step that fails leaves the actor DELETING and returns the error; a
    retried DeleteActor continues from there (upstream-actors.md §4)."""
    control = FakeControl()
    async with _provider(control) as p:
        handle = await p.create(SandboxSpec())
        control.fail("DeleteActor", grpc.StatusCode.INTERNAL, "while calling atelet Terminate")
        await p.close(handle)
    assert control.actors == {}
    assert control.calls["DeleteActor"] == 2


async def test_teardown_gives_up_at_once_on_a_request_the_server_refuses() -> None:
    control = FakeControl()
    async with _provider(control) as p:
        handle = await p.create(SandboxSpec())
        control.fail("DeleteActor", grpc.StatusCode.PERMISSION_DENIED, "not yours")
        with pytest.raises(Exception, match="PERMISSION_DENIED"):
            await p.close(handle)
        assert control.calls["DeleteActor"] == 1
        await p.close(handle)  # the failure left it open: a second close deletes it
    assert control.actors == {}


async def test_close_of_an_actor_someone_else_deleted_is_done_at_once() -> None:
    control = FakeControl()
    async with _provider(control) as p:
        handle = await p.create(SandboxSpec())
        control.actors.clear()
        await p.close(handle)
        assert control.calls["DeleteActor"] == 1


async def test_closing_a_sandbox_parked_while_idle_or_found_parked_never_wakes_it() -> None:
    """Issue 22 item 5: closing a parked sandbox cost a resume and a checkpoint. Parked by the
    idle policy, found PAUSED by connect(), or named by id (delete_actor): one DeleteActor with
    any_state each (the fake refuses a PAUSED actor without it), no Resume or Suspend."""
    control = FakeControl(workers=1)
    lifecycle = {"idle_policy": "pause", "idle_after_s": 0.01}
    async with _provider(control, lifecycle=lifecycle) as p:
        idle = await p.create(SandboxSpec())
        for _ in range(200):
            if control.actors[("gym", idle.sandbox_id)].state == PAUSED:
                break
            await asyncio.sleep(0.01)
        found = await p.create(SandboxSpec())  # takes the worker the idle one gave back
        descriptor = await p.serialize_handle(found)
        await p.pause(found)
        by_id = await p.create(SandboxSpec())
        await p.pause(by_id)
        async with _provider(control) as other:  # another process: it knows only the id
            connected = await other.connect(descriptor)
            calls = dict(control.calls)
            await p.close(idle)
            await other.close(connected)
            await other.delete_actor(by_id.sandbox_id)
            made = control.calls - type(control.calls)(calls)
    assert made == {"DeleteActor": 3}
    assert control.actors == {}


async def test_an_idle_park_that_finds_the_sandbox_crashed_never_says_it_keeps_running(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 24: a park that lost the sandbox was logged "idle park failed (it keeps running)".
    Now the log says it crashed, and the next call reports the crash (on_crash: fail) instead
    of running in anything else."""
    control = FakeControl()
    lifecycle = {"idle_policy": "pause", "idle_after_s": 0.02}
    async with _provider(control, lifecycle=lifecycle) as p:
        handle = await p.create(SandboxSpec())
        control.crash("gym", handle.sandbox_id, "pause failed: atelet Checkpoint: disk full")
        for _ in range(300):
            await asyncio.sleep(0.01)
            if control.calls["PauseActor"] and "idle park" in caplog.text:
                break
        assert "crashed the sandbox (reported as CRASHED)" in caplog.text
        assert "keeps running" not in caplog.text
        result = await p.exec(handle, "echo hi")
        assert (result.return_code, result.error_type) != (0, None)
        assert result.error_type == "sandbox"
        assert "disk full" in (result.stderr or "")
        await p.close(handle)
