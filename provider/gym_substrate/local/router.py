"""The router: Substrate's Host-based HTTP entry to actors, as one aiohttp reverse proxy.

It mirrors atenet (reference/substrate.md §4): `Host: <actor>.<atespace>.actors.resources.
substrate.ate.dev[:port]` picks the actor, a suspended or paused actor is resumed on demand
(deduplicated per actor, ABORTED retried with backoff inside a 15 s budget), resume errors map
to the same HTTP statuses and bodies, and every request is cut at the route timeout (10 s by
default, like Envoy's route timeout) so clients meet the real limit here. Bodies stream both ways
and upstream connections are pooled keep-alive (aiohttp sets TCP_NODELAY), because the router
sits on the latency path of every exec. Requests whose Host is this machine (127.0.0.1,
localhost) reach the backend's own endpoints instead: /metrics, /readyz, /_local/*.

Hostile input answers 4xx, never 500: a Host that is not UTF-8 is 400; an absolute-form target
(`GET http://<actor host>/path`) is routed by its authority as RFC 9112 §3.2.2 requires (and
as Envoy does), any other non-origin target is 400. A request head must arrive whole within
`HEAD_TIMEOUT_S` of its first byte or the connection gets 408 and is closed; aiohttp has no such
limit of its own (only the idle keep-alive timeout), so `_HeadDeadline` adds it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import grpc
from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from multidict import CIMultiDict
from yarl import URL

from gym_substrate._names import ACTOR_DOMAIN, is_dns_label
from gym_substrate.local.errors import ApiError
from gym_substrate.local.lifecycle import RUNNING, ControlPlane
from gym_substrate.local.metrics import CONTENT_TYPE, Metrics
from gym_substrate.local.store import ActorRecord

__all__ = ["HEAD_TIMEOUT_S", "Router", "json_error", "parse_host", "read_limited"]

log = logging.getLogger(__name__)

_HOP_BY_HOP = frozenset(
    h.lower()
    for h in (
        "Connection",
        "Keep-Alive",
        "Proxy-Authenticate",
        "Proxy-Authorization",
        "Proxy-Connection",
        "TE",
        "Trailer",
        "Transfer-Encoding",
        "Upgrade",
        "Host",
    )
)
_RESUME_BUDGET_S = 15.0
_CHUNK = 256 * 1024
_CONNECT_TIMEOUT_S = 2.0
_SMALL_BODY = 64 * 1024
# a request head (request line + headers) must be complete this long after its first byte
HEAD_TIMEOUT_S = 10.0
# an idle keep-alive connection (no request begun) is closed after this, as aiohttp's default
_KEEPALIVE_S = 3630.0
_TIMEOUT_408 = (
    b"HTTP/1.1 408 Request Timeout\r\nContent-Type: text/plain\r\nConnection: close\r\n"
    b"Content-Length: %d\r\n\r\n%s"
)

AdminHandler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]


class _HeadDeadline(RequestHandler):
    """aiohttp's connection handler plus a deadline on unfinished request heads.

    The timer starts with the first byte of a request head (not while a handler runs, so
    request bodies and idle keep-alive connections are not affected) and stops when aiohttp
    has parsed the head. Tied to aiohttp's handler internals (``_request_count``,
    ``_current_request``, ``_messages``); test_hostile_router.py pins the behaviour.
    """

    def __init__(self, *args: Any, head_timeout_s: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timeout_s = head_timeout_s
        self._head_timer: asyncio.TimerHandle | None = None

    def data_received(self, data: bytes) -> None:
        heads = self._request_count
        super().data_received(data)
        if self._request_count != heads:
            self._stop_head_timer()
        elif self._head_timer is None and self._current_request is None and not self._messages:
            self._head_timer = self._loop.call_later(self._head_timeout_s, self._head_expired)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._stop_head_timer()
        super().connection_lost(exc)

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_expired(self) -> None:
        self._head_timer = None
        if self._current_request is not None or self._messages or self.transport is None:
            return
        body = f"request head not complete within {self._head_timeout_s:g} s".encode()
        self.transport.write(_TIMEOUT_408 % (len(body), body))
        self.force_close()


class _Server(web.Server):
    """A low-level aiohttp server whose connections are `_HeadDeadline` handlers."""

    def __init__(self, handler: Any, *, head_timeout_s: float, **kwargs: Any) -> None:
        super().__init__(handler, **kwargs)
        self._handler_kwargs = dict(kwargs)
        self._head_timeout_s = head_timeout_s

    def __call__(self) -> RequestHandler:
        return _HeadDeadline(
            self, loop=self._loop, head_timeout_s=self._head_timeout_s, **self._handler_kwargs
        )


async def read_limited(request: web.BaseRequest, limit: int) -> bytes | None:
    """The whole body, or None once it is known to exceed ``limit`` bytes (nothing more read)."""
    if request.content_length is not None and request.content_length > limit:
        return None
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.content.iter_any():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def parse_host(host: str) -> tuple[str, str] | str:
    """(actor_id, atespace) from a Host header, or the reason it is not an actor's host."""
    name = host
    if name.startswith("["):
        name = name.partition("]")[0] + "]"
    elif name.count(":") == 1:
        name = name.partition(":")[0]
    name = name.rstrip(".").lower()
    suffix = "." + ACTOR_DOMAIN
    if not name.endswith(suffix):
        return f"not under {ACTOR_DOMAIN}"
    labels = name[: -len(suffix)].split(".")
    if len(labels) != 2:
        return "want <actor_id>.<atespace>." + ACTOR_DOMAIN
    actor_id, atespace = labels
    for label in labels:
        if not is_dns_label(label):
            return f"{label!r} is not a DNS-1123 label"
    return actor_id, atespace


