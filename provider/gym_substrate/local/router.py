"""The router: Substrate's Host-based HTTP entry to actors, as one aiohttp reverse proxy.

It stands in for atenet's Envoy plus its ext_proc server (reference/substrate.md §4) and fails
the way they do:

- `Host: <actor>.<atespace>.actors.resources.substrate.ate.dev[:port]` picks the actor, matched
  case-sensitively; any other Host (127.0.0.1 and localhost included) is `404 invalid host`.
  The backend's own endpoints live on the admin listener (`admin.py`), not here.
- Every request calls ResumeActor over gRPC on the backend's own API server (`resume_client`),
  RUNNING actor or not, as ext_proc does, and dials the address in the answer. Concurrent
  requests for one actor share one call, which runs detached with a 15 s budget and retries
  ABORTED with atenet's backoff (7 tries from 200 ms, x1.5, +0-20 % jitter). The request waits
  for it at most `EXTPROC_TIMEOUT_S` (Envoy's ext_proc timeout): past that it gets Envoy's bare
  `504` with an empty body while the resume carries on for the next request.
  Resume errors map to atenet's statuses and bodies.
- The actor gets the request as Envoy forwards it: `Host: <ip>:<port>` (the actor's address,
  port 80 when the record has none), `x-request-id` (kept, or a new UUID), `x-forwarded-proto`,
  `x-envoy-expected-rq-timeout-ms`; the client gets `server: envoy` and
  `x-envoy-upstream-service-time` on every answer.
- The route timeout (10 s by default) counts from the end of the request body, as Envoy's does,
  so a slow upload is never cut; an answer not complete by then is `504 upstream request
  timeout` (or a cut connection once its headers went out).
- An Upgrade (WebSocket, anything but h2c) or CONNECT is `403` with an empty body, before any
  resume: Substrate's listener has no upgrade configs.

Bodies stream both ways and upstream connections are pooled keep-alive (aiohttp sets
TCP_NODELAY), because the router sits on the latency path of every exec.

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
import logging
import random
import time
import uuid
from collections.abc import AsyncIterator, Callable
from http import HTTPStatus
from typing import Any

import aiohttp
import grpc
from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from multidict import CIMultiDict
from yarl import URL

from gym_substrate._names import ACTOR_DOMAIN, is_dns_label
from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.local.control.plane import ControlPlane
from gym_substrate.local.control.records import ActorRecord
from gym_substrate.local.errors import ApiError
from gym_substrate.local.metrics import Metrics
from gym_substrate.local.resume_client import ResumeClient

__all__ = [
    "EXTPROC_TIMEOUT_S",
    "HEAD_TIMEOUT_S",
    "RESUME_BUDGET_S",
    "HeadDeadlineServer",
    "Router",
    "parse_host",
    "upstream_authority",
]

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
# Envoy overwrites the upstream's `server` and adds its own timing header
_REPLACED_ON_THE_WAY_BACK = _HOP_BY_HOP | {"server", "content-length"}
# Envoy's ext_proc timeout and message_timeout (xds.go): the resume phase of one request
EXTPROC_TIMEOUT_S = 5.0
# the resumer's detached budget for one shared resume (resumer.go)
RESUME_BUDGET_S = 15.0
# the resumer's ABORTED backoff (resumer.go): 7 tries, sleeps 200 ms x1.5^n, +0-20 % jitter
_RESUME_TRIES = 7
_BACKOFF_FIRST_S = 0.2
_BACKOFF_FACTOR = 1.5
_BACKOFF_JITTER = 0.2
_CHUNK = 256 * 1024
# Envoy's default connect_timeout: the dynamic forward proxy cluster to actors sets none (xds.go)
_CONNECT_TIMEOUT_S = 5.0
_SMALL_BODY = 64 * 1024
_ACTOR_PORT = 80  # atenet only ever forwards to port 80 of the actor
# a request head (request line + headers) must be complete this long after its first byte
HEAD_TIMEOUT_S = 10.0
# an idle keep-alive connection (no request begun) is closed after this, as aiohttp's default
_KEEPALIVE_S = 3630.0
_TIMEOUT_408 = (
    b"HTTP/1.1 408 Request Timeout\r\nContent-Type: text/plain\r\nConnection: close\r\n"
    b"Content-Length: %d\r\n\r\n%s"
)
_ENVOY = "envoy"
_CONNECT_ERROR = "upstream connect error or disconnect/reset before headers. reset reason: "
_CONNECT_FAILURE = _CONNECT_ERROR + "connection failure"  # refused, reset


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

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """The HTTP parser's answer to bytes that are not a valid request: one log line, not
        aiohttp's traceback at ERROR per request (any client could fill the log with them),
        and the plain-text status Envoy sends."""
        if status >= 500:
            return super().handle_error(request, status, exc, message)
        detail = " ".join((message or str(exc or "") or "unreadable request").split())[:200]
        log.info("malformed request from %s answered %d: %s", request.remote, status, detail)
        if request.writer.output_size > 0:  # as aiohttp: too late for another answer
            raise ConnectionError("response already sent; cannot send the error answer")
        try:
            text = HTTPStatus(status).phrase
        except ValueError:
            text = "Bad Request"
        resp = web.Response(status=status, text=text, headers={"server": "envoy"})
        resp.force_close()
        return resp

    def _head_expired(self) -> None:
        self._head_timer = None
        if self._current_request is not None or self._messages or self.transport is None:
            return
        body = f"request head not complete within {self._head_timeout_s:g} s".encode()
        self.transport.write(_TIMEOUT_408 % (len(body), body))
        self.force_close()


class HeadDeadlineServer(web.Server):
    """A low-level aiohttp server whose connections are `_HeadDeadline` handlers."""

    def __init__(self, handler: Any, *, head_timeout_s: float, **kwargs: Any) -> None:
        super().__init__(handler, **kwargs)
        self._handler_kwargs = dict(kwargs)
        self._head_timeout_s = head_timeout_s

    def __call__(self) -> RequestHandler:
        return _HeadDeadline(
            self, loop=self._loop, head_timeout_s=self._head_timeout_s, **self._handler_kwargs
        )


def _split_host_port(host: str) -> tuple[str, str | None]:
    """``host`` without its port, as Go's net.SplitHostPort splits it; else (host, reason)."""
    if ":" not in host:
        return host, None
    if host.startswith("["):
        inside, bracket, after = host[1:].partition("]")
        if not bracket or not after.startswith(":") or ":" in after[1:]:
            return host, f"{host!r} is not a host:port"
        return inside, None
    name, _, _port = host.rpartition(":")
    if ":" in name:
        return host, f"{host!r} has too many colons for a host:port"
    return name, None


