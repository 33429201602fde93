"""The router on a real LocalBackend fails the way Substrate's router (Envoy + atenet) fails.

One test per behaviour, on both local runtimes (process and gVisor), with the real limits: the
5 s parked-request budget, the budget + 5 s ext_proc timeout, routing by `ate-target-actor`,
atunnel's headers and 502, the crash of an actor whose workload died. Each docstring says what
the real one does and where (agent-substrate/substrate at 18d1c266: a tree between v0.3.0 and
v0.4.0, as atenet is not stored at 2179589f; the router reads no message the eras change).
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from local_helpers import RUNTIMES, late_workload, make_actor, poll, workload_actor
from router_fakes import target

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.local import LocalBackend
from gym_substrate.local.statedir import read_backend_info

_ECHO = Path(__file__).with_name("echo_agent.py")
_CONTROL = pb.DESCRIPTOR.services_by_name["Control"].full_name


@pytest.fixture(params=RUNTIMES)
def runtime_name(request: pytest.FixtureRequest) -> str:
    """Every test here runs on both local runtimes."""
    name: str = request.param
    return name


def _ref(name: str) -> pb.ObjectRef:
    return pb.ObjectRef(atespace="t", name=name)


async def _state(stub: Any, name: str) -> int:
    actor = await stub.GetActor(pb.GetActorRequest(actor=_ref(name)))
    return int(actor.status.state)


async def _get(
    http: aiohttp.ClientSession, url: str, headers: dict[str, str]
) -> tuple[int, bytes, Any, float]:
    """(status, body, headers, seconds) of one GET."""
    started = time.monotonic()
    async with http.get(url, headers=headers) as response:
        body = await response.read()
        return response.status, body, response.headers, time.monotonic() - started


async def _port_open(backend: LocalBackend, name: str, port: int) -> bool:
    """True when the actor's own address answers TCP on ``port``."""
    assert backend.plane is not None
    record = backend.plane.lookup("t", name)
    if record is None or not record.address:
        return False
    host = record.address.rsplit(":", 1)[0] if record.address.count(":") == 1 else record.address
    try:
        _, writer = await asyncio.open_connection(host, port)
    except OSError:
        return False
    writer.close()
    return True


def _resume_rpcs(backend: LocalBackend, code: str) -> float:
    """How many ResumeActor calls the API server has answered with ``code``."""
    value = backend.metrics.registry.get_sample_value(
        "rpc_server_call_duration_seconds_count",
        {"rpc_method": f"{_CONTROL}/ResumeActor", "rpc_response_status_code": code},
    )
    return value or 0.0


async def test_each_routed_request_is_one_resume_actor_rpc_on_the_api_server(
    stub: Any, backend: LocalBackend, http: aiohttp.ClientSession
) -> None:
    """real: the router calls ateapi's ResumeActor over gRPC for every request, RUNNING actor
    or not (cmd/atenet/internal/router/ingress/resumer.go@18d1c266), so the API server counts
    one per routed request; a request without a reference costs none (ingress.go@18d1c266),
    and an unknown actor is asked once and answered `404 actor <ref> not found`
    (ingress/errors.go@18d1c266)."""
    await make_actor(stub, "counted")
    url = f"{backend.router_url}/readyz"
    before = _resume_rpcs(backend, "OK")
    for _ in range(5):  # the first resumes the SUSPENDED actor, the others find it RUNNING
        status, body, _, _ = await _get(http, url, target("t/counted"))
        assert status == 200, body
    assert _resume_rpcs(backend, "OK") - before == 5
    status, body, _, _ = await _get(http, url, {"Host": "127.0.0.1"})
    assert (status, body) == (404, b"invalid actor reference")
    assert _resume_rpcs(backend, "OK") - before == 5
    refused = _resume_rpcs(backend, "NOT_FOUND")
    status, body, _, _ = await _get(http, url, target("t/no-such-actor"))
    assert (status, body) == (404, b"actor t/no-such-actor not found")
    assert _resume_rpcs(backend, "NOT_FOUND") - refused == 1
    await stub.SuspendActor(pb.SuspendActorRequest(actor=_ref("counted")))


