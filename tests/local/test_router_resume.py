"""The router's resume on every request: flights, backoff, parking and the error table.

Against a scripted ateapi over real gRPC (router_fakes.FakeControl). Budgets and retry
intervals are constructor parameters, scaled down here; bounds on time are one-sided. Each
docstring names the upstream file (agent-substrate/substrate at 18d1c266, a tree between
v0.3.0 and v0.4.0; atenet is not stored at 2179589f).
"""

from __future__ import annotations

import asyncio
import random
import re
import time
from typing import Any

import aiohttp
import grpc
import pytest
from router_fakes import Fail, RouterEnv, running, target, until

from gym_substrate.local.errors import AteapiError
from gym_substrate.local.metrics import Metrics
from gym_substrate.local.router import Router
from gym_substrate.local.router.errors import BudgetExhausted
from gym_substrate.local.router.headers import ActorRef
from gym_substrate.local.router.parking import ParkingLot
from gym_substrate.local.router.resumer import ActorResumer, backoff_delays

C = grpc.StatusCode
FAST = {"retry_interval_s": 0.01}  # attempts 10 ms apart instead of atenet's 100 ms


def _always(answer: Any) -> Any:
    async def script(ref: str, attempt: int) -> Any:
        return answer

    return script


def _until(attempts: int, failure: Fail, *, resumed: bool = True) -> Any:
    """``failure`` for the first ``attempts`` calls, then RUNNING."""

    async def script(ref: str, attempt: int) -> Any:
        if attempt <= attempts:
            return failure
        return running(ref.partition("/")[2], atespace=ref.partition("/")[0], resumed=resumed)

    return script


async def _get(env: RouterEnv, ref: str = "t/a") -> tuple[int, str, Any, float]:
    started = time.monotonic()
    async with (
        aiohttp.ClientSession() as http,
        http.get(env.url + "/", headers=target(ref)) as response,
    ):
        text = await response.text()
        return response.status, text, response.headers, time.monotonic() - started


def _route(env: RouterEnv, outcome: str, resume: str, template: str = "unknown") -> float:
    labels = {
        "ate_template_atespace": "local" if template == "known" else "unknown",
        "ate_template_name": "sandbox" if template == "known" else "unknown",
        "ate_router_outcome": outcome,
        "ate_router_resume": resume,
    }
    return env.sample("atenet_router_route_duration_seconds_count", labels)


def _waits(env: RouterEnv, outcome: str) -> float:
    return env.sample("atenet_router_parking_wait_duration_seconds_count", {"outcome": outcome})


# (gRPC code, message, HTTP status, body, ate.router.outcome)
_TABLE = [
    (C.NOT_FOUND, "Actor t/a not found", 404, "actor t/a not found", "not_found"),
    (
        C.FAILED_PRECONDITION,
        "AssignWorker prerequisite not met for Actor: t/a (got: ACTOR_STATE_CRASHED, "
        "want ACTOR_STATE_SUSPENDED or ACTOR_STATE_PAUSED)",
        503,
        "actor t/a unavailable: AssignWorker prerequisite not met for Actor: t/a (got: "
        "ACTOR_STATE_CRASHED, want ACTOR_STATE_SUSPENDED or ACTOR_STATE_PAUSED)",
        "failed_precondition",
    ),
    (
        C.ABORTED,
        "another operation is in progress for this actor",
        503,
        "actor t/a unavailable: another operation is in progress for this actor",
        "lock_conflict",
    ),
    (C.UNAVAILABLE, "connection refused", 503, "actor t/a unavailable", "unavailable"),
    (
        C.RESOURCE_EXHAUSTED,
        "no free workers available",
        503,
        "actor t/a unavailable: no free workers available",
        "no_capacity",
    ),
    (
        C.DEADLINE_EXCEEDED,
        "context deadline exceeded",
        504,
        "actor t/a request timed out",
        "timeout",
    ),
    (C.PERMISSION_DENIED, "no", 403, "actor t/a access denied", "resume_error"),
    (C.UNAUTHENTICATED, "no token", 401, "actor t/a authentication required", "resume_error"),
    (C.INTERNAL, "boom", 500, "error resuming actor t/a", "resume_error"),
    (C.DATA_LOSS, "actor t/a crashed", 500, "error resuming actor t/a", "resume_error"),
    (C.UNKNOWN, "?", 500, "error resuming actor t/a", "resume_error"),
    (C.INVALID_ARGUMENT, "bad", 500, "error resuming actor t/a", "resume_error"),
]