def parse_host(host: str) -> tuple[str, str] | str:
    """(actor_id, atespace) from a Host header, or the reason it is not an actor's host.

    Case-sensitive, as atenet's parser: `A1.t.actors...` names no actor (ids are lower case).
    """
    name, bad = _split_host_port(host)
    if bad is not None:
        return bad
    name = name.removesuffix(".")
    suffix = "." + ACTOR_DOMAIN
    if not name.endswith(suffix):
        return f"not a name under {ACTOR_DOMAIN}"
    actor_id, dot, atespace = name[: -len(suffix)].partition(".")
    if not dot:
        return f"want <actor_id>.<atespace>.{ACTOR_DOMAIN}"
    for what, label in (("actor id", actor_id), ("atespace", atespace)):
        if not is_dns_label(label):
            return (
                f"{what} {label!r} is not a DNS-1123 label (1-63 of lower-case a-z, 0-9 and "
                "'-', alphanumeric at both ends)"
            )
    return actor_id, atespace


def upstream_authority(address: str) -> str | None:
    """`<ip>:<port>` to dial for an actor's recorded address (port 80 when it has none).

    None when the address holds no IP address: atenet answers such an actor 500.
    """
    text, port = address, _ACTOR_PORT
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        name, colon, port_text = address.rpartition(":")
        if not colon or not port_text.isdigit() or not 0 < int(port_text) < 65536:
            return None
        port = int(port_text)
        if name.startswith("[") and name.endswith("]"):
            name = name[1:-1]
        try:
            ip = ipaddress.ip_address(name)
        except ValueError:
            return None
    return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"


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


def _upgrade(request: web.BaseRequest) -> str | None:
    """The protocol a request asks to switch to (CONNECT counts, as in Envoy), else None."""
    if request.method == "CONNECT":
        return "CONNECT"
    wanted = request.headers.get("Upgrade")
    if not wanted or wanted.strip().lower() == "h2c":
        return None  # Envoy's HTTP/1 codec drops an h2c offer and serves the request
    tokens = {
        token.strip().lower()
        for value in request.headers.getall("Connection", [])
        for token in value.split(",")
    }
    return wanted if "upgrade" in tokens else None


