"""The router under hostile input (issue 14, "The router"), over raw sockets: 4xx, never 500.

Against fakes (router_fakes.py) on loopback, so the module is in the fast lane; the admin
listener's hostile-input tests need a LocalBackend and live in test_hostile_admin.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from typing import Any

import grpc
import pytest
from router_fakes import (
    Fail,
    FakeRecord,
    RouterEnv,
    body_of,
    exchange,
    read_response,
    status_of,
    until,
)

from gym_substrate.local.router import HEAD_TIMEOUT_S


def _request(target_: str, host: str | None, ref: str | None = "t/a") -> bytes:
    """A one-shot GET of ``target_`` (None host: no Host header, None ref: no routing)."""
    lines = [f"GET {target_} HTTP/1.1"]
    if host is not None:
        lines.append(f"Host: {host}")
    if ref is not None:
        lines.append(f"ate-target-actor: {ref}")
    return ("\r\n".join([*lines, "Connection: close"]) + "\r\n\r\n").encode()


async def test_non_utf8_host_is_400() -> None:
    """A Host that is not UTF-8 is refused before any resume."""
    async with RouterEnv() as env:
        raw = b"GET / HTTP/1.1\r\nHost: \xff\xfe.x\r\nate-target-actor: t/a\r\n\r\n"
        answer = await exchange(env.port, raw)
        assert status_of(answer) == 400
        assert b"Host" in body_of(answer)
        assert env.control.calls == []


async def test_malformed_requests_log_one_line_not_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Any client can send bytes that are not HTTP; each is a 400 and one INFO line, never
    aiohttp's traceback at ERROR (which would let anyone fill the log)."""
    raws = (
        b"GET\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nabc",
        b"G\x00T / HTTP/1.1\r\n\r\n",
    )
    async with RouterEnv() as env:
        with caplog.at_level(logging.INFO):
            for raw in raws:
                answer = await exchange(env.port, raw)
                assert status_of(answer) == 400
                assert body_of(answer) == b"Bad Request"
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
    lines = [r for r in caplog.records if "malformed request" in r.getMessage()]
    assert len(lines) == len(raws)
    assert all(r.exc_info is None for r in lines)


async def test_hostile_routing_values_are_404_never_500() -> None:
    """Whatever `ate-target-actor` holds (bytes that are not UTF-8, 60 KiB, a second
    reference, escapes), ext_proc's answer is 404 `invalid actor reference`
    (internal/atenet/headers.go@18d1c266); a control character is the parser's 400, as in
    Envoy's codec. Nothing is resumed."""
    values = {
        b"\xff\xfe/\xfa": 404,
        b"t/" + b"a" * 60000: 404,
        b"../../etc/passwd": 404,
        b"t/a, t/b": 404,
        b"t%2Fa": 404,
        b"t/a\x01": 400,
        b"t/a\x7f": 400,
    }
    async with RouterEnv() as env:
        for value, status in values.items():
            raw = b"GET / HTTP/1.1\r\nHost: h\r\nate-target-actor: " + value + b"\r\n\r\n"
            answer = await exchange(env.port, raw)
            assert status_of(answer) == status, value[:40]
            if status == 404:
                assert body_of(answer) == b"invalid actor reference"
        assert env.control.calls == []