@pytest.mark.parametrize(("code", "message", "status", "body", "outcome"), _TABLE)
async def test_resume_errors_map_to_atenets_statuses_and_bodies(
    code: grpc.StatusCode, message: str, status: int, body: str, outcome: str
) -> None:
    """`mapResumeError` (cmd/atenet/internal/router/ingress/errors.go@18d1c266): `<ref>`
    unquoted, the gRPC description kept for FAILED_PRECONDITION, ABORTED and
    RESOURCE_EXHAUSTED only, anything unlisted 500; retryable codes first retry for the
    budget (scaled to 50 ms). The route outcome is `classifyOutcome`'s
    (extproc/metrics_test.go@2e3e300a), the resume label `unknown`."""
    options = {"parked_request_budget_s": 0.05, **FAST}
    async with RouterEnv(_always(Fail(code, message)), **options) as env:
        got, text, headers, _ = await _get(env)
        assert (got, text) == (status, body)
        assert headers["Content-Type"] == "text/plain"
        assert headers["Server"] == "envoy"
        assert _route(env, outcome, "unknown") == 1


async def test_a_non_retryable_error_is_answered_after_one_call() -> None:
    """Only ABORTED (always) and RESOURCE_EXHAUSTED, FAILED_PRECONDITION, UNAVAILABLE (with
    parking) are retried (`retryable`, ingress/resumer.go@18d1c266); NOT_FOUND is answered at
    once, well inside the 5 s budget, and touches no parking place."""
    async with RouterEnv(_always(Fail(C.NOT_FOUND, "Actor t/a not found"))) as env:
        status, _, _, _ = await _get(env)
        assert status == 404
        assert env.control.calls == ["t/a"]  # one call, no retry, so no wait on the budget
        assert env.sample("atenet_router_parking_active") == 0
        assert _waits(env, "error") == 0


async def test_aborted_is_retried_until_the_lease_is_free() -> None:
    """ABORTED (another operation holds the actor's lease, controlapi/workflow.go@18d1c266)
    is retried in every mode; the request is served once it clears."""
    for lot in (1024, 0):
        script = _until(2, Fail(C.ABORTED, "another operation is in progress for this actor"))
        async with RouterEnv(script, parked_request_max=lot, **FAST) as env:
            status, _, _, _ = await _get(env)
            assert status == 200
            assert env.control.calls == ["t/a"] * 3


async def test_a_parked_request_is_served_once_capacity_frees() -> None:
    """RESOURCE_EXHAUSTED parks the request and the flight retries (parking.go@4558b166); when
    a worker frees the request is served: its place is released as `served`, its route timed
    as `triggered` (the actor was resumed by this request's flight)."""
    script = _until(3, Fail(C.RESOURCE_EXHAUSTED, "no free workers available"))
    async with RouterEnv(script, **FAST) as env:
        status, _, _, _ = await _get(env)
        assert status == 200
        assert env.control.calls == ["t/a"] * 4
        assert _waits(env, "served") == 1
        assert env.sample("atenet_router_parking_active") == 0
        assert _route(env, "ok", "triggered", template="known") == 1


async def test_the_budget_runs_out_on_a_retryable_error() -> None:
    """A flight still blocked on a retryable error when its budget ends publishes that error
    (`budgetExhaustedError`, resumer.go@18d1c266): the capacity 503 with its description, the
    place released as `budget_exhausted`; the flight kept retrying meanwhile."""
    script = _always(Fail(C.RESOURCE_EXHAUSTED, "no free workers available"))
    async with RouterEnv(script, parked_request_budget_s=0.3, **FAST) as env:
        status, text, _, took = await _get(env)
        assert (status, text) == (503, "actor t/a unavailable: no free workers available")
        assert took >= 0.3
        assert len(env.control.calls) >= 3
        assert _waits(env, "budget_exhausted") == 1


@pytest.mark.slow  # waits out a real router deadline (over the fast lane's 50 ms sleeps)
async def test_concurrent_requests_share_one_flight() -> None:
    """Callers for one actor attach to one flight (key `atespace/name`), which is removed when
    it publishes, so the next request starts a fresh one (resumer.go@18d1c266). With
    `resumed=true` the caller that started it is `triggered`, the others `joined`; an
    already RUNNING actor (`resumed=false`) is `none` (metrics.yaml@09c2ac9c)."""
    release = asyncio.Event()

    async def held(ref: str, attempt: int) -> Any:
        if attempt == 1:
            await release.wait()
            return running("a", resumed=True)
        return running("a")

    async with RouterEnv(held) as env:
        requests = [asyncio.ensure_future(_get(env))]
        await until(lambda: bool(env.control.calls))
        requests += [asyncio.ensure_future(_get(env)) for _ in range(4)]
        await asyncio.sleep(0.2)
        assert env.control.calls == ["t/a"]  # the later four joined the flight in the air
        release.set()
        assert [status for status, *_ in await asyncio.gather(*requests)] == [200] * 5
        assert _route(env, "ok", "triggered", template="known") == 1
        assert _route(env, "ok", "joined", template="known") == 4
        assert (await _get(env))[0] == 200  # a fresh flight: the entry went with the last one
        assert env.control.calls == ["t/a", "t/a"]
        assert _route(env, "ok", "none", template="known") == 1