def _is_local_host(host: str) -> bool:
    name = host
    if name.startswith("["):
        name = name[1:].partition("]")[0]
    elif name.count(":") == 1:
        name = name.partition(":")[0]
    if name in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _absolute_target(target: str) -> tuple[str, str] | None:
    """(authority, origin-form target) of an absolute-form http(s) target, else None."""
    try:
        url = URL(target, encoded=True)
    except ValueError:
        return None
    if url.scheme not in ("http", "https") or not url.raw_authority or url.user is not None:
        return None
    path = url.raw_path or "/"
    if url.raw_query_string:
        path += "?" + url.raw_query_string
    return url.raw_authority, path


def _text(status: int, body: str) -> web.Response:
    return web.Response(status=status, text=body, content_type="text/plain")


_GRPC_TO_HTTP = {
    grpc.StatusCode.NOT_FOUND: (404, 'actor "{id}" not found', "not_found"),
    grpc.StatusCode.FAILED_PRECONDITION: (503, 'actor "{id}" unavailable: {msg}', "error"),
    grpc.StatusCode.UNAVAILABLE: (503, 'actor "{id}" unavailable', "error"),
    grpc.StatusCode.DEADLINE_EXCEEDED: (504, 'actor "{id}" request timed out', "error"),
}  # anything else, ABORTED after its retries included, is atenet's 500


class _UpstreamDown(Exception):
    """The agent could not be reached and the request can be replayed (no body consumed)."""


