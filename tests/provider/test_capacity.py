"""Resumes that wait for a free worker are served in arrival order, a few calls per wait.

Issue 24: with the provider's defaults 3 of 32 gVisor creates failed with "no free workers"
after 120 s while later ones went through (every waiter retried on its own schedule, so
whoever asked right after a worker freed up got it). Issue 22 item 5: two 4x `compare` runs
called ResumeActor about 1,400 times for 180 real resumes. On the in-memory fakes: a pool with
room for two running actors, then N creates that must wait.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gym_substrate import SubstrateCreateError, SubstrateProvider
from gym_substrate.nemo._capacity import queue_for
from gym_substrate.nemo.types import SandboxHandle, SandboxSpec

from .fakes import FakeAgents, FakeControl, FakePace

CONN = {"api": "127.0.0.1:1", "router": "http://router.invalid", "tls": {"plaintext": True}}
WAITERS = 6
# A bound no correct run comes near; only a lost wakeup would reach it.
_HANG_S = 30


def _provider(
    control: FakeControl, retry: dict[str, float], pace: FakePace | None = None, **create: Any
) -> SubstrateProvider:
    return SubstrateProvider(
        connection=CONN,
        control=control,
        http=FakeAgents(control),
        create={"ready_timeout_s": 600, "retry": retry, **create},
        pacer=pace.pacer if pace is not None else None,
    )


async def _line_up(
    p: SubstrateProvider, control: FakeControl, n: int, specs: list[SandboxSpec] | None = None
) -> tuple[list[asyncio.Task[SandboxHandle]], list[int]]:
    """Start `n` creates one after another, each only once the one before is waiting."""
    line = queue_for(control, "ResumeActor")
    served: list[int] = []
    tasks: list[asyncio.Task[SandboxHandle]] = []

    async def create(i: int) -> SandboxHandle:
        handle = await p.create(specs[i] if specs else SandboxSpec())
        served.append(i)
        return handle

    for i in range(n):
        waiting, calls = line.waiting, control.calls["ResumeActor"]
        tasks.append(asyncio.create_task(create(i)))
        # waiting: in the line, or (a client without one) its first ResumeActor was refused
        await _until(
            lambda: line.waiting > waiting or control.calls["ResumeActor"] > calls  # noqa: B023
        )
    return tasks, served


async def _until(predicate: Any) -> None:
    for _ in range(_HANG_S * 1000):
        if predicate():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("the awaited step never came")


async def test_waiting_creates_are_served_in_arrival_order_as_this_process_frees_workers() -> None:
    """Workers freed by this process's own closes wake the line at once; the backoff is made
    so long that nothing else would: each wait costs at most two ResumeActor calls (its turn,
    and the one right after the previous head's that may find the pool full again)."""
    control = FakeControl(workers=2)
    p = _provider(control, {"initial": 300, "maximum": 300, "deadline": 600})
    async with asyncio.timeout(_HANG_S):
        running = [await p.create(SandboxSpec()) for _ in range(2)]
        before = control.calls["ResumeActor"]
        tasks, served = await _line_up(p, control, WAITERS)
        assert control.calls["ResumeActor"] == before + 1  # only the first asked; it heads
        for turn in range(WAITERS):
            await p.close(running.pop(0))
            await _until(lambda: len(served) > turn)  # noqa: B023 - awaited within the turn
            running.append(await tasks[turn])
        assert served == list(range(WAITERS))
        # each served wait made its own turn's call, and at most one more that found the pool
        # full again (fewer when the next close came before the new head asked)
        assert WAITERS <= control.calls["ResumeActor"] - before <= 2 * WAITERS
        for handle in running:
            await p.close(handle)
    await p.aclose()


async def test_waiting_creates_are_served_in_arrival_order_when_others_free_workers() -> None:
    """A worker freed by another process: only the head of the line notices (at its backoff),
    and it is the one served."""
    control = FakeControl(workers=0)
    p = _provider(control, {"initial": 0.01, "maximum": 0.05, "deadline": 600})
    async with asyncio.timeout(_HANG_S):
        tasks, served = await _line_up(p, control, WAITERS)
        for turn in range(WAITERS):
            control.workers += 1  # someone else's actor went away
            await _until(lambda: len(served) > turn)  # noqa: B023 - awaited within the turn
        assert served == list(range(WAITERS))
        for task in tasks:
            await p.close(await task)
    await p.aclose()


async def test_a_waiter_whose_deadline_passes_leaves_the_line_and_the_rest_go_on() -> None:
    control = FakeControl(workers=1)
    p = _provider(control, {"initial": 300, "maximum": 300, "deadline": 600})
    async with asyncio.timeout(_HANG_S):
        holder = await p.create(SandboxSpec())
        specs = [SandboxSpec(), SandboxSpec(ready_timeout_s=0.2), SandboxSpec()]
        tasks, served = await _line_up(p, control, 3, specs)
        with pytest.raises(SubstrateCreateError, match="no free capacity"):
            await tasks[1]
        assert len(control.actors) == 3  # it deleted its actor; the holder and two wait
        await p.close(holder)
        first = await tasks[0]
        await p.close(first)
        last = await tasks[2]
        assert served == [0, 2]
        assert len(control.actors) == 1
        await p.close(last)
    await p.aclose()


async def test_a_wait_for_capacity_runs_on_the_providers_clock_and_sleep() -> None:
    """Ten minutes of five-minute backoffs with no worker freed: over at once on an injected
    clock, after the backoffs the policy asks for (half to all of `initial`, then `maximum`),
    and the error names the wait on that clock."""
    control, pace = FakeControl(workers=1), FakePace()
    p = _provider(control, {"initial": 300, "maximum": 300, "deadline": 600}, pace)
    async with asyncio.timeout(_HANG_S):
        holder = await p.create(SandboxSpec())
        with pytest.raises(SubstrateCreateError, match="no free capacity"):
            await p.create(SandboxSpec())
        assert pace.sleeps
        assert all(150 <= s <= 300 for s in pace.sleeps[:-1]), pace.sleeps
        assert 590 < pace.now <= 600 + 300  # the create's ready timeout, on that clock
        await p.close(holder)
    await p.aclose()