@pytest.mark.slow  # an upper bound on a measured wait: load-sensitive, so not in the fast lane
async def test_the_budget_is_per_flight_and_joiners_share_what_is_left() -> None:
    """The budget starts with the first caller; later joiners share what remains
    (`runFlight`, resumer.go@18d1c266), so a joiner arriving half-way waits less than a whole
    budget and gets the same answer."""
    script = _always(Fail(C.RESOURCE_EXHAUSTED, "no free workers available"))
    async with RouterEnv(script, parked_request_budget_s=0.8, **FAST) as env:
        leader = asyncio.ensure_future(_get(env))
        await asyncio.sleep(0.4)
        joiner = await _get(env)
        assert joiner[:2] == (503, "actor t/a unavailable: no free workers available")
        assert joiner[3] < 0.8  # not a budget of its own
        assert (await leader)[0] == 503
        assert _waits(env, "budget_exhausted") == 2


@pytest.mark.slow  # waits out a real router deadline (over the fast lane's 50 ms sleeps)
async def test_an_attempt_in_flight_is_not_cut_by_the_budget() -> None:
    """Attempts run detached from the budget's context (`context.WithoutCancel`,
    resumer.go@18d1c266): a resume slower than the budget still publishes its success, and
    the request is served while Envoy still waits (its ext_proc timeout is the budget + 5 s,
    dataplane.go@18d1c266)."""

    async def slow(ref: str, attempt: int) -> Any:
        await asyncio.sleep(0.5)
        return running("a", resumed=True)

    async with RouterEnv(slow, parked_request_budget_s=0.1) as env:
        assert env.router is not None
        assert env.router.extproc_timeout_s == pytest.approx(5.1)
        status, _, _, _ = await _get(env)
        assert status == 200
        assert env.control.calls == ["t/a"]


async def test_envoys_ext_proc_timeout_is_a_bodiless_504_and_the_flight_goes_on() -> None:
    """When ext_proc does not answer within its message timeout Envoy answers itself, 504 with
    no body; the flight, detached from its callers, goes on, and its success serves the
    requests still attached (dataplane.go@18d1c266, resumer.go@18d1c266). Timed as
    `cancelled`: the handler sees its stream context end."""
    release = asyncio.Event()

    async def held(ref: str, attempt: int) -> Any:
        await release.wait()
        return running("a", resumed=True)

    async with RouterEnv(held, extproc_timeout_s=0.3) as env:
        status, text, headers, _ = await _get(env)
        assert (status, text, headers["Server"]) == (504, "", "envoy")
        assert _route(env, "cancelled", "unknown") == 1
        late = asyncio.ensure_future(_get(env))  # joins the flight still in the air
        await asyncio.sleep(0.05)
        release.set()
        assert (await late)[0] == 200
        assert env.control.calls == ["t/a"]


async def test_a_full_lot_sheds_with_the_quoted_503_and_spares_running_actors() -> None:
    """One lot per router; a caller takes a place only at its flight's first retryable error
    (#1081), so a request to a running actor never waits on a full lot; a caller that finds
    it full is shed at once: 503 `actor "<ref>" unavailable: router at capacity` (Go's %q),
    text/plain, no Retry-After (ingress/errors.go@18d1c266, parking.go@4558b166), counted in
    `atenet_router_parking_rejected_total`; it is timed as `unavailable`
    (extproc/metrics_test.go@2e3e300a)."""

    async def script(ref: str, attempt: int) -> Any:
        if ref == "t/a":
            return running("a")
        return Fail(C.RESOURCE_EXHAUSTED, "no free workers available")

    async with RouterEnv(script, parked_request_max=1, parked_request_budget_s=2.0, **FAST) as env:
        parked = asyncio.ensure_future(_get(env, "t/b"))
        await until(lambda: env.sample("atenet_router_parking_active") == 1)
        status, text, headers, _ = await _get(env, "t/c")
        assert (status, text) == (503, 'actor "t/c" unavailable: router at capacity')
        assert headers["Content-Type"] == "text/plain"
        assert "Retry-After" not in headers
        assert not parked.done()  # shed at once, while the parked caller still waits its 2 s
        assert env.sample("atenet_router_parking_rejected_total") == 1
        assert _route(env, "unavailable", "unknown") == 1
        assert (await _get(env, "t/a"))[0] == 200  # running: the full lot is not in its way
        parked.cancel()