async def test_absolute_form_target_gives_its_authority_as_host() -> None:
    """RFC 9112 §3.2.2: an absolute-form target's authority replaces the Host header, as Envoy
    takes it for :authority; the actor sees the origin-form path. The header still picks the
    actor. HTTP/1.1 without Host is 400; other non-origin targets are 400, never forwarded."""
    async with RouterEnv() as env:
        for target_, path in (
            ("http://app.example/readyz", "/readyz"),
            ("http://app.example:8080/r?x=1", "/r?x=1"),
        ):
            answer = await exchange(env.port, _request(target_, "wrong.example"))
            assert status_of(answer) == 200, answer
            echoed = json.loads(body_of(answer))
            assert echoed["path"] == path
            seen = {name.lower(): value for name, value in echoed["headers"]}
            assert seen["host"] == target_.split("/")[2]
        answer = await exchange(env.port, _request("http://app.example/", None))
        assert status_of(answer) == 400
        answer = await exchange(env.port, _request("http://app.example/", "x", ref=None))
        assert (status_of(answer), body_of(answer)) == (404, b"invalid actor reference")
        for bad in (b"*", b"ftp://x/y"):
            raw = b"OPTIONS " + bad + b" HTTP/1.1\r\nHost: h\r\nate-target-actor: t/a\r\n\r\n"
            assert status_of(await exchange(env.port, raw)) == 400, bad


async def test_unfinished_request_heads_are_cut() -> None:
    """A client dribbling header bytes is cut `head_timeout_s` after its first byte with 408
    (10 s by default, as atunnel's ReadHeaderTimeout, internal/atunnel/ingress.go, read_file id
    68666963451; scaled down here); a whole request on a fresh connection is still answered."""
    assert HEAD_TIMEOUT_S == 10.0
    async with RouterEnv(head_timeout_s=0.5) as env:

        def dribble() -> bytes:
            started = time.monotonic()
            with socket.create_connection(("127.0.0.1", env.port), timeout=30) as sock:
                sock.sendall(b"GET / HTTP/1.1\r\nHost: h\r\n")
                received = b""
                sock.settimeout(0.1)
                while time.monotonic() - started < 10:
                    try:
                        sock.sendall(b"X-Slow: y\r\n")
                        chunk = sock.recv(4096)
                    except TimeoutError:
                        continue
                    except OSError:
                        break
                    if not chunk:
                        break
                    received += chunk
                return received

        # the 408 is the router's: a client giving up at its 10 s would have received nothing
        received = await asyncio.to_thread(dribble)
        assert received.startswith(b"HTTP/1.1 408 "), received
        answer = await exchange(env.port, _request("/", "h"))
        assert status_of(answer) == 200


@pytest.mark.slow  # waits out a real router deadline (over the fast lane's 50 ms sleeps)
async def test_keep_alive_between_requests_is_not_the_head_deadline() -> None:
    """An idle keep-alive connection is not cut by the head deadline alone."""
    async with RouterEnv(head_timeout_s=0.3) as env:
        reader, writer = await asyncio.open_connection("127.0.0.1", env.port)
        try:
            request = b"GET / HTTP/1.1\r\nHost: h\r\nate-target-actor: t/a\r\n\r\n"
            writer.write(request)
            assert status_of(await read_response(reader)) == 200
            await asyncio.sleep(0.6)
            writer.write(request)
            assert status_of(await read_response(reader)) == 200
        finally:
            writer.close()


async def test_a_client_that_leaves_while_parked_frees_its_place() -> None:
    """A parked caller whose client disconnects stops waiting (its context ends) and releases
    its place as `canceled` (parking.go@4558b166 `parkOutcomeFor`); the flight goes on
    (resumer.go@18d1c266)."""
    script_failure = Fail(grpc.StatusCode.RESOURCE_EXHAUSTED, "no free workers available")

    async def script(ref: str, attempt: int) -> Any:
        return script_failure

    async with RouterEnv(script, parked_request_budget_s=5.0, retry_interval_s=0.01) as env:
        reader, writer = await asyncio.open_connection("127.0.0.1", env.port)
        writer.write(b"GET / HTTP/1.1\r\nHost: h\r\nate-target-actor: t/b\r\n\r\n")
        await writer.drain()
        await until(lambda: env.sample("atenet_router_parking_active") == 1)
        writer.close()
        await until(lambda: env.sample("atenet_router_parking_active") == 0)
        canceled = {"outcome": "canceled"}
        assert env.sample("atenet_router_parking_wait_duration_seconds_count", canceled) == 1


