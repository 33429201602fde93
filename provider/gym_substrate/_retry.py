"""Retry as a value object: one policy type, one jittered backoff, one loop, named predicates.

Every retry in the provider is `retry_target` with a `RetryPolicy` and one of the predicates
below: control-plane calls, agent requests (exec resubmission is safe only because every
resubmission reuses the job id; file chunks carry an offset) and teardown. The HTTP and gRPC
clients never retry on their own. Full jitter keeps hundreds of rollouts that hit "no free
workers" at the same moment from retrying in lockstep.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, replace
from typing import TypeVar

from gym_substrate._errors import (
    ActorUnavailableError,
    AgentTransportError,
    NoFreeWorkersError,
    RetryError,
    RouterError,
    TransientControlPlaneError,
)

__all__ = [
    "HTTP_RETRY",
    "RetryPolicy",
    "is_lost_worker",
    "is_resumable",
    "is_router_glitch",
    "is_transient_control",
    "retry_target",
    "sleep_generator",
]

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter under one overall deadline (seconds)."""

    initial: float = 0.1
    maximum: float = 2.0
    multiplier: float = 2.0
    deadline: float = 60.0

    def with_deadline(self, deadline: float) -> RetryPolicy:
        return replace(self, deadline=deadline)


# Agent requests through the router: short first sleeps (a reset is usually over at once).
HTTP_RETRY = RetryPolicy(initial=0.05, maximum=1.0, multiplier=2.0, deadline=60.0)


def is_transient_control(exc: BaseException) -> bool:
    """UNAVAILABLE, ABORTED, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED from ateapi."""
    return isinstance(exc, TransientControlPlaneError)


def is_resumable(exc: BaseException) -> bool:
    """What a ResumeActor waits out: transient errors and "no free workers" (workers free up)."""
    return isinstance(exc, (TransientControlPlaneError, NoFreeWorkersError))


def is_router_glitch(exc: BaseException) -> bool:
    """The request may not have reached the agent: a reset, or router 500/502/504.

    Other router answers (404: no such actor) are final; 503 is `is_lost_worker`.
    """
    return isinstance(exc, AgentTransportError) or (
        isinstance(exc, RouterError)
        and not isinstance(exc, ActorUnavailableError)
        and exc.status in (500, 502, 504)
    )


def is_lost_worker(exc: BaseException) -> bool:
    """Router 503: the actor has no worker; ResumeActor over gRPC, then ask again."""
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
    deadline = time.monotonic() + policy.deadline
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
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RetryError(
                    f"{what} did not succeed within {policy.deadline:g} s", exc
                ) from exc
            await asyncio.sleep(min(sleep, remaining))
    raise AssertionError("unreachable")  # pragma: no cover
