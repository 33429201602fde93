"""Stand-ins for what the router talks to, so its tests need no LocalBackend.

- `FakeControl`: an ateapi gRPC server whose ResumeActor answers from a script (real gRPC, so
  the router's `ResumeClient` is exercised as in production).
- `FakePlane`: the control plane's fast path (`lookup`, `sandbox_listeners`, `sandbox_gone`).
- `upstream_app`: an aiohttp "actor" that echoes what it received, sleeps, streams and speaks
  WebSocket.
- `RouterEnv`: all three plus a started `Router`, as an async context manager.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import grpc
import grpc.aio
from aiohttp import web

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.ateapi import ateapi_pb2_grpc as pb_grpc
from gym_substrate.local.metrics import Metrics
from gym_substrate.local.resume_client import ResumeClient
from gym_substrate.local.router import Router


@dataclass(frozen=True)
class Fail:
    """A scripted gRPC error."""

    code: grpc.StatusCode
    message: str = ""


def running(
    name: str,
    *,
    atespace: str = "t",
    resumed: bool = False,
    worker: str = "w1",
    ips: tuple[str, ...] = ("10.0.0.7",),
    template: tuple[str, str] = ("local", "sandbox"),
) -> pb.ResumeActorResponse:
    """ateapi's answer for a RUNNING actor placed on ``worker``."""
    return pb.ResumeActorResponse(
        actor=pb.Actor(
            metadata=pb.ResourceMetadata(atespace=atespace, name=name),
            actor_template=pb.ObjectRef(atespace=template[0], name=template[1]),
            status=pb.ActorStatus(
                state=pb.ACTOR_STATE_RUNNING,
                worker_assignment=pb.WorkerAssignment(
                    worker=pb.ObjectRef(name=worker), worker_pod_ips=list(ips)
                ),
            ),
        ),
        resumed=resumed,
    )


Answer = pb.ResumeActorResponse | Fail
Script = Callable[[str, int], Awaitable[Answer]]


class FakeControl(pb_grpc.ControlServicer):  # type: ignore[misc]
    """ResumeActor answered by ``script(ref, attempt)``; every call is recorded."""

    def __init__(self, script: Script | None = None) -> None:
        self.script = script or self.always_running
        self.calls: list[str] = []

    @staticmethod
    async def always_running(ref: str, attempt: int) -> Answer:
        atespace, _, name = ref.partition("/")
        return running(name, atespace=atespace)

    def count(self, ref: str) -> int:
        return self.calls.count(ref)

    async def ResumeActor(self, request: Any, context: Any) -> pb.ResumeActorResponse:  # noqa: N802
        ref = f"{request.actor.atespace}/{request.actor.name}"
        self.calls.append(ref)
        answer = await self.script(ref, self.count(ref))
        if isinstance(answer, Fail):
            await context.abort(answer.code, answer.message)
        return answer


@dataclass(frozen=True)
class FakeRecord:
    address: str
    handle: str = "h1"
    worker: str | None = "w1"


@dataclass
class FakePlane:
    records: dict[str, FakeRecord] = field(default_factory=dict)
    sandbox_listeners: list[Callable[[str], Awaitable[None]]] = field(default_factory=list)
    gone: list[tuple[str, str]] = field(default_factory=list)

    def lookup(self, atespace: str, name: str) -> FakeRecord | None:
        return self.records.get(f"{atespace}/{name}")

    async def sandbox_gone(self, key: str, handle: str) -> bool:
        self.gone.append((key, handle))
        return False


async def _echo(request: web.Request) -> web.StreamResponse:
    body = await request.read()
    seen = {
        "method": request.method,
        "path": request.path_qs,
        "headers": [[name, value] for name, value in request.headers.items()],
        "body_bytes": len(body),
        "port": request.transport.get_extra_info("sockname")[1] if request.transport else 0,
    }
    return web.json_response(seen, headers={"Server": "echo-agent"})


async def _sleep(request: web.Request) -> web.StreamResponse:
    await asyncio.sleep(float(request.query.get("s", "1")))
    return web.Response(text="slept")