async def test_hostile_connects_never_answer_500() -> None:
    """CONNECT authorities that are not host:port are refused by the parser (400) or, with a
    host and no usable port, reach port 80 (ingress/ingress.go@18d1c266); a CONNECT inside a
    tunnel is Envoy's 403 (`main_internal` has no CONNECT upgrade config); bytes inside a
    tunnel that are not HTTP get the internal listener's 400."""
    async with RouterEnv() as env:
        for authority in (b"::::", b"http://x/", b"x:99999999", b"", b"[::1"):
            raw = b"CONNECT " + authority + b" HTTP/1.1\r\nHost: x\r\nate-target-actor: t/a\r\n\r\n"
            reader, writer = await asyncio.open_connection("127.0.0.1", env.port)
            try:
                writer.write(raw)
                head = await asyncio.wait_for(reader.read(4096), 10)
            finally:
                writer.close()
            assert head.split(b" ", 2)[1] in (b"400", b"200"), (authority, head)
        for inner, status in (
            (b"CONNECT x:80 HTTP/1.1\r\nHost: x:80\r\n\r\n", 403),
            (b"\x16\x03\x01\x00\xa5 not http\r\n\r\n", 400),
        ):
            reader, writer = await asyncio.open_connection("127.0.0.1", env.port)
            try:
                writer.write(
                    b"CONNECT x:80 HTTP/1.1\r\nHost: x:80\r\nate-target-actor: t/a\r\n\r\n"
                )
                assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200 ")
                writer.write(inner)
                answer = await asyncio.wait_for(read_response(reader), 10)
                assert status_of(answer) == status, (inner, answer)
            finally:
                writer.close()


async def test_an_idle_tunnel_is_closed() -> None:
    """A CONNECT tunnel has no route timeout (0 on the CONNECT route, xds.go@18d1c266); it is
    closed once nothing crossed it for the stream idle timeout (scaled down here; which idle
    timeout applies to the outer tunnel upstream is unverified, notes §9.7)."""
    async with RouterEnv(idle_timeout_s=0.3) as env:
        reader, writer = await asyncio.open_connection("127.0.0.1", env.port)
        try:
            writer.write(b"CONNECT x:80 HTTP/1.1\r\nHost: x:80\r\nate-target-actor: t/a\r\n\r\n")
            assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200 ")
            assert await asyncio.wait_for(reader.read(), 10) == b""  # closed by the router
        finally:
            writer.close()


async def test_router_fuzzing_finds_nothing() -> None:
    """`gym-substrate fuzz router`'s generated input (tools/fuzz/router.py: routed requests,
    unusable routing values, broken framing, upgrades, CONNECT tunnels, mutated heads) gets
    no 500 and no hang from the router; routed cases reach the actor."""
    from gym_substrate.lab.tools.fuzz import fuzz_router

    async with RouterEnv(head_timeout_s=2.0) as env:
        address = env.plane.records["t/a"].address
        for name in ("r0", "r1"):
            env.plane.records[f"fz/{name}"] = FakeRecord(address)
        tally = await asyncio.to_thread(
            fuzz_router, ("127.0.0.1", env.port), ["fz/r0", "fz/r1"], requests=400, seed=14
        )
    assert tally.finding_count == 0, tally.findings
    assert tally.counts["2xx"] > 0, "routed cases reached the actor"
    assert tally.counts["4xx"] > 0


def test_router_fuzzer_wants_actor_references() -> None:
    """The fuzzer routes by `ate-target-actor`, so it is given references, not Host names."""
    from gym_substrate.lab.tools.fuzz import fuzz_router

    with pytest.raises(ValueError, match="'r0.fz.actors.resources.substrate.ate.dev' is not"):
        fuzz_router(
            ("127.0.0.1", 1), ["r0.fz.actors.resources.substrate.ate.dev"], requests=1, seed=1
        )