class Router:
    def __init__(
        self,
        plane: ControlPlane,
        metrics: Metrics,
        *,
        timeout_s: float = 10.0,
        admin: dict[tuple[str, str], AdminHandler] | None = None,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError("router timeout must be > 0 seconds")
        self.plane = plane
        self.metrics = metrics
        self.timeout_s = timeout_s
        self.admin = dict(admin or {})
        self._resumes: dict[str, asyncio.Task[ActorRecord]] = {}
        self._pools: dict[str, aiohttp.ClientSession] = {}
        self._closed = False
        self._runner: web.ServerRunner | None = None
        self.port = 0

    def _pool(self, record: ActorRecord) -> aiohttp.ClientSession:
        """Keep-alive connections into one sandbox, dropped when it is checkpointed or stopped."""
        session = self._pools.get(record.handle)
        if session is None or session.closed:
            session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    limit=0, keepalive_timeout=30.0, use_dns_cache=False
                ),
                auto_decompress=False,
                # an agent answers SYNs in microseconds; a silent address means a dead sandbox
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=_CONNECT_TIMEOUT_S),
                skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
                cookie_jar=aiohttp.DummyCookieJar(),  # a proxy passes cookies, never keeps them
            )
            self._pools[record.handle] = session
        return session

    async def release(self, handle: str) -> None:
        session = self._pools.pop(handle, None)
        if session is not None:
            await session.close()

    async def start(self, host: str, port: int) -> int:
        self.plane.sandbox_listeners.append(self.release)
        # one catch-all handler: aiohttp's low-level server, no Application routing
        server = _Server(
            self._handle,
            head_timeout_s=HEAD_TIMEOUT_S,
            max_field_size=65536,
            keepalive_timeout=_KEEPALIVE_S,
            access_log=None,
        )
        self._runner = web.ServerRunner(server, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, backlog=1024, reuse_address=True)
        await site.start()
        # the runner's public list of bound (host, port, ...) addresses; port 0 picked one
        self.port = int(self._runner.addresses[0][1])
        return self.port

    async def close(self) -> None:
        for task in self._resumes.values():
            task.cancel()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        with contextlib.suppress(ValueError):
            self.plane.sandbox_listeners.remove(self.release)
        for handle in list(self._pools):
            await self.release(handle)

    # ------------------------------------------------------------------ request path
    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        host = request.headers.get("Host", "")
        target = request.raw_path
        if not target.startswith("/"):
            absolute = _absolute_target(target)
            if absolute is None:
                return _text(400, "request target must be a path or an absolute http:// URL")
            host, target = absolute  # RFC 9112 §3.2.2: the target's authority, not Host
        try:
            host.encode()
        except UnicodeEncodeError:
            return _text(400, "invalid Host header: not UTF-8")
        parsed = parse_host(host)
        if isinstance(parsed, str):
            if _is_local_host(host):
                return await self._local(request, host)
            return _text(404, f'invalid host "{host}": {parsed}')
        actor_id, atespace = parsed
        started = time.perf_counter()
        outcome = "error"
        template = ("", "")
        try:
            for attempt in (0, 1):
                record = self.plane.lookup(atespace, actor_id)
                if record is None or record.status != RUNNING or not record.address:
                    try:
                        record = await self._resume(atespace, actor_id)
                    except ApiError as exc:
                        status, body, outcome = _GRPC_TO_HTTP.get(
                            exc.code, (500, 'error resuming actor "{id}"', "error")
                        )
                        return _text(status, body.format(id=actor_id, msg=exc.message))
                template = (record.template_namespace, record.template_name)
                try:
                    response = await self._proxy(request, target, record)
                except _UpstreamDown as down:
                    # the sandbox may have died behind our back: if so the control plane puts
                    # the actor back to SUSPENDED and the next round resumes it
                    if attempt == 0 and await self.plane.sandbox_gone(record.key, record.handle):
                        continue
                    return _text(503, f"upstream connect error or disconnect/reset: {down}")
                outcome = "ok"
                return response
            raise AssertionError("unreachable")
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        finally:
            self.metrics.route_duration.labels(template[0], template[1], outcome).observe(
                time.perf_counter() - started
            )

    async def _resume(self, atespace: str, actor_id: str) -> ActorRecord:
        key = f"{atespace}/{actor_id}"
        task = self._resumes.get(key)
        if task is None or task.done():
            task = asyncio.get_running_loop().create_task(
                self._resume_with_retry(atespace, actor_id)
            )
            self._resumes[key] = task

            def forget(done: asyncio.Task[ActorRecord]) -> None:
                if self._resumes.get(key) is done:
                    del self._resumes[key]

            task.add_done_callback(forget)
        return await asyncio.shield(task)

    async def _resume_with_retry(self, atespace: str, actor_id: str) -> ActorRecord:
        deadline = time.monotonic() + _RESUME_BUDGET_S
        delay = 0.2
        while True:
            try:
                return await asyncio.wait_for(
                    self.plane.resume_actor(atespace, actor_id),
                    timeout=max(0.1, deadline - time.monotonic()),
                )
            except ApiError as exc:
                if exc.code != grpc.StatusCode.ABORTED or time.monotonic() + delay > deadline:
                    raise
            except TimeoutError:
                raise ApiError(
                    grpc.StatusCode.DEADLINE_EXCEEDED, "resume exceeded its budget"
                ) from None
            # ABORTED: another operation holds the actor. Wait for exactly that one to end
            # (no sleeping past it), else back off like atenet's resumer.
            remaining = deadline - time.monotonic()
            if not await self.plane.wait_idle(f"{atespace}/{actor_id}", remaining):
                await asyncio.sleep(delay * random.uniform(0.8, 1.2))
                delay *= 1.5

    async def _proxy(
        self, request: web.BaseRequest, target: str, record: ActorRecord
    ) -> web.StreamResponse:
        pool = self._pool(record)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        url = URL(f"http://{record.address}{target}", encoded=True)  # forwarded as sent
        has_body = request.body_exists
        response: web.StreamResponse | None = None
        try:
            async with asyncio.timeout(self.timeout_s):
                for attempt in (0, 1):
                    try:
                        upstream_cm = pool.request(
                            request.method,
                            url,
                            headers=headers,
                            data=request.content if has_body else None,
                            allow_redirects=False,
                            compress=None,
                        )
                        upstream = await upstream_cm.__aenter__()
                    except aiohttp.ConnectionTimeoutError as exc:
                        raise _UpstreamDown(f"connect to {record.address} timed out") from exc
                    except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
                        # a pooled keep-alive connection died with its sandbox; retry once on a
                        # fresh one when no body bytes were consumed
                        if attempt == 0 and not has_body:
                            continue
                        raise
                    break
                try:
                    length = upstream.headers.get("Content-Length")
                    if (
                        length is not None
                        and length.isdigit()
                        and int(length) <= _SMALL_BODY
                        and request.method != "HEAD"  # HEAD's Content-Length is not its body
                    ):
                        # the common case (exec JSON): one read, one write back
                        kept = CIMultiDict(
                            (name, value)
                            for name, value in upstream.headers.items()
                            if name.lower() not in _HOP_BY_HOP and name.lower() != "content-length"
                        )
                        return web.Response(
                            status=upstream.status,
                            reason=upstream.reason,
                            body=await upstream.read(),
                            headers=kept,
                        )
                    response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
                    for name, value in upstream.headers.items():
                        if name.lower() not in _HOP_BY_HOP:
                            response.headers.add(name, value)
                    if upstream.headers.get("Content-Length") is None and request.version >= (
                        1,
                        1,
                    ):
                        response.enable_chunked_encoding()
                    await response.prepare(request)
                    async for chunk in upstream.content.iter_chunked(_CHUNK):
                        await response.write(chunk)
                    await response.write_eof()
                finally:
                    await upstream_cm.__aexit__(None, None, None)
                return response
        except TimeoutError:
            if response is None or not response.prepared:
                return _text(504, "upstream request timeout")
            # headers already went out: all we can do is cut the connection, as Envoy does
            if request.transport is not None:
                request.transport.close()
            return response
        except aiohttp.ClientError as exc:
            if response is not None and response.prepared:
                if request.transport is not None:
                    request.transport.close()
                return response
            log.info("upstream %s for %s failed: %s", record.address, record.key, exc)
            if isinstance(exc, aiohttp.ClientConnectorError) or not has_body:
                raise _UpstreamDown(str(exc)) from exc
            return _text(503, "upstream connect error or disconnect/reset before headers")

    # ------------------------------------------------------------------ local endpoints
    async def _local(self, request: web.BaseRequest, host: str) -> web.StreamResponse:
        path = request.path
        if path == "/metrics" and request.method == "GET":
            return web.Response(body=self.metrics.render(), headers={"Content-Type": CONTENT_TYPE})
        if path == "/readyz" and request.method == "GET":
            return web.json_response({"status": "ok"})
        handler = self.admin.get((request.method, path))
        if handler is not None:
            return await handler(request)
        return _text(
            404,
            f'invalid host "{host}": not under {ACTOR_DOMAIN} '
            "(this address serves /metrics and /readyz; send actor traffic with "
            "Host: <actor>.<atespace>." + ACTOR_DOMAIN + ")",
        )


def json_error(status: int, code: str, message: str) -> web.Response:
    return web.Response(
        status=status,
        text=json.dumps({"error": {"code": code, "message": message}}),
        content_type="application/json",
    )
