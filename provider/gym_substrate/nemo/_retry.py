"""Retry as a value object: one policy type, one jittered backoff, one loop, named predicates.

Every retry in the provider is `retry_target` with a `RetryPolicy` and one of the predicates
below: control-plane calls, agent requests (exec resubmission is safe only because every
resubmission reuses the job id; file chunks carry an offset) and teardown. The HTTP and gRPC
clients never retry on their own. Full jitter keeps hundreds of rollouts that hit "no free
capacity" (RESOURCE_EXHAUSTED) at the same moment from retrying in lockstep; `wait_for_capacity`
is the loop that waits it out, counts it and says so when it gives up (`_capacity.wait_in_line`
does the same for ResumeActor, in arrival order). Every wait runs on its policy's `Pacer`, a
clock and a sleep: the event loop's own (`time.monotonic`, `asyncio.sleep`) unless the provider
was given another (`SubstrateProvider(pacer=...)`), as the router's resumer takes its clock and
sleep, so a test counts attempts and backoffs without waiting for them.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import TypeVar

from gym_substrate.nemo._metrics import METRICS
from gym_substrate.nemo.errors import (
    ActorUnavailableError,
    AgentTransportError,
    ControlPlaneError,
    NoFreeWorkersError,
    RetryError,
    RouterError,
    TransientControlPlaneError,
)

__all__ = [
    "HTTP_RETRY",
    "REAL_PACE",
    "RECONNECT_RETRY",
    "Pacer",
    "RetryPolicy",
    "is_lost_worker",
    "is_resumable",
    "is_router_glitch",
    "is_transient_control",
    "no_capacity",
    "retry_target",
    "sleep_generator",
    "through_reconnect",
    "wait_for_capacity",
]

T = TypeVar("T")


def _monotonic() -> float:
    return time.monotonic()  # looked up at each call, as a test's monkeypatch expects


async def _sleep(seconds: float) -> None:
    await asyncio.sleep(seconds)


@dataclass(frozen=True)
class Pacer:
    """The clock (seconds, monotonic) and the sleep that retries and capacity waits run on."""

    clock: Callable[[], float] = _monotonic
    sleep: Callable[[float], Awaitable[None]] = _sleep

    async def wait(self, event: asyncio.Event, seconds: float) -> None:
        """Wait for `event`, `seconds` at most: the event loop's own timeout on the real clock,
        a race against `sleep` on another."""
        if self.sleep is _sleep:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), max(0.0, seconds))
            return
        if event.is_set():
            return
        waiting = asyncio.ensure_future(event.wait())
        sleeping = asyncio.ensure_future(self.sleep(max(0.0, seconds)))
        try:
            await asyncio.wait((waiting, sleeping), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (waiting, sleeping):
                task.cancel()
            await asyncio.gather(waiting, sleeping, return_exceptions=True)


REAL_PACE = Pacer()


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter under one overall deadline (seconds), timed by
    `pacer` (the real clock and sleep unless one is injected; not part of the policy's value)."""

    initial: float = 0.1
    maximum: float = 2.0
    multiplier: float = 2.0
    deadline: float = 60.0
    pacer: Pacer = field(default=REAL_PACE, compare=False, repr=False)

    def with_deadline(self, deadline: float) -> RetryPolicy:
        return replace(self, deadline=deadline)

    def paced(self, pacer: Pacer) -> RetryPolicy:
        """This policy timed by `pacer` (a fixed policy, on the provider's clock and sleep)."""
        return replace(self, pacer=pacer)


# Agent requests through the router: short first sleeps (a reset is usually over at once).
HTTP_RETRY = RetryPolicy(initial=0.05, maximum=1.0, multiplier=2.0, deadline=60.0)


def is_transient_control(exc: BaseException) -> bool:
    """UNAVAILABLE, ABORTED, DEADLINE_EXCEEDED from ateapi."""
    return isinstance(exc, TransientControlPlaneError)


def is_resumable(exc: BaseException) -> bool:
    """What CreateActor and ResumeActor wait out: transient errors and RESOURCE_EXHAUSTED (no
    free capacity yet: workers free up as other actors park or go)."""
    return isinstance(exc, (TransientControlPlaneError, NoFreeWorkersError))


def is_router_glitch(exc: BaseException) -> bool:
    """The request may not have reached the agent: a reset, or router 421/500/502/504.

    421 is a worker that no longer hosts the actor (a stale assignment, right after it moved).
    Other router answers (404: no such actor) are final; 503 is `is_lost_worker`.
    """
    return isinstance(exc, AgentTransportError) or (
        isinstance(exc, RouterError)
        and not isinstance(exc, ActorUnavailableError)
        and exc.status in (421, 500, 502, 504)
    )