def pattern(size: int) -> bytes:
    """The bytes `/bytes?n=` streams: a repeating 0..255 ramp."""
    return (bytes(range(256)) * (size // 256 + 1))[:size]


async def _bytes(request: web.Request) -> web.StreamResponse:
    """`n` bytes of `pattern`, streamed in 1 MiB writes (Content-Length set unless `chunked`)."""
    size = int(request.query["n"])
    response = web.StreamResponse()
    if "chunked" in request.query:
        response.enable_chunked_encoding()
    else:
        response.content_length = size
    await response.prepare(request)
    block = pattern(1 << 20)
    sent = 0
    while sent < size:
        piece = block[: min(len(block), size - sent)]
        await response.write(piece)
        sent += len(piece)
    await response.write_eof()
    return response


async def _sha(request: web.Request) -> web.StreamResponse:
    digest = hashlib.sha256()
    size = 0
    async for chunk in request.content.iter_any():
        digest.update(chunk)
        size += len(chunk)
    return web.json_response({"sha256": digest.hexdigest(), "size": size})


async def _ws(request: web.Request) -> web.StreamResponse:
    ws = web.WebSocketResponse()
    await ws.prepare(request)
    await ws.send_str(json.dumps({"headers": [[k, v] for k, v in request.headers.items()]}))
    async for message in ws:
        if message.type == aiohttp.WSMsgType.TEXT:
            await ws.send_str("echo:" + message.data)
        elif message.type == aiohttp.WSMsgType.BINARY:
            await ws.send_bytes(message.data)
    return ws


def upstream_app() -> web.Application:
    app = web.Application()
    app.router.add_get("/sleep", _sleep)
    app.router.add_get("/ws", _ws)
    app.router.add_get("/bytes", _bytes)
    app.router.add_put("/sha", _sha)
    app.router.add_route("*", "/{tail:.*}", _echo)
    return app


@contextlib.asynccontextmanager
async def serve_app(app: web.Application) -> AsyncIterator[int]:
    """``app`` on 127.0.0.1 at a free port."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield int(runner.addresses[0][1])
    finally:
        await runner.cleanup()


def free_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RouterEnv:
    """A Router on a free port, with a FakeControl API, a FakePlane and one echo actor.

    The actor `t/a` is placed on worker w1 at the echo upstream (`127.0.0.1:<port>`, which the
    router dials for port 80).
    """

    def __init__(self, script: Script | None = None, **router_options: Any) -> None:
        self.control = FakeControl(script)
        self.plane = FakePlane()
        self.metrics = Metrics()
        self.router_options = router_options
        self._stack = contextlib.AsyncExitStack()
        self.router: Router | None = None
        self.upstream_port = 0
        self.url = ""

    async def __aenter__(self) -> RouterEnv:
        server = grpc.aio.server()
        pb_grpc.add_ControlServicer_to_server(self.control, server)
        api_port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        self._stack.push_async_callback(server.stop, None)
        self.upstream_port = await self._stack.enter_async_context(serve_app(upstream_app()))
        self.plane.records["t/a"] = FakeRecord(f"127.0.0.1:{self.upstream_port}")
        self.router = Router(
            self.plane, ResumeClient(f"127.0.0.1:{api_port}"), self.metrics, **self.router_options
        )
        port = await self.router.start("127.0.0.1", 0)
        self._stack.push_async_callback(self.router.close)
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    @property
    def port(self) -> int:
        assert self.router is not None
        return self.router.port

    def sample(self, name: str, labels: dict[str, str] | None = None) -> float:
        return self.metrics.registry.get_sample_value(name, labels or {}) or 0.0


def target(ref: str = "t/a", **extra: str) -> dict[str, str]:
    """The routing header for ``ref``, plus ``extra`` headers."""
    return {"ate-target-actor": ref, **extra}


async def exchange(port: int, raw: bytes, *, limit_s: float = 20.0) -> bytes:
    """Send ``raw`` on a fresh connection; the bytes until the server closes or answers whole."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        await writer.drain()
        async with asyncio.timeout(limit_s):
            return await read_response(reader)
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def read_response(reader: asyncio.StreamReader) -> bytes:
    """One HTTP/1.1 response (Content-Length or close-delimited) from ``reader``."""
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = await reader.read(65536)
        if not chunk:
            return head
        head += chunk
    head, _, body = head.partition(b"\r\n\r\n")
    length = None
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    status = int(head.split(b" ", 2)[1])
    if length is None and (status in (101, 204, 304) or 100 <= status < 200):
        length = 0
    while length is None or len(body) < length:
        chunk = await reader.read(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


async def until(condition: Callable[[], bool], *, limit_s: float = 10.0) -> None:
    """Wait for ``condition`` to hold, polling every 10 ms; fail after ``limit_s``."""
    for _ in range(int(limit_s / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"not true within {limit_s} s: {condition}")


def status_of(response: bytes) -> int:
    return int(response.split(b" ", 2)[1])


def body_of(response: bytes) -> bytes:
    return response.partition(b"\r\n\r\n")[2]
