"""The router fails the way Substrate's router (Envoy + atenet's ext_proc) fails.

One test per behaviour, each on both local runtimes (process and gVisor) with the real limits:
Envoy's 5 s ext_proc timeout, the resumer's detached 15 s budget and its ABORTED backoff, the
10 s route timeout counted from the end of the request body, Host matching, the headers Envoy
adds, and refused upgrades. Each docstring says what the real one does and where
(agent-substrate at 86e138f6).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from local_helpers import (
    RUNTIMES,
    host,
    late_workload,
    make_actor,
    ref,
    status_code,
    workload_actor,
)

from gym_substrate._names import actor_host
from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.local import LocalBackend
from gym_substrate.local.statedir import read_backend_info

S = pb.Actor.Status
_ECHO = Path(__file__).with_name("echo_agent.py")


@pytest.fixture(params=RUNTIMES)
def runtime_name(request: pytest.FixtureRequest) -> str:
    """Every test here runs on both local runtimes."""
    name: str = request.param
    return name


async def _get(
    http: aiohttp.ClientSession, url: str, headers: dict[str, str]
) -> tuple[int, bytes, Any, float]:
    """(status, body, headers, seconds) of one GET."""
    started = time.monotonic()
    async with http.get(url, headers=headers) as response:
        body = await response.read()
        return response.status, body, response.headers, time.monotonic() - started


async def _status(stub: Any, name: str) -> int:
    return int((await stub.GetActor(pb.GetActorRequest(actor_ref=ref(name)))).actor.status)


@pytest.mark.slow
async def test_auto_resume_over_5_s_is_envoys_empty_504_and_carries_on(
    stub: Any, backend: LocalBackend, http: aiohttp.ClientSession
) -> None:
    """real: the resume runs inside Envoy's ext_proc call, whose timeout is 5 s
    (cmd/atenet/internal/router/xds.go, ExternalProcessor timeout and message_timeout); past it
    Envoy answers the client itself, 504 with an empty body, while the resume goes on detached
    (cmd/atenet/internal/router/resumer.go, its own 15 s context), so a later request for the
    actor joins it and is served."""
    await workload_actor(stub, backend, "slow", late_workload(6))
    url = f"{backend.router_url}/readyz"
    started = time.monotonic()
    status, body, headers, took = await _get(http, url, host("slow"))
    assert (status, body) == (504, b"")
    assert 4.5 <= took < 8, took
    assert headers["Server"] == "envoy"
    assert await _status(stub, "slow") == S.STATUS_RESUMING  # not given up
    # later requests join the same resume until it is done (6 s after its start or restore)
    while True:
        status, body, _, _ = await _get(http, url, host("slow"))
        if status == 200:
            break
        assert (status, body) == (504, b""), (status, body)
        assert time.monotonic() - started < 40, "the resume did not carry on"
    assert json.loads(body)["actor_id"] == "slow"
    actor = (await stub.GetActor(pb.GetActorRequest(actor_ref=ref("slow")))).actor
    assert actor.status == S.STATUS_RUNNING
    await stub.SuspendActor(pb.SuspendActorRequest(actor_ref=ref("slow")))


@pytest.mark.slow
async def test_shared_resume_stops_waiting_after_15_s(
    stub: Any, backend: LocalBackend, http: aiohttp.ClientSession
) -> None:
    """real: the resumer's one shared ResumeActor call has a 15 s context
    (cmd/atenet/internal/router/resumer.go); a request still waiting when it runs out gets
    DEADLINE_EXCEEDED mapped to `504 actor "<id>" request timed out`
    (cmd/atenet/internal/router/errors.go). That context also cancels the workflow, so the actor
    is left RESUMING for a gRPC ResumeActor to finish."""
    await workload_actor(stub, backend, "slower", late_workload(17))
    url = f"{backend.router_url}/readyz"
    started = time.monotonic()
    status, body, _, _ = await _get(http, url, host("slower"))  # starts the shared resume
    assert (status, body) == (504, b"")
    # join it late enough that its 15 s budget ends inside this request's own 5 s
    await asyncio.sleep(max(0.0, 10.5 - (time.monotonic() - started)))
    status, body, headers, _ = await _get(http, url, host("slower"))
    assert (status, body) == (504, b'actor "slower" request timed out')
    assert headers["Content-Type"].startswith("text/plain")
    assert 14 <= time.monotonic() - started < 18
    # The router's 15 s context cancels the workflow it runs under (ateapi's workflow.go runs
    # under the request's context), so router traffic alone never finishes a resume over 15 s,
    # here as on a cluster: a gRPC ResumeActor with a longer deadline does (the provider's path).
    assert await _status(stub, "slower") == S.STATUS_RESUMING
    # The cancelled workflow may still hold the actor's lock while it unwinds (under gVisor,
    # destroying the half-started sandbox takes about 2 s): ABORTED meanwhile, as on a cluster.
    for _ in range(100):
        code = await status_code(
            stub.ResumeActor(pb.ResumeActorRequest(actor_ref=ref("slower")), timeout=60)
        )
        if code != grpc.StatusCode.ABORTED:
            break
        await asyncio.sleep(0.1)
    assert code == grpc.StatusCode.OK
    status, body, _, _ = await _get(http, url, host("slower"))
    assert status == 200, body
    assert json.loads(body)["actor_id"] == "slower"
    await stub.SuspendActor(pb.SuspendActorRequest(actor_ref=ref("slower")))


@pytest.mark.slow
async def test_every_request_calls_resume_actor_and_backs_off_on_aborted(
    stub: Any, backend: LocalBackend, http: aiohttp.ClientSession
) -> None:
    """real: ext_proc calls ResumeActor on every request, RUNNING actor or not
    (cmd/atenet/internal/router/extproc.go), and ResumeActor takes the per-actor lock even then
    (cmd/ateapi/internal/controlapi/workflow.go), so it is ABORTED while another operation holds
    it. The resumer retries ABORTED 7 times, sleeping 200 ms x1.5 per try with up to 20 %
    jitter (about 4.2-5 s in all), then gives up: 500 `error resuming actor "<id>"`
    (cmd/atenet/internal/router/resumer.go, errors.go)."""
    await make_actor(stub, "held")
    await stub.ResumeActor(pb.ResumeActorRequest(actor_ref=ref("held")))
    plane = backend.plane
    assert plane is not None
    url = f"{backend.router_url}/readyz"

    async def hold_lock(seconds: float) -> None:
        """Stand-in for another operation on the actor (another client's ResumeActor, say)."""
        async with plane.workflows.lock("held"):  # keyed by actor id alone, as workflow.go
            await asyncio.sleep(seconds)

    status, _, _, took = await _get(http, url, host("held"))
    assert status == 200
    # held for 1 s: the RUNNING actor's request waits out the lock through retries
    holder = asyncio.ensure_future(hold_lock(1.0))
    await asyncio.sleep(0)
    status, body, _, took = await _get(http, url, host("held"))
    await holder
    assert status == 200, body
    assert 0.9 <= took < 3.0, took
    # held throughout: 7 ABORTED tries, then 500
    holder = asyncio.ensure_future(hold_lock(6.0))
    await asyncio.sleep(0)
    status, body, headers, took = await _get(http, url, host("held"))
    assert (status, body) == (500, b'error resuming actor "held"')
    assert 4.0 <= took < 5.5, took
    assert headers["Server"] == "envoy"
    await holder
    assert await _status(stub, "held") == S.STATUS_RUNNING
    await stub.SuspendActor(pb.SuspendActorRequest(actor_ref=ref("held")))


_CONTROL = pb.DESCRIPTOR.services_by_name["Control"].full_name


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
    """real: ext_proc's resumer calls ateapi's ResumeActor over gRPC for every request
    (cmd/atenet/internal/router/extproc.go, resumer.go), so the API server counts one
    ResumeActor per routed request, RUNNING actor or not (ateapi's own server metrics, read
    here as `rpc_server_call_duration_seconds`), and a request the router refuses before
    routing (an unrouted Host) costs none."""
    await make_actor(stub, "counted")
    url = f"{backend.router_url}/readyz"
    before = _resume_rpcs(backend, "OK")
    status, body, _, _ = await _get(http, url, host("counted"))  # resumes it: SUSPENDED
    assert status == 200, body
    for _ in range(4):  # RUNNING: the same call each time
        status, body, _, _ = await _get(http, url, host("counted"))
        assert status == 200, body
    assert _resume_rpcs(backend, "OK") - before == 5
    unrouted = {"Host": "127.0.0.1"}
    status, _, _, _ = await _get(http, url, unrouted)
    assert status == 404
    assert _resume_rpcs(backend, "OK") - before == 5
    refused = _resume_rpcs(backend, "NOT_FOUND")
    missing = await _get(http, url, host("no-such-actor"))
    assert missing[0] == 404
    assert _resume_rpcs(backend, "NOT_FOUND") - refused == 1  # asked; the API said NOT_FOUND
    await stub.SuspendActor(pb.SuspendActorRequest(actor_ref=ref("counted")))


async def test_unrouted_host_is_404_and_admin_endpoints_have_their_own_port(
    stub: Any, backend: LocalBackend, http: aiohttp.ClientSession
) -> None:
    """real: ext_proc routes by the Host alone and answers 404 `invalid host "<h>": ...` for
    one that names no actor (cmd/atenet/internal/router/extproc.go, extproc_in.go), a bare
    127.0.0.1 or localhost included: the router port has no /readyz or /metrics of its own.
    Names are matched case-sensitively (internal/resources/actor.go ParseActorDNSName)."""
    await make_actor(stub, "a1")
    router = backend.router_url
    for bare in (f"127.0.0.1:{backend.router_port}", "localhost", "127.0.0.1"):
        for path in ("/readyz", "/metrics", "/_local/status"):
            status, body, headers, _ = await _get(http, router + path, {"Host": bare})
            assert status == 404, (bare, path)
            assert body.startswith(f'invalid host "{bare}": '.encode()), body
            assert headers["Server"] == "envoy"
    for wrong in (actor_host("A1", "t"), actor_host("a1", "t").upper()):
        status, body, _, _ = await _get(http, router + "/readyz", {"Host": wrong})
        assert status == 404
        assert body.startswith(f'invalid host "{wrong}": '.encode())
    assert await _status(stub, "a1") == S.STATUS_SUSPENDED  # nothing was resumed
    # the backend's own endpoints: the admin listener, recorded in backend.json
    info = read_backend_info(backend.state_dir)
    assert info is not None
    assert info["admin"] == backend.admin_url != backend.router_url
    status, body, _, _ = await _get(http, backend.admin_url + "/readyz", {})
    assert (status, json.loads(body)) == (200, {"status": "ok"})
    status, body, _, _ = await _get(http, backend.admin_url + "/metrics", {})
    assert status == 200
    assert b"atenet_router_route_duration_seconds_count" in body
    assert b'outcome="not_found"' in body  # the 404s above, counted as atenet counts them
    status, body, _, _ = await _get(http, backend.admin_url + "/_local/status", {})
    assert status == 200
    assert json.loads(body)["admin"] == backend.admin_url


async def test_headers_as_envoy_sends_them(
    stub: Any, backend: LocalBackend, http: aiohttp.ClientSession
) -> None:
    """real: ext_proc rewrites :authority to `<ateom_pod_ip>:80` (extproc.go), so the actor
    sees that as its Host; Envoy keeps a client's x-request-id or generates one, overwrites
    x-forwarded-proto with the listener's scheme and adds x-envoy-expected-rq-timeout-ms from
    the 10 s route timeout (xds.go: generate_request_id, no use_remote_address or trusted hops,
    route timeout); on the way back it replaces `server` with `envoy` and adds
    x-envoy-upstream-service-time (extproc_out.go leaves response headers to Envoy)."""
    echo = (sys.executable, str(_ECHO), "--host", "0.0.0.0", "--port", "80")
    await workload_actor(stub, backend, "echo", echo)
    actor = (await stub.ResumeActor(pb.ResumeActorRequest(actor_ref=ref("echo")))).actor
    ip, _, port = actor.ateom_pod_ip.rpartition(":")
    expected_host = f"{ip}:{port}" if ip else f"{actor.ateom_pod_ip}:80"
    url = f"{backend.router_url}/some/path?q=1"

    async def seen(headers: dict[str, str]) -> tuple[dict[str, list[str]], Any]:
        async with http.get(url, headers=headers) as response:
            assert response.status == 200
            echoed = await response.json()
            got: dict[str, list[str]] = {}
            for name, value in echoed["headers"]:
                got.setdefault(name.lower(), []).append(value)
            return got, response.headers

    got, back = await seen({**host("echo"), "X-Forwarded-Proto": "https"})
    assert got["host"] == [expected_host]
    assert got["x-forwarded-proto"] == ["http"]  # the client's claim is overwritten
    assert got["x-envoy-expected-rq-timeout-ms"] == ["10000"]
    generated = got["x-request-id"]
    assert len(generated) == 1
    assert uuid.UUID(generated[0]).version == 4
    assert back.getall("Server") == ["envoy"]
    assert back["x-envoy-upstream-service-time"].isdigit()
    got, _ = await seen({**host("echo"), "X-Request-ID": "my-call-7"})
    assert got["x-request-id"] == ["my-call-7"]  # kept, so agent retries stay idempotent
    await stub.SuspendActor(pb.SuspendActorRequest(actor_ref=ref("echo")))


async def test_websocket_and_connect_are_403_before_any_resume(
    stub: Any, backend: LocalBackend, http: aiohttp.ClientSession
) -> None:
    """real: Substrate's listener has no upgrade_configs (cmd/atenet/internal/router/xds.go),
    so Envoy's connection manager refuses a WebSocket (any Upgrade) or CONNECT request with a
    bodiless 403 before ext_proc runs: the actor is not resumed. An h2c upgrade offer is
    dropped by Envoy's HTTP/1 codec and the request is served as plain HTTP/1.1."""
    await make_actor(stub, "ws")
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await http.ws_connect(f"{backend.router_url}/ws", headers=host("ws"))
    assert refused.value.status == 403

    def raw(request: bytes) -> bytes:
        with socket.create_connection(("127.0.0.1", backend.router_port), timeout=20) as sock:
            sock.sendall(request)
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
            return data

    name = actor_host("ws", "t").encode()
    for request in (
        b"GET /x HTTP/1.1\r\nHost: " + name + b"\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n\r\n",
        b"CONNECT " + name + b":80 HTTP/1.1\r\nHost: " + name + b":80\r\n\r\n",
    ):
        answer = await asyncio.to_thread(raw, request)
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 403 "), answer
        assert body == b""
        assert b"\r\nServer: envoy" in head
    assert await _status(stub, "ws") == S.STATUS_SUSPENDED
    await stub.ResumeActor(pb.ResumeActorRequest(actor_ref=ref("ws")))
    h2c = {**host("ws"), "Connection": "Upgrade, HTTP2-Settings", "Upgrade": "h2c"}
    status, body, _, _ = await _get(http, f"{backend.router_url}/readyz", h2c)
    assert status == 200, body
    await stub.SuspendActor(pb.SuspendActorRequest(actor_ref=ref("ws")))


@pytest.mark.slow
async def test_route_timeout_counts_from_the_end_of_the_request_body(
    stub: Any, backend: LocalBackend, http: aiohttp.ClientSession
) -> None:
    """real: Envoy's route timeout (10 s, cmd/atenet/internal/router/xds.go) spans from the end
    of the downstream request, its body included, to the end of the response, so an upload
    that takes 12 s is not cut; only an answer that is slow after it is."""
    await make_actor(stub, "up")
    await stub.ResumeActor(pb.ResumeActorRequest(actor_ref=ref("up")))
    async with http.post(
        f"{backend.router_url}/v1/exec?wait=8", json={"command": "pwd"}, headers=host("up")
    ) as response:
        folder = (await response.json())["stdout"].strip()
    piece = bytes(range(256)) * 256
    chunks = 12

    async def slow_body() -> Any:
        for _ in range(chunks):
            yield piece
            await asyncio.sleep(1.0)

    started = time.monotonic()
    async with http.put(
        f"{backend.router_url}/v1/files",
        params={"path": f"{folder}/slow.bin"},
        data=slow_body(),
        headers=host("up"),
    ) as response:
        answer = await response.text()
        assert response.status == 200, answer
    assert time.monotonic() - started >= 11.5
    assert json.loads(answer)["sha256"] == hashlib.sha256(piece * chunks).hexdigest()
    await stub.SuspendActor(pb.SuspendActorRequest(actor_ref=ref("up")))