async def test_a_suspended_actor_resumes_on_demand_and_sees_atunnels_headers(
    stub: Any, backend: LocalBackend, http: aiohttp.ClientSession
) -> None:
    """real: the first request resumes a SUSPENDED actor (timed `triggered`, then `none`,
    docs/metrics/registry/metrics.yaml@09c2ac9c); the actor gets the client's Host unchanged,
    no `ate-target-actor`, and atunnel's X-Forwarded-For/-Host/-Proto (internal/atunnel/
    ingress.go, read_file id 68666963451); Envoy's x-request-id and
    x-envoy-expected-rq-timeout-ms of the 5 min route timeout (xds.go@18d1c266)."""
    echo = (sys.executable, str(_ECHO), "--host", "0.0.0.0", "--port", "80")
    await workload_actor(stub, backend, "echo", echo)
    assert await _state(stub, "echo") == pb.ACTOR_STATE_SUSPENDED
    status, body, back, _ = await _get(
        http, f"{backend.router_url}/p?q=1", target("t/echo", Host="app.example.com")
    )
    assert status == 200, body
    assert back.getall("Server") == ["envoy"]
    seen = {name.lower(): value for name, value in json.loads(body)["headers"]}
    assert seen["host"] == "app.example.com"
    assert "ate-target-actor" not in seen
    assert "x-ate-target-port" not in seen
    assert (seen["x-forwarded-host"], seen["x-forwarded-proto"]) == ("app.example.com", "https")
    assert seen["x-envoy-expected-rq-timeout-ms"] == "300000"
    assert seen["x-request-id"]
    assert await _state(stub, "echo") == pb.ACTOR_STATE_RUNNING
    status, _, _, _ = await _get(http, f"{backend.router_url}/p", target("t/echo"))
    assert status == 200
    metrics = backend.metrics.render().decode()
    assert 'ate_router_outcome="ok",ate_router_resume="triggered"' in metrics
    assert 'ate_router_outcome="ok",ate_router_resume="none"' in metrics
    await stub.SuspendActor(pb.SuspendActorRequest(actor=_ref("echo")))


@pytest.mark.slow
@pytest.mark.parametrize("backend_options", [{"workers": 1}])
async def test_no_free_worker_parks_the_request_until_one_frees(
    stub: Any, backend: LocalBackend, http: aiohttp.ClientSession
) -> None:
    """real: no capacity is RESOURCE_EXHAUSTED `no free workers available`; the router parks
    the request and retries within the 5 s budget (ingress/parking.go@4558b166,
    resumer.go@18d1c266): freed in time, the request is served; never freed, it is
    `503 actor t/b unavailable: no free workers available` once the budget is spent."""
    await make_actor(stub, "a")
    await make_actor(stub, "b")
    await stub.ResumeActor(pb.ResumeActorRequest(actor=_ref("a")))
    url = f"{backend.router_url}/readyz"
    status, body, _, took = await _get(http, url, target("t/b"))
    assert (status, body) == (503, b"actor t/b unavailable: no free workers available")
    assert took >= 5.0  # parked for the whole budget, retrying
    parked = asyncio.ensure_future(_get(http, url, target("t/b")))
    await asyncio.sleep(0.5)
    await stub.SuspendActor(pb.SuspendActorRequest(actor=_ref("a")))  # frees the worker
    status, body, _, _ = await parked
    assert status == 200, body
    waits = backend.metrics.registry.get_sample_value(
        "atenet_router_parking_wait_duration_seconds_count", {"outcome": "served"}
    )
    assert waits == 1
    await stub.SuspendActor(pb.SuspendActorRequest(actor=_ref("b")))


