"""The backend's admin listener under hostile input (issue 14): 413 and 400, never 500.

Split from test_hostile_router.py, whose router tests run on fakes in the fast lane: these need
a LocalBackend (the admin endpoints are the backend's) and one process-runtime actor.
"""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import aiohttp
from router_fakes import body_of, exchange, status_of, target

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.local import LocalBackend
from gym_substrate.local.backend import ADMIN_BODY_LIMIT


def _ref(name: str) -> pb.ObjectRef:
    return pb.ObjectRef(atespace="t", name=name)


async def test_admin_body_over_the_limit_is_413_and_does_not_stall_proxying(
    stub: Any, backend: LocalBackend
) -> None:
    """An 8 MiB admin body streams in while a proxied exec completes; the admin answer is 413.

    The admin listener has its own port but shares the router's event loop. Needs a
    LocalBackend (`make_actor` from local_helpers).
    """
    from local_helpers import make_actor

    await make_actor(stub, "busy")
    await stub.ResumeActor(pb.ResumeActorRequest(actor=_ref("busy")))
    started = asyncio.Event()
    release = asyncio.Event()
    loop = asyncio.get_running_loop()

    def admin_upload() -> bytes:
        with socket.create_connection(("127.0.0.1", backend.admin_port), timeout=60) as sock:
            sock.sendall(
                b"POST /_local/images HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Authorization: Bearer %s\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n" % backend.admin_token.encode()
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
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
            return data

    upload = asyncio.ensure_future(asyncio.to_thread(admin_upload))
    await started.wait()
    # the admin request is in flight (its body is not finished): proxying must still work
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"{backend.router_url}/v1/exec?wait=8",
            json={"command": "echo ok"},
            headers=target("t/busy"),
        ) as response,
    ):
        assert response.status == 200
        assert (await response.json())["stdout"] == "ok\n"
    assert not upload.done()
    release.set()
    answer = await upload
    assert status_of(answer) == 413, answer
    error = json.loads(body_of(answer).split(b"\r\n\r\n")[-1] or b"{}")["error"]
    assert error["code"] == "too_large"
    assert str(ADMIN_BODY_LIMIT) in error["message"]
    await stub.SuspendActor(pb.SuspendActorRequest(actor=_ref("busy")))


async def test_admin_declared_length_over_the_limit_is_413_at_once(backend: LocalBackend) -> None:
    raw = (
        b"POST /_local/images HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %s\r\n"
        b"Content-Length: %d\r\n\r\n" % (backend.admin_token.encode(), 8 << 20)
    )
    answer = await exchange(backend.admin_port, raw)
    assert status_of(answer) == 413
    assert str(ADMIN_BODY_LIMIT).encode() in body_of(answer)


async def test_admin_json_nested_5000_deep_is_400(backend: LocalBackend) -> None:
    """An image registration nested far deeper than its two keys is a 400 saying what to send,
    never the parser's recursion error as a 500."""
    async with aiohttp.ClientSession() as http:
        for deep in ("[" * 5000 + "]" * 5000, '{"a":' * 5000 + "1" + "}" * 5000):
            async with http.post(
                f"{backend.admin_url}/_local/images",
                data=deep.encode(),
                headers={"Authorization": f"Bearer {backend.admin_token}"},
            ) as response:
                assert response.status == 400
                error = (await response.json())["error"]
                assert error["code"] == "bad_request"
                assert '{"name":' in error["message"]