def is_lost_worker(exc: BaseException) -> bool:
    """Router 503: the router could not resume the actor within its short budget (no free
    capacity, a transition, a crash) or its queue of parked requests is full. ResumeActor over
    gRPC waits that out within our own deadline (and tells a crash apart), then ask again."""
    return isinstance(exc, ActorUnavailableError)


def sleep_generator(policy: RetryPolicy) -> Iterator[float]:
    """Yield sleeps drawn uniformly from [0, delay], the delay growing to `policy.maximum`."""
    delay = policy.initial
    while True:
        yield random.uniform(0.0, delay)
        delay = min(delay * policy.multiplier, policy.maximum)


async def retry_target(
    target: Callable[[], Awaitable[T]],
    predicate: Callable[[BaseException], bool],
    policy: RetryPolicy,
    *,
    what: str,
    on_error: Callable[[BaseException], Awaitable[None] | None] | None = None,
) -> T:
    """Await `target()` until it succeeds, a non-retryable error escapes, or the deadline passes.

    Raises `RetryError` chained to the last error when the deadline would be crossed.
    """
    clock = policy.pacer.clock
    deadline = clock() + policy.deadline
    for sleep in sleep_generator(policy):
        try:
            return await target()
        except Exception as exc:
            if not predicate(exc):
                raise
            if on_error is not None:
                maybe = on_error(exc)
                if maybe is not None:
                    await maybe
            remaining = deadline - clock()
            if remaining <= 0:
                raise RetryError(
                    f"{what} did not succeed within {policy.deadline:g} s", exc
                ) from exc
            await policy.pacer.sleep(min(sleep, remaining))
    raise AssertionError("unreachable")  # pragma: no cover


def no_capacity(what: str, waited: float, cause: BaseException) -> RetryError:
    """The error for a wait for capacity that ran out of time (and count it)."""
    METRICS.failures.labels("no_capacity").inc()
    return RetryError(
        f"{what}: no free capacity (Substrate answered RESOURCE_EXHAUSTED for {waited:.1f} "
        "s, until the deadline: every worker is full); add workers or actors per worker, "
        "park idle sandboxes (lifecycle.idle_policy), or raise create.ready_timeout_s",
        cause,
    )


async def wait_for_capacity(
    target: Callable[[], Awaitable[T]],
    policy: RetryPolicy,
    *,
    call: str,
    what: str,
    predicate: Callable[[BaseException], bool] = is_resumable,
    on_error: Callable[[BaseException], Awaitable[None] | None] | None = None,
    transient_s: float | None = None,
) -> T:
    """`retry_target` for a call that may answer RESOURCE_EXHAUSTED, within `policy.deadline`.

    Each such answer is counted (`gym_substrate_capacity_waits_total{call}`) and so is the time
    from the first one to the end of the wait. Running out of time while the last answer was
    RESOURCE_EXHAUSTED is a `RetryError` that says there was no free capacity and what to do.
    Transient codes are retried only for `transient_s` (`create.retry.deadline`) from the
    start: a control plane that is down is reported then, not at the (longer) call deadline.
    """
    clock = policy.pacer.clock
    since: float | None = None
    started = clock()

    async def attempt() -> T:
        try:
            return await target()
        except Exception as exc:
            if (
                transient_s is not None
                and is_transient_control(exc)
                and clock() - started >= transient_s
            ):
                raise RetryError(f"{what} did not succeed within {transient_s:g} s", exc) from exc
            raise

    async def note(exc: BaseException) -> None:
        nonlocal since
        if isinstance(exc, NoFreeWorkersError):
            METRICS.capacity_waits.labels(call).inc()
            if since is None:
                since = clock()
        if on_error is not None:
            maybe = on_error(exc)
            if maybe is not None:
                await maybe

    try:
        return await retry_target(attempt, predicate, policy, what=what, on_error=note)
    except RetryError as exc:
        if not isinstance(exc.cause, NoFreeWorkersError):
            raise
        waited = clock() - (since or clock())
        raise no_capacity(what, waited, exc.cause) from exc.cause
    finally:
        if since is not None:
            METRICS.capacity_wait_seconds.observe(clock() - since)


# connect() and status() look again through UNAVAILABLE quickly: a restarted control plane is
# back within about a second of listening again (the channel's reconnect backoff, `_grpc`).
RECONNECT_RETRY = RetryPolicy(initial=0.05, maximum=0.5, multiplier=2.0)


async def through_reconnect(
    call: Callable[[], Awaitable[T]], policy: RetryPolicy, *, what: str
) -> T:
    """``call`` again through UNAVAILABLE (a control plane restarting) within ``policy``; still
    down at its deadline, the last answer is raised as a single call gives it."""
    try:
        return await retry_target(call, is_transient_control, policy, what=what)
    except RetryError as exc:
        if isinstance(exc.cause, ControlPlaneError):
            raise exc.cause from exc
        raise
