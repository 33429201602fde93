"""Retry as a value object: one policy type, one jittered backoff, one loop.

Retries live in the control-plane layer (and in exec's resubmission, which is safe only because
every resubmission reuses the job id), never hidden inside the HTTP client. Full jitter keeps
hundreds of rollouts that hit "no free workers" at the same moment from retrying in lockstep.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, replace
from typing import TypeVar

from gym_substrate._errors import RetryError

__all__ = ["RetryPolicy", "retry_target", "sleep_generator"]

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
