"""The router under hostile input (issue 14, "The router"), over raw sockets.

Each test sends what the fuzzing run sent: a Host that is not UTF-8, an absolute-form request
target, admin bodies of 8 MiB and YAML nested 5,000 deep, and a request head that never ends.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from typing import Any

import pytest
from local_helpers import host, make_actor, ref

from gym_substrate._names import actor_host
from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.local import LocalBackend
from gym_substrate.local.backend import ADMIN_BODY_LIMIT
from gym_substrate.local.router import HEAD_TIMEOUT_S
from gym_substrate.local.templates import MAX_YAML_DEPTH


def _exchange(port: int, raw: bytes, timeout: float = 20.0) -> bytes:
    """Send ``raw`` on a fresh connection and read until the server closes or answers."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(raw)
        return _read_response(sock)


def _read_response(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


def _request(target: str, host: str | None) -> bytes:
    """A one-shot GET of ``target``, with ``host`` as its Host header (None: no Host)."""
    headers = f"Host: {host}\r\n" if host is not None else ""
    return f"GET {target} HTTP/1.1\r\n{headers}Connection: close\r\n\r\n".encode()


def _status(response: bytes) -> int:
    return int(response.split(b" ", 2)[1])


def _body(response: bytes) -> bytes:
    return response.partition(b"\r\n\r\n")[2]


async def test_non_utf8_host_is_400(backend: LocalBackend) -> None:
    raw = b"GET /readyz HTTP/1.1\r\nHost: \xff\xfe.t." + b"x" * 3 + b"\r\nConnection: close\r\n\r\n"
    response = await asyncio.to_thread(_exchange, backend.router_port, raw)
    assert _status(response) == 400
    assert b"Host" in _body(response)


async def test_malformed_requests_log_one_line_not_a_traceback(
    backend: LocalBackend, caplog: pytest.LogCaptureFixture
) -> None:
    """Any client can send bytes that are not HTTP; each is a 400 and one INFO line, never
    aiohttp's traceback at ERROR (which would let anyone fill the log)."""
    raws = (
        b"GET\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nabc",
        b"G\x00T / HTTP/1.1\r\n\r\n",
    )
    with caplog.at_level(logging.INFO):
        for raw in raws:
            response = await asyncio.to_thread(_exchange, backend.router_port, raw)
            assert _status(response) == 400
            assert _body(response) == b"Bad Request"
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == []
    lines = [r for r in caplog.records if "malformed request" in r.getMessage()]
    assert len(lines) == len(raws)
    assert all(r.exc_info is None for r in lines)


async def test_absolute_form_target_is_routed_by_its_authority(
    stub: Any, backend: LocalBackend
) -> None:
    """RFC 9112 §3.2.2: the target's authority wins over Host; never `http://ip:porthttp://...`."""
    await make_actor(stub, "abs")
    # resumed first: an auto-resume slower than 5 s (a loaded machine) would be a bodiless 504
    await stub.ResumeActor(pb.ResumeActorRequest(actor_ref=ref("abs")))
    authority = actor_host("abs", "t")
    port = backend.router_port
    # the Host header is ignored; a port and a query are fine
    for target in (f"http://{authority}/readyz", f"http://{authority}:80/readyz?x=1"):
        response = await asyncio.to_thread(_exchange, port, _request(target, "wrong.example"))
        assert _status(response) == 200, response
        assert json.loads(_body(response))["actor_id"] == "abs"
    # HTTP/1.1 still requires a Host header (RFC 9112 §3.2): 400 without one
    response = await asyncio.to_thread(
        _exchange, port, _request(f"http://{authority}/readyz", None)
    )
    assert _status(response) == 400, response
    # an authority that is not an actor's is the same 404 as such a Host
    response = await asyncio.to_thread(_exchange, port, _request("http://example.com/", "x"))
    assert _status(response) == 404
    assert _body(response).startswith(b'invalid host "example.com"')
    # targets that are neither origin- nor absolute-form are 400, never forwarded
    for target in (b"*", b"ftp://x/y"):
        raw = b"OPTIONS " + target + b" HTTP/1.1\r\nHost: " + authority.encode() + b"\r\n"
        raw += b"Connection: close\r\n\r\n"
        response = await asyncio.to_thread(_exchange, backend.router_port, raw)
        assert _status(response) == 400, (target, response)
    await stub.SuspendActor(pb.SuspendActorRequest(actor_ref=ref("abs")))


@pytest.mark.parametrize("backend_options", [{"workers": 1, "router_timeout_s": 10.0}])
async def test_unfinished_request_heads_are_cut(backend: LocalBackend) -> None:
    """A client dribbling header bytes is cut HEAD_TIMEOUT_S after its first byte (408)."""
    assert HEAD_TIMEOUT_S == 10.0

    def dribble() -> tuple[float, bytes]:
        started = time.monotonic()
        with socket.create_connection(("127.0.0.1", backend.router_port), timeout=30) as sock:
            sock.sendall(b"GET /readyz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            received = b""
            while time.monotonic() - started < 25:
                try:
                    sock.sendall(b"X-Slow: y\r\n")
                except OSError:
                    break
                sock.settimeout(1.0)
                try:
                    chunk = sock.recv(4096)
                except TimeoutError:
                    continue
                except OSError:
                    break
                if not chunk:
                    break
                received += chunk
            return time.monotonic() - started, received

    elapsed, received = await asyncio.to_thread(dribble)
    assert HEAD_TIMEOUT_S - 1 <= elapsed < 20, elapsed
    assert received.startswith(b"HTTP/1.1 408 "), received
    # a whole request on a fresh connection is still answered (a bare Host routes nowhere)
    answer = await asyncio.to_thread(
        _exchange, backend.router_port, b"GET /readyz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    )
    assert _status(answer) == 404
    assert _body(answer).startswith(b'invalid host "127.0.0.1"')


async def test_keep_alive_between_requests_is_not_the_head_deadline(
    backend: LocalBackend,
) -> None:
    """An idle keep-alive connection is not cut by the head deadline alone."""
    request = b"GET /readyz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"

    def two_requests() -> tuple[int, int]:
        with socket.create_connection(("127.0.0.1", backend.router_port), timeout=30) as sock:
            sock.sendall(request)
            first = _status(_read_response(sock))
            time.sleep(HEAD_TIMEOUT_S + 1)
            sock.sendall(request)
            return first, _status(_read_response(sock))

    assert await asyncio.to_thread(two_requests) == (404, 404)  # both answered


async def test_admin_body_over_the_limit_is_413_and_does_not_stall_proxying(
    stub: Any, backend: LocalBackend, http: Any
) -> None:
    """An 8 MiB admin body streams in while a proxied exec completes; the admin answer is 413.

    The admin listener has its own port but shares the router's event loop.
    """
    await make_actor(stub, "busy")
    await stub.ResumeActor(pb.ResumeActorRequest(actor_ref=ref("busy")))
    started = asyncio.Event()
    release = asyncio.Event()
    loop = asyncio.get_running_loop()

    def admin_upload() -> bytes:
        with socket.create_connection(("127.0.0.1", backend.admin_port), timeout=60) as sock:
            sock.sendall(
                b"POST /_local/templates HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n"
            )
            piece = b"a: " + b"x" * (256 * 1024 - 4) + b"\n"
            sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
            loop.call_soon_threadsafe(started.set)
            asyncio.run_coroutine_threadsafe(release.wait(), loop).result(timeout=60)
            try:
                for _ in range(31):  # 8 MiB in all
                    sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
                sock.sendall(b"0\r\n\r\n")
            except OSError:
                pass  # the server answered 413 and closed before the last chunks
            return _read_response(sock)

    upload = asyncio.ensure_future(asyncio.to_thread(admin_upload))
    await started.wait()
    # the admin request is in flight (its body is not finished): proxying must still work
    async with http.post(
        f"{backend.router_url}/v1/exec?wait=8", json={"command": "echo ok"}, headers=host("busy")
    ) as response:
        assert response.status == 200
        assert (await response.json())["stdout"] == "ok\n"
    assert not upload.done()
    release.set()
    answer = await upload
    assert _status(answer) == 413, answer
    error = json.loads(_body(answer))["error"]
    assert error["code"] == "too_large"
    assert str(ADMIN_BODY_LIMIT) in error["message"]
    await stub.SuspendActor(pb.SuspendActorRequest(actor_ref=ref("busy")))


async def test_admin_declared_length_over_the_limit_is_413_at_once(backend: LocalBackend) -> None:
    raw = b"POST /_local/templates HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %d\r\n\r\n" % (
        8 << 20
    )
    response = await asyncio.to_thread(_exchange, backend.admin_port, raw)
    assert _status(response) == 413
    assert str(ADMIN_BODY_LIMIT).encode() in _body(response)


async def test_admin_yaml_nested_5000_deep_is_400_naming_the_limit(
    backend: LocalBackend, http: Any
) -> None:
    for deep in ("[" * 5000 + "]" * 5000, "".join(" " * i + "a:\n" for i in range(1000))):
        async with http.post(
            f"{backend.admin_url}/_local/templates", data=deep.encode()
        ) as response:
            assert response.status == 400
            error = (await response.json())["error"]
            assert error["code"] == "bad_request"
            assert f"more than {MAX_YAML_DEPTH} levels" in error["message"]
