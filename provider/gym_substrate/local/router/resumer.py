"""Resume on every request, one flight per actor, parking callers while it retries.

As atenet's `ActorResumer` (`cmd/atenet/internal/router/ingress/resumer.go@18d1c266`):

- Every request calls ResumeActor, RUNNING actor or not. Concurrent callers for one actor
  (key `atespace/name`) share one flight; the entry goes when the flight publishes, so the
  next request starts a fresh one. The flight outlives its callers: one that leaves does not
  stop the resume.
- The budget is per flight (from the first caller's arrival; joiners share what is left), 5 s
  by default with parking, 15 s without. An attempt in flight is never cut by it (attempts run
  detached; ateapi caps an RPC at 10 minutes), so a flight can still publish success late.
- Attempts follow `wait.Backoff{Duration: 100ms, Factor: 1.1, Jitter: 0.1}` with no cap: the
  first at once, then sleeps of d, d*1.1, ... each plus up to 10 % jitter, until the budget.
- ABORTED is always retried; RESOURCE_EXHAUSTED, FAILED_PRECONDITION and UNAVAILABLE only with
  parking on; anything else is published at once. A budget that runs out on a retryable error
  publishes that error, marked `BudgetExhausted`.
- A caller waits for free until its flight first meets a retryable error; from then on it must
  hold a place in the parking lot to keep waiting, or is shed (`ParkingFull`).
- The outcome label (`ate.router.resume`): `triggered` for the caller that started a flight that
  resumed, `joined` for the others, `none` when the actor was already RUNNING, `unknown` on an
  error or a caller that stopped waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable, Iterator
from typing import Protocol

import grpc

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.local.errors import AteapiError
from gym_substrate.local.router.errors import BudgetExhausted, ParkingFull
from gym_substrate.local.router.headers import ActorRef
from gym_substrate.local.router.parking import ParkingLot

__all__ = [
    "ATTEMPT_TIMEOUT_S",
    "DEFAULT_BUDGET_S",
    "FAIL_FAST_BUDGET_S",
    "ActorResumer",
    "ResumeApi",
    "backoff_delays",
]

log = logging.getLogger(__name__)

DEFAULT_BUDGET_S = 5.0  # --parked-request-budget
FAIL_FAST_BUDGET_S = 15.0  # failFastResumeBudget: the budget with parking off
ATTEMPT_TIMEOUT_S = 600.0  # ateapi's MaxRPCDeadline (cmd/ateapi/internal/server, id 71651480767)
DEFAULT_RETRY_INTERVAL_S = 0.1
DEFAULT_RETRY_FACTOR = 1.1
DEFAULT_RETRY_JITTER = 0.1
NONE, TRIGGERED, JOINED, UNKNOWN = "none", "triggered", "joined", "unknown"

_C = grpc.StatusCode
_PARKED_CODES = frozenset({_C.RESOURCE_EXHAUSTED, _C.FAILED_PRECONDITION, _C.UNAVAILABLE})


class ResumeApi(Protocol):
    """What the resumer needs from the API client (`resume_client.ResumeClient`)."""

    async def resume(
        self, atespace: str, name: str, timeout_s: float
    ) -> pb.ResumeActorResponse: ...

    async def close(self) -> None: ...


def backoff_delays(
    interval_s: float, factor: float, jitter: float, rng: random.Random
) -> Iterator[float]:
    """The sleeps between attempts, as `wait.Backoff.Step()` draws them (no cap, no end)."""
    duration = interval_s
    while True:
        delay = duration
        duration *= factor
        if jitter > 0:
            delay += rng.random() * jitter * delay
        yield delay


class _Flight:
    def __init__(self, leader: int) -> None:
        loop = asyncio.get_running_loop()
        self.leader = leader
        self.done: asyncio.Future[pb.ResumeActorResponse] = loop.create_future()
        self.retrying: asyncio.Future[None] = loop.create_future()
        # nobody may be left to read a failure: mark it read so asyncio does not log it
        self.done.add_done_callback(lambda f: f.cancelled() or f.exception())


class ActorResumer:
    def __init__(
        self,
        api: ResumeApi,
        lot: ParkingLot,
        *,
        budget_s: float = DEFAULT_BUDGET_S,
        retry_interval_s: float = DEFAULT_RETRY_INTERVAL_S,
        retry_factor: float = DEFAULT_RETRY_FACTOR,
        retry_jitter: float = DEFAULT_RETRY_JITTER,
        rng: random.Random | None = None,
        clock: Callable[[], float] | None = None,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> None:
        """`clock` and `sleep` time a flight's budget and backoff (default: the event loop's
        clock and `asyncio.sleep`); tests pass a fake pair to count attempts exactly."""
        # the checks of ParkedRequestConfig.Validate (parking.go@4558b166)
        if budget_s <= 0:
            raise ValueError(f"parked request budget must be > 0 seconds, got {budget_s}")
        if retry_interval_s <= 0:
            raise ValueError(f"retry interval must be > 0 seconds, got {retry_interval_s}")
        if retry_factor < 1.0:
            raise ValueError(f"retry factor must be >= 1.0, got {retry_factor}")
        if not 0 <= retry_jitter < 1:
            raise ValueError(f"retry jitter must be in [0, 1), got {retry_jitter}")
        self.api = api
        self.lot = lot
        self.budget_s = budget_s if lot.enabled else FAIL_FAST_BUDGET_S
        self._backoff = (retry_interval_s, retry_factor, retry_jitter)
        self._rng = rng or random.Random()
        self._clock = clock
        self._sleep = sleep
        self._flights: dict[str, _Flight] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._next_id = 0

    def _retryable(self, code: grpc.StatusCode) -> bool:
        return code == _C.ABORTED or (self.lot.enabled and code in _PARKED_CODES)

    async def resume(self, ref: ActorRef, *, wait_s: float) -> tuple[pb.Actor, str]:
        """The resumed actor and the outcome label; waits at most ``wait_s`` (Envoy's ext_proc
        message timeout), then raises TimeoutError while the flight goes on.

        Raises the flight's AteapiError (a `BudgetExhausted` one included) or `ParkingFull`.
        """
        self._next_id += 1
        me = self._next_id
        key = str(ref)
        flight = self._flights.get(key)
        if flight is None:
            flight = self._flights[key] = _Flight(me)
            task = asyncio.get_running_loop().create_task(self._fly(key, ref, flight))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        # phase 1: free, until the flight publishes or starts retrying
        await asyncio.wait(
            (flight.done, flight.retrying), timeout=wait_s, return_when=asyncio.FIRST_COMPLETED
        )
        if flight.done.done():
            return self._result(flight, me)
        if not flight.retrying.done():
            raise TimeoutError  # before any place was taken: no parking outcome
        # phase 2: parked, holding a place
        place = self.lot.enter()
        if place is None:
            raise ParkingFull
        try:
            await asyncio.wait((flight.done,), timeout=max(0.0, deadline - loop.time()))
        except asyncio.CancelledError:
            place.release("canceled")
            raise
        if not flight.done.done():
            # Envoy gave up and closed the ext_proc stream: the handler sees a cancelled context
            place.release("canceled")
            raise TimeoutError
        try:
            result = self._result(flight, me)
        except BudgetExhausted:
            place.release("budget_exhausted")
            raise
        except BaseException:
            place.release("error")
            raise
        place.release("served")
        return result

    @staticmethod
    def _result(flight: _Flight, me: int) -> tuple[pb.Actor, str]:
        response = flight.done.result()
        if not response.resumed:
            return response.actor, NONE
        return response.actor, TRIGGERED if flight.leader == me else JOINED

    async def _fly(self, key: str, ref: ActorRef, flight: _Flight) -> None:
        """Attempts until success, a non-retryable error or the budget; then publish."""
        now = self._clock or asyncio.get_running_loop().time
        deadline = now() + self.budget_s
        delays = backoff_delays(*self._backoff, self._rng)
        last_retryable: AteapiError | None = None
        outcome: pb.ResumeActorResponse | BaseException = AteapiError(_C.UNKNOWN, "resume ended")
        try:
            while True:
                if last_retryable is not None and now() >= deadline:
                    outcome = BudgetExhausted(last_retryable)
                    break
                try:
                    outcome = await self.api.resume(ref.atespace, ref.name, ATTEMPT_TIMEOUT_S)
                    break
                except AteapiError as exc:
                    if not self._retryable(exc.code):
                        outcome = exc
                        break
                    last_retryable = exc
                    if not flight.retrying.done():
                        flight.retrying.set_result(None)
                except Exception as exc:  # a client bug, not an API answer: atenet's 500
                    log.exception("ResumeActor of %s failed", ref)
                    outcome = AteapiError(_C.UNKNOWN, str(exc))
                    break
                remaining = deadline - now()
                if remaining > 0:
                    await self._sleep(min(next(delays), remaining))
        except asyncio.CancelledError:
            outcome = AteapiError(_C.CANCELLED, "router closed")
            raise
        finally:
            if self._flights.get(key) is flight:
                del self._flights[key]
            if isinstance(outcome, BaseException):
                flight.done.set_exception(outcome)
            else:
                flight.done.set_result(outcome)

    async def close(self) -> None:
        """Stop every flight (their callers get CANCELLED); the API client is closed too."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.api.close()