def _text(status: int, body: str) -> web.Response:
    """A reply of the router itself (ext_proc's immediate responses, Envoy's local replies)."""
    return web.Response(
        status=status, text=body, content_type="text/plain", headers={"Server": _ENVOY}
    )


def _bare(status: int) -> web.Response:
    """An Envoy local reply without a body (ext_proc timeout, refused upgrade)."""
    return web.Response(status=status, headers={"Server": _ENVOY})


_GRPC_TO_HTTP = {
    grpc.StatusCode.NOT_FOUND: (404, 'actor "{id}" not found', "not_found"),
    grpc.StatusCode.FAILED_PRECONDITION: (503, 'actor "{id}" unavailable: {msg}', "error"),
    grpc.StatusCode.UNAVAILABLE: (503, 'actor "{id}" unavailable', "error"),
    grpc.StatusCode.DEADLINE_EXCEEDED: (504, 'actor "{id}" request timed out', "error"),
    grpc.StatusCode.PERMISSION_DENIED: (403, 'actor "{id}" access denied', "error"),
    grpc.StatusCode.UNAUTHENTICATED: (401, 'actor "{id}" authentication required', "error"),
    grpc.StatusCode.RESOURCE_EXHAUSTED: (429, 'actor "{id}" rate limited', "error"),
}  # anything else, ABORTED through every retry included, is atenet's 500
_OTHER_ERROR = (500, 'error resuming actor "{id}"', "error")


class _UpstreamDown(Exception):
    """The agent could not be reached and the request can be replayed (no body consumed)."""

    def __init__(self, message: str, reason: str = "connection failure") -> None:
        super().__init__(message)
        self.reason = reason  # Envoy's reset reason, e.g. "connection timeout"