@pytest.mark.slow
async def test_a_dead_workload_is_502_then_its_crashed_actor_is_503_until_reverted(
    stub: Any, backend: LocalBackend, http: aiohttp.ClientSession
) -> None:
    """real: a request that finds the workload dead gets atunnel's `502 bad gateway`
    (internal/atunnel/ingress.go, read_file id 68666963451) and the actor is CRASHED; a
    CRASHED actor's ResumeActor is FAILED_PRECONDITION (`ensureWorkerAssigned`,
    controlapi/workflow_resume.go@18d1c266, a tree between v0.3.0 and v0.4.0; the file is not
    stored at 2179589f), which the router parks for the budget and then
    answers `503 actor <ref> unavailable: <description>` (notes §2, derived); RevertActor
    takes it back to SUSPENDED and the next request resumes it (docs/api-guide.md)."""
    await make_actor(stub, "dies")
    await stub.ResumeActor(pb.ResumeActorRequest(actor=_ref("dies")))
    assert backend.plane is not None
    assert backend.runtime is not None
    record = backend.plane.lookup("t", "dies")
    assert record is not None
    # the backend's watchdog would notice the death too (test_fidelity_control covers it):
    # stopped, so that the request is what finds it
    await backend.plane.recovery.stop_watchdog()
    await backend.runtime.stop(record.handle)  # the workload dies behind the plane's back
    url = f"{backend.router_url}/readyz"
    status, body, _, _ = await _get(http, url, target("t/dies"))
    assert (status, body) == (502, b"bad gateway\n")
    assert await _state(stub, "dies") == pb.ACTOR_STATE_CRASHED
    status, body, _, took = await _get(http, url, target("t/dies"))
    assert status == 503
    assert body.startswith(b"actor t/dies unavailable: ")
    assert took >= 5.0  # FAILED_PRECONDITION is parked and retried for the budget
    await stub.RevertActor(pb.RevertActorRequest(actor=_ref("dies")))
    status, body, _, _ = await _get(http, url, target("t/dies"))
    assert status == 200, body
    await stub.SuspendActor(pb.SuspendActorRequest(actor=_ref("dies")))


@pytest.mark.slow
async def test_a_resume_longer_than_the_budget_is_served_if_envoy_still_waits(
    stub: Any, backend: LocalBackend, http: aiohttp.ClientSession
) -> None:
    """real: the budget bounds the retries, never an attempt in flight
    (`context.WithoutCancel`, resumer.go@18d1c266), and Envoy waits for ext_proc up to the
    budget + 5 s (dataplane.go@18d1c266): a workload ready 7 s after each start is served by
    the request that woke it."""
    await workload_actor(stub, backend, "late", late_workload(7))
    status, body, _, took = await _get(http, f"{backend.router_url}/readyz", target("t/late"))
    assert status == 200, body
    assert took >= 5.0
    await stub.SuspendActor(pb.SuspendActorRequest(actor=_ref("late")))


@pytest.mark.slow
async def test_a_resume_beyond_envoys_wait_is_a_bodiless_504_and_carries_on(
    stub: Any, backend: LocalBackend, http: aiohttp.ClientSession
) -> None:
    """real: past the ext_proc message timeout (the budget + 5 s = 10 s,
    dataplane.go@18d1c266) Envoy answers 504 with no body itself, while the flight, detached
    from its callers, finishes the resume (resumer.go@18d1c266): a later request is served."""
    await workload_actor(stub, backend, "later", late_workload(13))
    url = f"{backend.router_url}/readyz"
    started = time.monotonic()
    status, body, headers, took = await _get(http, url, target("t/later"))
    assert (status, body, headers["Server"]) == (504, b"", "envoy")
    assert took >= 10.0
    while True:
        status, body, _, _ = await _get(http, url, target("t/later"))
        if status == 200:
            break
        assert (status, body) == (504, b""), (status, body)
        assert time.monotonic() - started < 60, "the resume did not carry on"
    assert await _state(stub, "later") == pb.ACTOR_STATE_RUNNING
    await stub.SuspendActor(pb.SuspendActorRequest(actor=_ref("later")))