async def test_parking_disabled_fails_fast_and_counts_nothing() -> None:
    """`--parked-request-max=0` disables parking: capacity errors are answered after one
    call, only ABORTED is retried, and no parking metric moves (parking.go@4558b166,
    resumer.go@18d1c266 `withParking`)."""
    script = _always(Fail(C.RESOURCE_EXHAUSTED, "no free workers available"))
    async with RouterEnv(script, parked_request_max=0) as env:
        status, text, _, _ = await _get(env)
        assert (status, text) == (503, "actor t/a unavailable: no free workers available")
        assert env.control.calls == ["t/a"]
        assert env.sample("atenet_router_parking_rejected_total") == 0
        assert _waits(env, "budget_exhausted") + _waits(env, "error") == 0
        assert env.router is not None
        assert env.router.extproc_timeout_s == 5.0  # no budget to wait for


async def test_retries_follow_atenets_backoff() -> None:
    """`wait.Backoff{Duration: 100ms, Factor: 1.1, Jitter: 0.1}` with no cap
    (resumeBackoff, resumer.go@18d1c266; flag defaults in parking.go@4558b166): sleep n is
    0.1 s x 1.1^n plus up to 10 %; the first attempt runs at once (the next test counts the
    attempts a 1 s budget holds: no hot loop against ateapi)."""
    delays = backoff_delays(0.1, 1.1, 0.1, random.Random(7))
    for n in range(30):
        base = 0.1 * 1.1**n
        assert base <= next(delays) <= base * 1.1 + 1e-12
    exact = backoff_delays(0.1, 1.1, 0.0, random.Random(7))
    assert [round(next(exact), 6) for _ in range(3)] == [0.1, 0.11, 0.121]


async def test_a_1_s_budget_holds_8_attempts_on_an_injected_clock() -> None:
    """With atenet's defaults and no jitter, a 1 s budget holds exactly 8 attempts: at 0,
    0.1, 0.21, ... 0.949 s; the last sleep is cut to the budget, which then publishes the
    capacity error as `BudgetExhausted` (resumer.go@18d1c266). Timed on an injected clock and
    sleep, so the count is exact however loaded the machine (jitter only lengthens sleeps)."""
    now = [0.0]
    attempts: list[float] = []

    async def sleep(seconds: float) -> None:
        now[0] += seconds
        await asyncio.sleep(0)

    class Api:
        async def resume(self, atespace: str, name: str, timeout_s: float) -> Any:
            attempts.append(round(now[0], 6))
            raise AteapiError(C.RESOURCE_EXHAUSTED, "no free workers available")

        async def close(self) -> None:
            return None

    lot = ParkingLot(8, Metrics())
    resumer = ActorResumer(
        Api(), lot, budget_s=1.0, retry_jitter=0.0, clock=lambda: now[0], sleep=sleep
    )
    with pytest.raises(BudgetExhausted, match="no free workers available"):
        await resumer.resume(ActorRef("t", "a"), wait_s=30)
    assert [round(t, 3) for t in attempts] == [0, 0.1, 0.21, 0.331, 0.464, 0.611, 0.772, 0.949]
    assert now[0] == pytest.approx(1.0)
    await resumer.close()


def test_parking_and_retry_settings_are_validated() -> None:
    """`ParkedRequestConfig.Validate` (parking.go@4558b166): factor >= 1, jitter in [0, 1);
    and no negative lot, no budget or timeout <= 0, each with the value named."""
    plane: Any = type("P", (), {"sandbox_listeners": []})()
    api: Any = object()
    for options, words in (
        ({"retry_factor": 0.9}, "retry factor must be >= 1.0, got 0.9"),
        ({"retry_jitter": 1.0}, "retry jitter must be in [0, 1), got 1.0"),
        ({"parked_request_max": -1}, "parked_request_max must be >= 0"),
        ({"parked_request_budget_s": 0}, "budget must be > 0 seconds, got 0"),
        ({"route_timeout_s": 0}, "route_timeout_s must be > 0 seconds, got 0"),
        ({"retry_interval_s": -1}, "retry interval must be > 0 seconds, got -1"),
    ):
        with pytest.raises(ValueError, match=re.escape(words)):
            Router(plane, api, Metrics(), **options)
