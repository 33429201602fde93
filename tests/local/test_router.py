"""The router's routing, delivery and tunnels, against fakes (router_fakes.py).

Each test pins one behaviour of atenet at agent-substrate/substrate 18d1c266 (a tree between
v0.3.0 and v0.4.0: atenet is not stored at 2179589f, and the router reads no message the eras
change) and names the upstream file it comes from. The resume flights,
parking and error bodies are in test_router_resume.py; the same behaviour on a real
LocalBackend is in test_fidelity_router.py.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import resource
import uuid
from typing import Any

import aiohttp
import pytest
from multidict import CIMultiDict
from router_fakes import (
    FakeRecord,
    RouterEnv,
    body_of,
    exchange,
    free_port,
    pattern,
    read_response,
    running,
    serve_app,
    status_of,
    target,
    upstream_app,
)

from gym_substrate.local.router import Router, parse_target_actor, upstream_authority
from gym_substrate.local.router.headers import connect_port


def test_parse_target_actor() -> None:
    """`ParseTargetActor` (internal/atenet/headers.go@18d1c266): split at the first `/`, both
    parts DNS-1123 labels (internal/resources, read_file id 71544887124), nothing trimmed."""
    assert parse_target_actor("t/a") == ("t", "a")
    assert str(parse_target_actor("ns-1/actor-2")) == "ns-1/actor-2"
    assert parse_target_actor("a" * 63 + "/" + "b" * 63) is not None
    for bad in (
        "",
        "t",
        "t/",
        "/a",
        "t/a/b",
        "t//a",
        "T/a",
        "t/A",
        " t/a",
        "t/a ",
        "t/a\n",
        "t_x/a",
        "-t/a",
        "t/a-",
        "a" * 64 + "/b",
        "t/é",
    ):
        assert parse_target_actor(bad) is None, bad


def test_connect_port_rule() -> None:
    """The actor port of a CONNECT: its authority's port when `atunnel.ParsePort` takes it
    (1-65535, Go's Atoi), else 80 (cmd/atenet/internal/router/ingress/ingress.go@18d1c266)."""
    cases = {
        "h:9090": 9090,
        "h:1": 1,
        "h:65535": 65535,
        "[::1]:8080": 8080,
        "h:+81": 81,
        "h:0": 80,
        "h:65536": 80,
        "h": 80,
        "h:": 80,
        "h:abc": 80,
        "a:b:c": 80,
        "[::1]": 80,
    }
    for authority, port in cases.items():
        assert connect_port(authority) == port, authority


def test_the_sandbox_address_to_dial() -> None:
    """Locally each actor's sandbox has its own address (docs/local.md, "Router" differences):
    a bare IP serves every port as asked; a record of `ip:p` (a process-runtime agent without
    root) serves the actor's port 80 on `p`; an address without an IP has nothing to dial."""
    assert upstream_authority("10.213.0.5") == "10.213.0.5:80"
    assert upstream_authority("10.213.0.5", 9090) == "10.213.0.5:9090"
    assert upstream_authority("127.1.0.3:40123") == "127.1.0.3:40123"
    assert upstream_authority("127.1.0.3:40123", 9090) == "127.1.0.3:9090"
    assert upstream_authority("::1") == "[::1]:80"
    assert upstream_authority("[::1]:8080", 443) == "[::1]:443"
    for bad in ("", "sandbox.local", "10.0.0.300", "host:80"):
        assert upstream_authority(bad) is None, bad


async def test_missing_or_malformed_reference_is_404_before_any_resume() -> None:
    """A missing or malformed `ate-target-actor` is ext_proc's immediate 404 `invalid actor
    reference` (ingress/ingress.go@18d1c266), `content-type: text/plain` exactly
    (extproc/errors.go@86d8bcf8); nothing is resumed, and the route is timed as not_found with
    the template unknown (extproc/metrics_test.go@2e3e300a). Two copies of the header are
    refused too (their reading upstream is unverified, notes §9.10)."""
    async with RouterEnv() as env, aiohttp.ClientSession() as http:
        cases: list[Any] = [
            {},
            target(""),
            target("T/a"),
            target("t/a/b"),
            target("t"),
            CIMultiDict([("ate-target-actor", "t/a"), ("ate-target-actor", "t/a")]),
        ]
        for headers in cases:
            async with http.get(env.url + "/x", headers=headers) as response:
                assert response.status == 404, headers
                assert await response.text() == "invalid actor reference"
                assert response.headers["Content-Type"] == "text/plain"
                assert response.headers["Server"] == "envoy"
        assert env.control.calls == []
        labels = {
            "ate_template_atespace": "unknown",
            "ate_template_name": "unknown",
            "ate_router_outcome": "not_found",
            "ate_router_resume": "unknown",
        }
        assert env.sample("atenet_router_route_duration_seconds_count", labels) == len(cases)


async def _seen(response: aiohttp.ClientResponse) -> dict[str, list[str]]:
    """The request headers the echo actor received, by lower-case name."""
    got: dict[str, list[str]] = {}
    for name, value in (await response.json())["headers"]:
        got.setdefault(name.lower(), []).append(value)
    return got


async def test_the_actor_gets_the_host_unchanged_and_atunnels_forwarding_headers() -> None:
    """Host is application metadata and reaches the actor unchanged (atunnel's
    `pr.Out.Host = pr.In.Host`, internal/atunnel/ingress.go, read_file id 68666963451);
    atunnel deletes `ate-target-actor` and `X-Ate-Target-Port` and its `SetXForwarded()` sets
    X-Forwarded-For (its peer, the router), -Host and -Proto (https: the router's hop is mTLS)
    after Go's ReverseProxy dropped the client's; Envoy adds `x-request-id` (a client's is
    kept) and x-envoy-expected-rq-timeout-ms from the 5 min route timeout, and answers with
    `server: envoy` and x-envoy-upstream-service-time (xds.go@18d1c266)."""
    async with RouterEnv() as env, aiohttp.ClientSession() as http:
        sent = target(
            Host="app.example.com:8443",
            **{
                "X-Ate-Target-Port": "9999",
                "X-Forwarded-For": "6.6.6.6",
                "X-Forwarded-Proto": "http",
                "Forwarded": "for=6.6.6.6",
                "X-Custom": "kept",
            },
        )
        async with http.get(env.url + "/some/path?q=1", headers=sent) as response:
            assert response.status == 200
            assert response.headers.getall("Server") == ["envoy"]
            assert response.headers["x-envoy-upstream-service-time"].isdigit()
            echoed = await response.json()
            seen = await _seen(response)
        assert echoed["path"] == "/some/path?q=1"
        assert echoed["port"] == env.upstream_port  # port 80 of the record, here its ip:port
        assert seen["host"] == ["app.example.com:8443"]
        for gone in ("ate-target-actor", "x-ate-target-port", "forwarded"):
            assert gone not in seen, gone
        assert seen["x-forwarded-for"] == ["127.0.0.1"]
        assert seen["x-forwarded-host"] == ["app.example.com:8443"]
        assert seen["x-forwarded-proto"] == ["https"]
        assert seen["x-custom"] == ["kept"]
        assert seen["x-envoy-expected-rq-timeout-ms"] == ["300000"]
        assert uuid.UUID(seen["x-request-id"][0]).version == 4
        async with http.get(env.url + "/", headers=target(**{"X-Request-ID": "call-7"})) as r2:
            assert (await _seen(r2))["x-request-id"] == ["call-7"]


async def test_every_request_calls_resume_actor() -> None:
    """ext_proc resumes on every request, RUNNING actor or not (ingress/resumer.go@18d1c266
    `runFlight`; ateapi answers a RUNNING actor `resumed=false`), timed with the template's
    labels and resume `none` (docs/metrics/registry/metrics.yaml@09c2ac9c)."""
    async with RouterEnv() as env, aiohttp.ClientSession() as http:
        for _ in range(3):
            async with http.get(env.url + "/", headers=target()) as response:
                assert response.status == 200
        assert env.control.calls == ["t/a"] * 3
        labels = {
            "ate_template_atespace": "local",
            "ate_template_name": "sandbox",
            "ate_router_outcome": "ok",
            "ate_router_resume": "none",
        }
        assert env.sample("atenet_router_route_duration_seconds_count", labels) == 3


@pytest.mark.parametrize("ips", [(), ("not-an-ip",), ("",)])
async def test_an_answer_without_a_worker_ip_is_500_routing_failed(ips: tuple[str, ...]) -> None:
    """The worker address is `worker_pod_ips[0]`; one that does not parse as an IP is 500
    `actor <ref> routing failed` (ingress/ingress.go@18d1c266), timed as resume_error."""

    async def no_ip(ref: str, attempt: int) -> Any:
        return running("a", ips=ips)

    async with RouterEnv(no_ip) as env, aiohttp.ClientSession() as http:
        async with http.get(env.url + "/", headers=target()) as response:
            assert (response.status, await response.text()) == (500, "actor t/a routing failed")
        labels = {
            "ate_template_atespace": "local",
            "ate_template_name": "sandbox",
            "ate_router_outcome": "resume_error",
            "ate_router_resume": "none",
        }
        assert env.sample("atenet_router_route_duration_seconds_count", labels) == 1


async def test_an_actor_not_active_on_the_named_worker_is_421_stale() -> None:
    """atunnel serves only actors active on its worker: any other is `421` with Go's
    `http.Error` body `misdirected request\\n` and `X-Ate-Assignment-Stale: true`
    (internal/atunnel/ingress.go, read_file id 68666963451, `reject`); the 18d1c266 route has
    no retry policy, so the client sees it (xds.go@18d1c266). Locally: the plane's record is
    gone, has no sandbox, or sits on another worker than ResumeActor named."""
    async with RouterEnv() as env, aiohttp.ClientSession() as http:
        address = env.plane.records["t/a"].address
        for record in (FakeRecord(address, worker="w2"), FakeRecord(""), None):
            if record is None:
                del env.plane.records["t/a"]
            else:
                env.plane.records["t/a"] = record
            async with http.get(env.url + "/", headers=target()) as response:
                assert response.status == 421, record
                assert await response.read() == b"misdirected request\n"
                assert response.headers["X-Ate-Assignment-Stale"] == "true"
                assert response.headers["Content-Type"] == "text/plain; charset=utf-8"
                assert response.headers["X-Content-Type-Options"] == "nosniff"
        assert env.plane.gone == []


async def test_a_sandbox_that_does_not_answer_is_502_and_reported() -> None:
    """atunnel's proxy answers a failed dial with Go's `http.Error(w, "bad gateway", 502)`
    (internal/atunnel/ingress.go, read_file id 68666963451, ErrorHandler). The router reports
    it to the plane (`sandbox_gone`), which crashes the actor if its workload died; the next
    requests then meet a CRASHED actor's resume error (test_fidelity_router.py)."""
    async with RouterEnv() as env, aiohttp.ClientSession() as http:
        env.plane.records["t/a"] = FakeRecord(f"127.0.0.1:{free_port()}", handle="dead-1")
        async with http.get(env.url + "/", headers=target()) as response:
            assert response.status == 502
            assert await response.read() == b"bad gateway\n"
            assert response.headers["Content-Type"] == "text/plain; charset=utf-8"
        assert env.plane.gone == [("t/a", "dead-1")]


@pytest.mark.slow  # waits out a real router deadline (over the fast lane's 50 ms sleeps)
async def test_route_timeout_is_envoys_504() -> None:
    """The workload route's timeout (5 min by default, `defaultRouteTimeout`,
    xds.go@18d1c266; scaled down here) ends a slow answer with Envoy's `504 upstream request
    timeout`. The 504 itself shows the router cut it: the actor, sleeping 1 s on the same event
    loop, would have answered 200 `slept`, and its timer is always due after the router's."""
    assert Router.__init__.__kwdefaults__["route_timeout_s"] == 300.0
    async with (
        RouterEnv(route_timeout_s=0.3) as env,
        aiohttp.ClientSession() as http,
        http.get(env.url + "/sleep?s=1", headers=target()) as response,
    ):
        assert (response.status, await response.text()) == (504, "upstream request timeout")


@pytest.mark.slow  # waits out a real router deadline (over the fast lane's 50 ms sleeps)
async def test_route_timeout_counts_from_the_end_of_the_request_body() -> None:
    """Envoy's route timeout starts once the whole request is in (xds.go@18d1c266 route
    timeout), so a slow upload is not cut by it; the idle timeout (5 min 30 s,
    `routeIdleTimeout`) bounds the gaps between its chunks instead."""
    async with (
        RouterEnv(route_timeout_s=0.3, idle_timeout_s=5.0) as env,
        aiohttp.ClientSession() as http,
    ):

        async def slow_body() -> Any:
            for _ in range(4):
                yield b"x" * 1000
                await asyncio.sleep(0.2)

        # the upload takes 4 x 0.2 s by construction, well past the 0.3 s route timeout
        async with http.put(env.url + "/sha", data=slow_body(), headers=target()) as response:
            assert response.status == 200, await response.text()
            assert (await response.json())["size"] == 4000


async def test_a_stalled_upload_meets_the_idle_timeout() -> None:
    """Envoy's stream idle timeout (overridden per route to 5 min 30 s, `routeIdleTimeout`,
    xds.go@18d1c266; scaled down here) answers a request whose body stopped arriving with its
    local reply `408 stream timeout`."""
    assert Router.__init__.__kwdefaults__["idle_timeout_s"] is None  # derived: 330 s
    async with RouterEnv(idle_timeout_s=0.3) as env:
        assert env.router is not None
        raw = (
            b"PUT /sha HTTP/1.1\r\nHost: h\r\nate-target-actor: t/a\r\n"
            b"Content-Length: 100\r\n\r\n" + b"x" * 10
        )
        answer = await exchange(env.port, raw, limit_s=10)
        assert status_of(answer) == 408
        assert body_of(answer) == b"stream timeout"
    async with RouterEnv() as env:
        assert env.router is not None
        assert env.router.idle_timeout_s == 330.0


async def test_streams_100_mib_both_ways_without_buffering() -> None:
    """Bodies stream both ways (Envoy's buffer limits aside): a 100 MiB download and a 32 MiB
    upload cross the router intact without it holding them in memory."""
    async with RouterEnv() as env, aiohttp.ClientSession() as http:
        size = 100 * 2**20
        expected = hashlib.sha256()
        block = pattern(1 << 20)
        for _ in range(100):
            expected.update(block)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        digest = hashlib.sha256()
        got = 0
        async with http.get(env.url + f"/bytes?n={size}", headers=target()) as response:
            assert response.headers["Content-Length"] == str(size)
            async for chunk in response.content.iter_chunked(1 << 20):
                digest.update(chunk)
                got += len(chunk)
        grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
        assert (got, digest.hexdigest()) == (size, expected.hexdigest())
        assert grown_mib < 48, f"the router buffered the body (+{grown_mib:.0f} MiB peak RSS)"
        async with http.get(env.url + "/bytes?n=300000&chunked=1", headers=target()) as r2:
            assert await r2.read() == pattern(300000)
        payload = pattern(32 * 2**20)

        async def chunks() -> Any:
            for start in range(0, len(payload), 1 << 20):
                yield payload[start : start + (1 << 20)]

        async with http.put(env.url + "/sha", data=chunks(), headers=target()) as response:
            assert (await response.json())["sha256"] == hashlib.sha256(payload).hexdigest()


async def test_websocket_is_routed_and_relayed_both_ways() -> None:
    """Every workload listener allows WebSocket (`UpgradeConfigs: websocket`, buildHcm in
    xds.go@18d1c266); the client puts `ate-target-actor` on the opening request (api-guide,
    read_file id 71263312555), which resumes and routes like any request; the actor gets the
    handshake without the routing header and both directions flow."""
    async with RouterEnv() as env, aiohttp.ClientSession() as http:
        ws = await http.ws_connect(env.url + "/ws", headers=target(Host="app.example"))
        first = json.loads((await ws.receive(timeout=5)).data)
        names = {name.lower(): value for name, value in first["headers"]}
        assert "ate-target-actor" not in names
        assert names["host"] == "app.example"
        assert names["upgrade"].lower() == "websocket"
        await ws.send_str("hello")
        assert (await ws.receive(timeout=5)).data == "echo:hello"
        big = pattern(3 << 20)
        await ws.send_bytes(big)
        assert (await ws.receive(timeout=10)).data == big
        await ws.close()
        assert env.control.calls == ["t/a"]


async def test_a_websocket_the_actor_declines_gets_its_answer() -> None:
    """The handshake is forwarded as a request: an actor that does not switch protocols
    answers it like any other request, and that answer reaches the client."""
    async with RouterEnv() as env, aiohttp.ClientSession() as http:
        with pytest.raises(aiohttp.WSServerHandshakeError) as declined:
            await http.ws_connect(env.url + "/not-a-socket", headers=target())
        assert declined.value.status == 200


async def test_other_upgrades_are_403_before_any_resume() -> None:
    """Only WebSocket is an upgrade type of the workload listeners (xds.go@18d1c266), so
    Envoy refuses any other `Upgrade` with its bodiless 403 before ext_proc runs; an h2c offer
    is dropped by its HTTP/1 codec and the request served."""
    async with RouterEnv() as env, aiohttp.ClientSession() as http:
        raw = (
            b"GET /x HTTP/1.1\r\nHost: h\r\nate-target-actor: t/a\r\n"
            b"Connection: Upgrade\r\nUpgrade: tcp\r\n\r\n"
        )
        answer = await exchange(env.port, raw)
        assert status_of(answer) == 403
        assert body_of(answer) == b""
        assert b"\r\nServer: envoy" in answer
        assert env.control.calls == []
        h2c = target(Connection="Upgrade, HTTP2-Settings", Upgrade="h2c")
        async with http.get(env.url + "/x", headers=h2c) as response:
            assert response.status == 200
            assert "http2-settings" not in await _seen(response)


async def _connect(
    port: int, authority: str, ref: str | None = "t/a"
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    header = f"ate-target-actor: {ref}\r\n" if ref is not None else ""
    writer.write(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n{header}\r\n".encode())
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    return reader, writer, head


async def _inside(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, head: bytes) -> bytes:
    writer.write(head)
    return await asyncio.wait_for(read_response(reader), 10)


async def test_connect_reaches_the_port_of_its_authority_and_each_inner_request_routes() -> None:
    """Arbitrary actor ports use CONNECT with `ate-target-actor` on the outer request (api-guide,
    read_file id 71263312555). Envoy terminates it and serves the tunnel's bytes as HTTP on its
    internal listener, where each inner request resumes and routes on its own; the inner
    request's own header wins over the outer one, the port comes from the CONNECT authority
    (ingress/ingress.go@18d1c266 `routingValue`, xds.go@18d1c266 `buildConnectRoutes`)."""
    async with RouterEnv() as env, serve_app(upstream_app()) as other_port:
        env.plane.records["t/b"] = FakeRecord(f"127.0.0.1:{env.upstream_port}", handle="h2")
        reader, writer, head = await _connect(env.port, f"actor-upstream:{other_port}")
        try:
            assert head.startswith(b"HTTP/1.1 200 ")
            for path in ("/one", "/two"):
                answer = await _inside(
                    reader, writer, f"GET {path} HTTP/1.1\r\nHost: in\r\n\r\n".encode()
                )
                assert status_of(answer) == 200, answer
                echoed = json.loads(body_of(answer))
                assert (echoed["path"], echoed["port"]) == (path, other_port)
                seen = {name.lower(): value for name, value in echoed["headers"]}
                assert seen["host"] == "in"
                assert "ate-target-actor" not in seen
            own = b"GET /three HTTP/1.1\r\nHost: in\r\nate-target-actor: t/b\r\n\r\n"
            assert status_of(await _inside(reader, writer, own)) == 200
        finally:
            writer.close()
        assert env.control.calls == ["t/a", "t/a", "t/b"]


async def test_connect_without_a_reference_leaves_each_inner_request_404() -> None:
    """The outer CONNECT only carries the reference into filter state; an inner request with
    none either way is ext_proc's 404 (ingress/ingress.go@18d1c266)."""
    async with RouterEnv() as env:
        reader, writer, head = await _connect(env.port, f"x:{env.upstream_port}", ref=None)
        try:
            assert head.startswith(b"HTTP/1.1 200 ")
            answer = await _inside(reader, writer, b"GET / HTTP/1.1\r\nHost: in\r\n\r\n")
            assert (status_of(answer), body_of(answer)) == (404, b"invalid actor reference")
        finally:
            writer.close()


async def test_connect_to_a_port_nobody_listens_on_is_502() -> None:
    """atunnel answers `502 bad gateway` when its dial to the actor's port fails
    (internal/atunnel/ingress.go, read_file id 68666963451)."""
    async with RouterEnv() as env:
        reader, writer, head = await _connect(env.port, f"x:{free_port()}")
        try:
            answer = await _inside(reader, writer, b"GET / HTTP/1.1\r\nHost: in\r\n\r\n")
            assert (status_of(answer), body_of(answer)) == (502, b"bad gateway\n")
        finally:
            writer.close()


async def test_connect_without_a_valid_port_reaches_port_80() -> None:
    """A CONNECT authority without a port 1-65535 targets the actor's port 80
    (ingress/ingress.go@18d1c266, `defaultActorPort`)."""
    async with RouterEnv() as env:
        reader, writer, head = await _connect(env.port, "actor-upstream")
        try:
            answer = await _inside(reader, writer, b"GET /p HTTP/1.1\r\nHost: in\r\n\r\n")
            assert status_of(answer) == 200
            assert json.loads(body_of(answer))["port"] == env.upstream_port
        finally:
            writer.close()


async def test_router_registers_its_pool_release_with_the_plane() -> None:
    """Pooled connections into a sandbox are dropped when the plane stops or checkpoints it
    (`sandbox_listeners`); the router unregisters on close."""
    async with RouterEnv() as env:
        assert env.router is not None
        assert env.plane.sandbox_listeners == [env.router.release]
    assert env.plane.sandbox_listeners == []