async def test_connect_reaches_another_port_of_the_actor(stub: Any, backend: LocalBackend) -> None:
    """real: CONNECT with `ate-target-actor` on the outer request reaches the port of its
    authority (ingress/ingress.go@18d1c266, api-guide read_file id 71263312555), and each
    request inside is routed on its own; a port nobody listens on is atunnel's 502."""
    # under the process runtime the actor shares the host's network: its own address, and a
    # port nobody else takes
    other = random.randint(20000, 40000)
    here = '"${SANDBOX_AGENT_HOST:-0.0.0.0}"'
    both = (
        "/bin/sh",
        "-c",
        f'"{sys.executable}" "{_ECHO}" --host {here} --port {other} & '
        f'exec "{sys.executable}" "{_ECHO}" --host {here} --port "${{PORT:-80}}"',
    )
    await workload_actor(stub, backend, "ports", both)
    await stub.ResumeActor(pb.ResumeActorRequest(actor=_ref("ports")))
    # the probe watches port 80 only: the other server may still be starting
    await poll(lambda: _port_open(backend, "ports", other), bool, f"the actor's port {other}")
    reader, writer = await asyncio.open_connection("127.0.0.1", backend.router_port)
    try:
        writer.write(
            f"CONNECT ports:{other} HTTP/1.1\r\nHost: ports:{other}\r\n"
            "ate-target-actor: t/ports\r\n\r\n".encode()
        )
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200 ")
        writer.write(b"GET /on-the-other-port HTTP/1.1\r\nHost: inner\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 20)
        assert head.startswith(b"HTTP/1.1 200 "), head
    finally:
        writer.close()
    reader, writer = await asyncio.open_connection("127.0.0.1", backend.router_port)
    try:
        writer.write(
            b"CONNECT ports:9999 HTTP/1.1\r\nHost: ports:9999\r\nate-target-actor: t/ports\r\n\r\n"
        )
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"GET / HTTP/1.1\r\nHost: inner\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 20)
        assert head.startswith(b"HTTP/1.1 502 "), head
    finally:
        writer.close()
    assert await _state(stub, "ports") == pb.ACTOR_STATE_RUNNING  # a closed port is no crash
    await stub.SuspendActor(pb.SuspendActorRequest(actor=_ref("ports")))


async def test_the_router_port_answers_actor_traffic_only(
    stub: Any, backend: LocalBackend, http: aiohttp.ClientSession
) -> None:
    """real: the router has no /readyz or /metrics of its own on its data port: without a
    reference every path is 404 `invalid actor reference` (ingress.go@18d1c266); the backend's
    own endpoints are on the admin listener, and its metrics show the router's 404s as
    `not_found` with the template `unknown` (extproc/metrics_test.go@2e3e300a)."""
    router = backend.router_url
    for bare in (f"127.0.0.1:{backend.router_port}", "localhost"):
        for path in ("/readyz", "/metrics", "/_local/status"):
            status, body, headers, _ = await _get(http, router + path, {"Host": bare})
            assert (status, body) == (404, b"invalid actor reference"), (bare, path)
            assert headers["Server"] == "envoy"
    info = read_backend_info(backend.state_dir)
    assert info is not None
    assert info["admin"] == backend.admin_url != backend.router_url
    status, body, _, _ = await _get(http, backend.admin_url + "/metrics", {})
    assert status == 200
    assert b'ate_router_outcome="not_found",ate_router_resume="unknown"' in body
    assert b'ate_template_atespace="unknown"' in body


async def test_agent_answers_pass_through(
    stub: Any, backend: LocalBackend, http: aiohttp.ClientSession
) -> None:
    """The agent's statuses, headers and bodies reach the client as Envoy relays them (its
    `server` replaced): an agent's own 400, HEAD's Content-Length, a Range answer, a quoted
    path, bodies below and above the router's small-body path."""
    await make_actor(stub, "hdr")
    url, headers = backend.router_url, target("t/hdr")
    async with http.get(f"{url}/v1/stat", params={"path": "relative"}, headers=headers) as r:
        assert r.status == 400
        assert (await r.json())["error"]["code"] == "bad_request"
    async with http.post(f"{url}/v1/exec?wait=8", json={"command": "pwd"}, headers=headers) as r:
        folder = (await r.json())["stdout"].strip()
    path = f"{folder.rstrip('/')}/h é+%.bin"
    for size in (10, 200_000):
        async with http.put(
            f"{url}/v1/files", params={"path": path}, data=b"z" * size, headers=headers
        ) as r:
            assert r.status == 200
        async with http.head(f"{url}/v1/files", params={"path": path}, headers=headers) as r:
            assert (r.status, r.headers["Content-Length"]) == (200, str(size))
        ranged = {**headers, "Range": "bytes=2-5"}
        async with http.get(f"{url}/v1/files", params={"path": path}, headers=ranged) as r:
            assert (r.status, await r.read()) == (206, b"zzzz")
    await stub.SuspendActor(pb.SuspendActorRequest(actor=_ref("hdr")))
