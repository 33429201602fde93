"""Waiting for a free worker in arrival order, at the cost of a few calls per wait.

With every caller retrying RESOURCE_EXHAUSTED on its own jittered schedule, whoever happened to
ask right after a worker freed up got it: with the provider's defaults 3 of 32 gVisor creates
failed with "no free workers" after 120 s while later ones went through, and two 4x `compare`
runs called ResumeActor about 1,400 times for 180 real resumes (issues 22 and 24).

Here the resumes of one process that wait for capacity form a line, one per control client (so
per connection and event loop, as `_shared` keys them): only its head asks again, backing off
(initial to maximum of `create.retry`, with equal jitter so it never spins), and the others
wait their turn without a call. A caller that arrives while others wait goes to the back
without asking first. When this process parks or deletes an actor (`freed`), the head asks at
once instead of at its next backoff. The head that gets a worker leaves and the next one asks
straight away. Other processes still compete: the line is as fair as one process can make it.
"""

from __future__ import annotations

import asyncio
import random
import weakref
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

from gym_substrate.nemo._metrics import METRICS
from gym_substrate.nemo._retry import (
    REAL_PACE,
    Pacer,
    RetryPolicy,
    is_transient_control,
    no_capacity,
    sleep_generator,
)
from gym_substrate.nemo.errors import NoFreeWorkersError, RetryError

__all__ = ["CapacityQueue", "queue_for", "wait_in_line"]

T = TypeVar("T")


class _Ticket:
    __slots__ = ("turn",)

    def __init__(self) -> None:
        self.turn = asyncio.Event()


class CapacityQueue:
    """The callers of one process waiting for capacity, first come first served."""

    def __init__(self) -> None:
        self._line: deque[_Ticket] = deque()
        self._freed = asyncio.Event()

    @property
    def waiting(self) -> int:
        return len(self._line)

    def join(self) -> _Ticket:
        ticket = _Ticket()
        self._line.append(ticket)
        if self._line[0] is ticket:
            ticket.turn.set()
        return ticket

    def ahead_of(self, ticket: _Ticket) -> int:
        return self._line.index(ticket) if ticket in self._line else 0

    async def turn(self, ticket: _Ticket, within: float, pacer: Pacer = REAL_PACE) -> bool:
        """Wait until `ticket` heads the line; False when `within` seconds passed first."""
        await pacer.wait(ticket.turn, within)
        return ticket.turn.is_set()

    async def rest(self, seconds: float, pacer: Pacer = REAL_PACE) -> None:
        """The head's backoff: over early when this process frees capacity."""
        await pacer.wait(self._freed, seconds)

    def asking(self) -> None:
        """The head is about to ask: what was freed before is seen by this call."""
        self._freed.clear()

    def leave(self, ticket: _Ticket) -> None:
        try:
            self._line.remove(ticket)
        except ValueError:
            return
        if self._line:
            self._line[0].turn.set()

    def freed(self) -> None:
        """This process parked or deleted an actor: a worker may be free now."""
        if self._line:
            self._freed.set()


_queues: weakref.WeakKeyDictionary[Any, dict[str, CapacityQueue]] = weakref.WeakKeyDictionary()


def queue_for(control: object, call: str) -> CapacityQueue:
    """The line for `call` (e.g. ResumeActor) on this control client."""
    try:
        per_call = _queues.setdefault(control, {})
    except TypeError:  # a client that cannot be weakly referenced: a line of its own
        return CapacityQueue()
    return per_call.setdefault(call, CapacityQueue())


def _pauses(policy: RetryPolicy) -> Iterator[float]:
    """The head's sleeps: equal jitter, so a line of hundreds costs a call per pause, no more."""
    delay = policy.initial
    while True:
        yield delay / 2 + random.uniform(0.0, delay / 2)
        delay = min(delay * policy.multiplier, policy.maximum)


async def wait_in_line(
    target: Callable[[], Awaitable[T]],
    policy: RetryPolicy,
    queue: CapacityQueue,
    *,
    call: str,
    what: str,
    predicate: Callable[[BaseException], bool],
    transient_s: float | None = None,
    first: bool = False,
) -> T:
    """`wait_for_capacity` (`_retry`) in arrival order: RESOURCE_EXHAUSTED puts the caller in
    `queue`; other errors that `predicate` accepts are retried with full jitter as there.

    `first`: ask once before joining a line that is not empty (an actor that should already be
    running, whose resume needs no worker).
    """
    pacer = policy.pacer
    clock = pacer.clock
    started = clock()
    deadline = started + policy.deadline
    since: float | None = None
    ticket: _Ticket | None = None
    pauses, sleeps = _pauses(policy), sleep_generator(policy)
    try:
        if queue.waiting and not first:
            ticket = queue.join()
        while True:
            if ticket is not None and not await queue.turn(ticket, deadline - clock(), pacer):
                ahead = queue.ahead_of(ticket)
                cause = NoFreeWorkersError(
                    f"{call}: RESOURCE_EXHAUSTED: {ahead} earlier call(s) of this process were "
                    "still waiting for a free worker",
                    method=call,
                )
                raise no_capacity(what, clock() - (since or started), cause)
            if ticket is not None:
                queue.asking()
            try:
                return await target()
            except Exception as exc:
                now = clock()
                if isinstance(exc, NoFreeWorkersError):
                    METRICS.capacity_waits.labels(call).inc()
                    since = now if since is None else since
                    if ticket is None:
                        ticket = queue.join()
                        if not ticket.turn.is_set():
                            continue  # behind others: wait for the turn, no call meanwhile
                    if deadline - now <= 0:
                        raise no_capacity(what, now - since, exc) from exc
                    await queue.rest(min(next(pauses), deadline - now), pacer)
                    continue
                if not predicate(exc):
                    raise
                transient = transient_s is not None and is_transient_control(exc)
                if transient and now - started >= (transient_s or 0.0):
                    raise RetryError(
                        f"{what} did not succeed within {transient_s:g} s", exc
                    ) from exc
                if deadline - now <= 0:
                    raise RetryError(
                        f"{what} did not succeed within {policy.deadline:g} s", exc
                    ) from exc
                await pacer.sleep(min(next(sleeps), deadline - now))
    finally:
        if ticket is not None:
            queue.leave(ticket)
        if since is not None:
            METRICS.capacity_wait_seconds.observe(clock() - since)