class Router:
    def __init__(
        self, plane: ControlPlane, api: ResumeClient, metrics: Metrics, *, timeout_s: float = 10.0
    ) -> None:
        if timeout_s <= 0:
            raise ValueError("router timeout must be > 0 seconds")
        self.plane = plane
        self.api = api  # ResumeActor goes through the API server, as atenet's does
        self.metrics = metrics
        self.timeout_s = timeout_s
        self._expected_ms = str(max(1, round(timeout_s * 1000)))
        self._resumes: dict[str, asyncio.Task[ActorRecord]] = {}
        self._pools: dict[str, aiohttp.ClientSession] = {}
        self._runner: web.ServerRunner | None = None
        self.port = 0

    def _pool(self, record: ActorRecord) -> aiohttp.ClientSession:
        """Keep-alive connections into one sandbox, dropped when it is checkpointed or stopped."""
        # a record rebuilt from a stale answer has no handle: its address keys the pool
        key = record.handle or record.address
        session = self._pools.get(key)
        if session is None or session.closed:
            session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    limit=0, keepalive_timeout=30.0, use_dns_cache=False
                ),
                auto_decompress=False,
                # an agent answers SYNs in microseconds; a silent address means a dead sandbox
                # (a gVisor one: its netstack held the address), answered as Envoy does
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=_CONNECT_TIMEOUT_S),
                skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
                cookie_jar=aiohttp.DummyCookieJar(),  # a proxy passes cookies, never keeps them
            )
            self._pools[key] = session
        return session

    async def release(self, handle: str) -> None:
        session = self._pools.pop(handle, None)
        if session is not None:
            await session.close()

    async def start(self, host: str, port: int) -> int:
        self.plane.sandbox_listeners.append(self.release)
        # one catch-all handler: aiohttp's low-level server, no Application routing
        server = HeadDeadlineServer(
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
        resumes = list(self._resumes.values())
        for task in resumes:
            task.cancel()
        await asyncio.gather(*resumes, return_exceptions=True)
        await self.api.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        with contextlib.suppress(ValueError):
            self.plane.sandbox_listeners.remove(self.release)
        for handle in list(self._pools):
            await self.release(handle)

    # ------------------------------------------------------------------ request path
    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        if _upgrade(request) is not None:
            # Envoy's connection manager refuses it before any filter (no resume) runs
            refused = _bare(403)
            refused.force_close()  # the bytes after the head are another protocol
            return refused
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
        for attempt in (0, 1):
            routed = await self._route(host)
            if isinstance(routed, web.StreamResponse):
                return routed
            record, authority = routed
            try:
                return await self._proxy(request, target, record, authority)
            except _UpstreamDown as down:
                # the sandbox may have died behind our back: if so the control plane puts
                # the actor back to SUSPENDED and the next round resumes it
                log.info("upstream %s for %s is down: %s", authority, record.key, down)
                if attempt == 0 and await self.plane.sandbox_gone(record.key, record.handle):
                    continue
                return _text(503, _CONNECT_ERROR + down.reason)
        raise AssertionError("unreachable")

    async def _route(self, host: str) -> tuple[ActorRecord, str] | web.StreamResponse:
        """ext_proc's part: the actor's upstream address, or the answer that replaces it.

        Timed as atenet times it (`atenet_router_route_duration_seconds`): the routing only,
        not the upstream's answer.
        """
        started = time.perf_counter()
        outcome = "error"
        template = ("", "")
        try:
            parsed = parse_host(host)
            if isinstance(parsed, str):
                outcome = "not_found"
                return _text(404, f'invalid host "{host}": {parsed}')
            actor_id, atespace = parsed
            try:
                async with asyncio.timeout(EXTPROC_TIMEOUT_S):
                    record = await self._resume(atespace, actor_id)
            except TimeoutError:
                # Envoy gave up on ext_proc: its own 504, no body; the resume goes on
                outcome = "cancelled"
                return _bare(504)
            except ApiError as exc:
                status, body, outcome = _GRPC_TO_HTTP.get(exc.code, _OTHER_ERROR)
                return _text(status, body.format(id=actor_id, msg=exc.message))
            template = (record.template_namespace, record.template_name)
            authority = upstream_authority(record.address)
            if authority is None:
                return _text(500, f'actor "{actor_id}" routing failed')
            outcome = "ok"
            return record, authority
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        finally:
            self.metrics.route_duration.labels(template[0], template[1], outcome).observe(
                time.perf_counter() - started
            )

    async def _resume(self, atespace: str, actor_id: str) -> ActorRecord:
        """Join or start the one ResumeActor of this actor; it outlives the caller."""
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
                if not done.cancelled():
                    done.exception()  # retrieved: nobody may be waiting any more

            task.add_done_callback(forget)
        return await asyncio.shield(task)

    async def _resume_with_retry(self, atespace: str, actor_id: str) -> ActorRecord:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + RESUME_BUDGET_S
        delay = _BACKOFF_FIRST_S
        for attempt in range(_RESUME_TRIES):
            try:
                return await self._resume_call(atespace, actor_id, deadline)
            except ApiError as exc:
                if exc.code != grpc.StatusCode.ABORTED or attempt == _RESUME_TRIES - 1:
                    raise
            # ABORTED: another operation holds the actor's lock; back off as atenet does
            pause = delay * (1 + random.uniform(0, _BACKOFF_JITTER))
            delay *= _BACKOFF_FACTOR
            if loop.time() + pause >= deadline:
                break
            await asyncio.sleep(pause)
        raise ApiError(grpc.StatusCode.UNKNOWN, "timed out waiting for the condition")

    async def _resume_call(self, atespace: str, actor_id: str, deadline: float) -> ActorRecord:
        """One ResumeActor over gRPC under the resumer's deadline.

        As atenet's: when the deadline passes the caller gets DEADLINE_EXCEEDED at once, and
        the API server stops the workflow where it is (a gVisor sandbox it was starting takes
        about 2 s to destroy, holding the actor's lock until then).
        """
        remaining = deadline - asyncio.get_running_loop().time()
        if remaining <= 0:
            raise ApiError(grpc.StatusCode.DEADLINE_EXCEEDED, "context deadline exceeded")
        actor = await self.api.resume(atespace, actor_id, remaining)
        return self._routed(atespace, actor_id, actor)

    def _routed(self, atespace: str, actor_id: str, actor: pb.Actor) -> ActorRecord:
        """The record to proxy with: the answer's address, as the real router dials it.

        The plane's record adds the sandbox handle (the pool's key and what `sandbox_gone`
        checks) while it still names that address; if the actor moved since the answer, the
        request goes where the answer said and meets what a stale address meets on a cluster.
        """
        record = self.plane.lookup(atespace, actor_id)
        if record is not None and record.address == actor.ateom_pod_ip:
            return record
        return ActorRecord(
            atespace=atespace,
            actor_id=actor_id,
            template_namespace=actor.actor_template_namespace,
            template_name=actor.actor_template_name,
            status=pb.Actor.Status.Name(actor.status),
            address=actor.ateom_pod_ip,
        )

    def _upstream_headers(self, request: web.BaseRequest, authority: str) -> CIMultiDict[str]:
        """The request headers as Envoy forwards them to the actor."""
        h2c = request.headers.get("Upgrade", "").lower() == "h2c"
        headers: CIMultiDict[str] = CIMultiDict(
            (name, value)
            for name, value in request.headers.items()
            if name.lower() not in _HOP_BY_HOP and not (h2c and name.lower() == "http2-settings")
        )
        headers["Host"] = authority  # ext_proc rewrites :authority to the actor's address
        if "x-request-id" not in headers:
            headers["x-request-id"] = str(uuid.uuid4())
        headers["x-forwarded-proto"] = "http"
        headers["x-envoy-expected-rq-timeout-ms"] = self._expected_ms
        return headers

    @staticmethod
    def _downstream_headers(upstream: aiohttp.ClientResponse, took_s: float) -> CIMultiDict[str]:
        kept: CIMultiDict[str] = CIMultiDict(
            (name, value)
            for name, value in upstream.headers.items()
            if name.lower() not in _REPLACED_ON_THE_WAY_BACK
        )
        kept["Server"] = _ENVOY
        kept["x-envoy-upstream-service-time"] = str(int(took_s * 1000))
        return kept

    async def _proxy(
        self, request: web.BaseRequest, target: str, record: ActorRecord, authority: str
    ) -> web.StreamResponse:
        pool = self._pool(record)
        headers = self._upstream_headers(request, authority)
        url = URL(f"http://{authority}{target}", encoded=True)  # forwarded as sent
        has_body = request.body_exists
        response: web.StreamResponse | None = None
        loop = asyncio.get_running_loop()
        try:
            # Envoy's route timeout starts once the whole request (its body too) is in
            async with asyncio.timeout(None) as limit:
                start_clock = _clock_starter(limit, loop, self.timeout_s)
                if not has_body:
                    start_clock()
                for attempt in (0, 1):
                    sent = loop.time()
                    try:
                        upstream_cm = pool.request(
                            request.method,
                            url,
                            headers=headers,
                            data=_body(request, start_clock) if has_body else None,
                            allow_redirects=False,
                            compress=None,
                        )
                        upstream = await upstream_cm.__aenter__()
                    except aiohttp.ConnectionTimeoutError as exc:
                        raise _UpstreamDown(
                            f"connect to {authority} timed out", "connection timeout"
                        ) from exc
                    except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
                        # a pooled keep-alive connection died with its sandbox; retry once on a
                        # fresh one when no body bytes were consumed
                        if attempt == 0 and not has_body:
                            continue
                        raise
                    break
                try:
                    kept = self._downstream_headers(upstream, loop.time() - sent)
                    length = upstream.headers.get("Content-Length")
                    if (
                        length is not None
                        and length.isdigit()
                        and int(length) <= _SMALL_BODY
                        and request.method != "HEAD"  # HEAD's Content-Length is not its body
                    ):
                        # the common case (exec JSON): one read, one write back
                        return web.Response(
                            status=upstream.status,
                            reason=upstream.reason,
                            body=await upstream.read(),
                            headers=kept,
                        )
                    if length is not None:
                        kept["Content-Length"] = length
                    response = web.StreamResponse(
                        status=upstream.status, reason=upstream.reason, headers=kept
                    )
                    if length is None and request.version >= (1, 1):
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
            log.info("upstream %s for %s failed: %s", authority, record.key, exc)
            if isinstance(exc, aiohttp.ClientConnectorError) or not has_body:
                raise _UpstreamDown(str(exc)) from exc
            return _text(503, _CONNECT_FAILURE)


def _clock_starter(
    limit: asyncio.Timeout, loop: asyncio.AbstractEventLoop, seconds: float
) -> Callable[[], None]:
    """A callback that arms ``limit`` ``seconds`` from when it is called (once; never late)."""

    def start() -> None:
        if limit.when() is None and not limit.expired():
            with contextlib.suppress(RuntimeError):  # the exchange already ended
                limit.reschedule(loop.time() + seconds)

    return start


async def _body(request: web.BaseRequest, at_end: Callable[[], None]) -> AsyncIterator[bytes]:
    """The request body as it arrives; ``at_end`` runs once the client has sent all of it."""
    async for chunk in request.content.iter_any():
        yield chunk
    at_end()
