"""The router: Substrate's HTTP entry to actors (Envoy + atenet's ext_proc + atunnel) in one
aiohttp server. Each request goes through three stages, as on a cluster:

1. ext_proc (`_route`): `ate-target-actor` picks the actor (404 `invalid actor reference`);
   ResumeActor over gRPC, one flight per actor, parked on capacity errors (`resumer.py`); the
   answer names the worker (`status.worker_assignment`). Timed as
   `atenet_router_route_duration_seconds`.
2. atunnel on that worker, emulated in-process (`_deliver`): the actor must be placed on the
   worker the answer named (`plane.lookup(...).worker`), else `421 misdirected request` with
   `X-Ate-Assignment-Stale: true`. Locally each actor's sandbox keeps its own address, so the
   request goes to that address: port 80, or the CONNECT authority's port inside a tunnel.
   A sandbox that does not answer there is `502 bad gateway`, reported to the plane (which
   crashes the actor whose workload died).
3. The upstream exchange (`upstream.py`): streamed both ways over pooled keep-alive
   connections, under Envoy's route timeout (5 min from the end of the request body) and
   stream idle timeout (5 min 30 s), both `xds.go@18d1c266`; connect timeout 5 s.

A WebSocket upgrade is routed like any request and then relayed both ways; a CONNECT is
answered 200 and its tunnel served as HTTP by this same server (`tunnel.py`). Any other
Upgrade is Envoy's bodiless 403; an h2c offer is dropped and the request served.

Hostile input answers 4xx, never 500: a Host that is not UTF-8 is 400; an absolute-form target
(`GET http://host/path`) is served with that authority as its Host, as RFC 9112 §3.2.2 and
Envoy do; any other non-origin target is 400; request heads have a 10 s deadline (`http1.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import aiohttp
from aiohttp import web
from yarl import URL

from gym_substrate.local.errors import AteapiError
from gym_substrate.local.metrics import Metrics
from gym_substrate.local.router import headers as hdr
from gym_substrate.local.router.errors import (
    ParkingFull,
    bare_reply,
    map_resume_error,
    text_reply,
)
from gym_substrate.local.router.http1 import HEAD_TIMEOUT_S, HeadDeadlineServer, Tunnel, tunnel_of
from gym_substrate.local.router.parking import DEFAULT_PARKED_REQUEST_MAX, ParkingLot
from gym_substrate.local.router.resumer import (
    DEFAULT_BUDGET_S,
    DEFAULT_RETRY_FACTOR,
    DEFAULT_RETRY_INTERVAL_S,
    DEFAULT_RETRY_JITTER,
    UNKNOWN,
    ActorResumer,
    ResumeApi,
)
from gym_substrate.local.router.tunnel import Feed, serve_inside, splice
from gym_substrate.local.router.upstream import (
    Limits,
    SandboxDown,
    forward,
    forward_websocket,
    go_error,
    upstream_authority,
)

__all__ = [
    "CONNECT_TIMEOUT_S",
    "ROUTE_TIMEOUT_S",
    "Router",
    "RouterPlane",
    "RouterRecord",
    "upstream_authority",
]

log = logging.getLogger(__name__)

ROUTE_TIMEOUT_S = 300.0  # defaultRouteTimeout (xds.go@18d1c266)
CONNECT_TIMEOUT_S = 5.0  # actor_original_dst's connect timeout
_EXTPROC_EXTRA_S = 5.0  # ext_proc message timeout: the budget + 5 s (5 s with parking off)
_KEEPALIVE_S = 3630.0  # an idle keep-alive connection (no request begun): aiohttp's default


class RouterRecord(Protocol):
    """What the router reads of an actor's record in the control plane."""

    @property
    def address(self) -> str: ...  # the sandbox's IP (agent on :80), or ip:port; "" if none

    @property
    def handle(self) -> str: ...  # the runtime handle of its sandbox

    @property
    def worker(self) -> str | None: ...  # the name of the worker it is placed on


SandboxListener = Callable[[str], Awaitable[None]]


class RouterPlane(Protocol):
    """What the router needs from the control plane (the in-process fast path)."""

    @property
    def sandbox_listeners(self) -> list[SandboxListener]: ...  # called with a stopped handle

    def lookup(self, atespace: str, name: str, /) -> RouterRecord | None: ...

    async def sandbox_gone(self, key: str, handle: str, /) -> object: ...  # key "atespace/name"


@dataclass(frozen=True)
class _Route:
    """ext_proc's decision: the actor, the port to reach and the worker the answer named."""

    ref: hdr.ActorRef
    port: int
    worker: str | None


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


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
    """The protocol a request asks to switch to (lower case), else None."""
    wanted = request.headers.get("Upgrade")
    if not wanted or wanted.strip().lower() == "h2c":
        return None  # Envoy's HTTP/1 codec drops an h2c offer and serves the request
    tokens = {
        token.strip().lower()
        for value in request.headers.getall("Connection", [])
        for token in value.split(",")
    }
    return wanted.strip().lower() if "upgrade" in tokens else None


class Router:
    """The router on one port. Keyword arguments are atenet's flags (defaults as upstream's):
    the route, idle and connect timeouts, the parking lot's size (0 disables parking) and the
    flight's budget and backoff; `extproc_timeout_s` is Envoy's wait for ext_proc (the budget +
    5 s). Tests scale them down; the CLI exposes the lot and the budget."""

    def __init__(
        self,
        plane: RouterPlane,
        api: ResumeApi,
        metrics: Metrics,
        *,
        route_timeout_s: float = ROUTE_TIMEOUT_S,
        parked_request_max: int = DEFAULT_PARKED_REQUEST_MAX,
        parked_request_budget_s: float = DEFAULT_BUDGET_S,
        retry_interval_s: float = DEFAULT_RETRY_INTERVAL_S,
        retry_factor: float = DEFAULT_RETRY_FACTOR,
        retry_jitter: float = DEFAULT_RETRY_JITTER,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        idle_timeout_s: float | None = None,
        extproc_timeout_s: float | None = None,
        head_timeout_s: float = HEAD_TIMEOUT_S,
        rng: random.Random | None = None,
    ) -> None:
        for name, value in (
            ("route_timeout_s", route_timeout_s),
            ("connect_timeout_s", connect_timeout_s),
            ("head_timeout_s", head_timeout_s),
            ("idle_timeout_s", 1.0 if idle_timeout_s is None else idle_timeout_s),
            ("extproc_timeout_s", 1.0 if extproc_timeout_s is None else extproc_timeout_s),
        ):
            if value <= 0:
                raise ValueError(f"{name} must be > 0 seconds, got {value}")
        self.plane = plane
        self.metrics = metrics
        self.lot = ParkingLot(parked_request_max, metrics)
        # ResumeActor goes through the API server, as atenet's does
        self.resumer = ActorResumer(
            api,
            self.lot,
            budget_s=parked_request_budget_s,
            retry_interval_s=retry_interval_s,
            retry_factor=retry_factor,
            retry_jitter=retry_jitter,
            rng=rng,
        )
        self.route_timeout_s = route_timeout_s
        # routeIdleTimeout: max(route timeout + 30 s, 5 min)
        self.idle_timeout_s = idle_timeout_s or max(route_timeout_s + 30.0, 300.0)
        self.connect_timeout_s = connect_timeout_s
        self.head_timeout_s = head_timeout_s
        # how long Envoy waits for ext_proc's answer (dataplane.go@18d1c266)
        self.extproc_timeout_s = extproc_timeout_s or _EXTPROC_EXTRA_S + (
            parked_request_budget_s if self.lot.enabled else 0.0
        )
        self._pools: dict[str, aiohttp.ClientSession] = {}
        self._server: HeadDeadlineServer | None = None
        self._runner: web.ServerRunner | None = None
        self.limits = Limits(route_timeout_s, self.idle_timeout_s, "127.0.0.1")
        self.port = 0

    # ------------------------------------------------------------------ lifecycle
    async def start(self, host: str, port: int) -> int:
        self.plane.sandbox_listeners.append(self.release)
        # what atunnel sees as its peer on a cluster: the router's own address
        self.limits = dataclasses.replace(self.limits, router_ip=host)
        # one catch-all handler: aiohttp's low-level server, no Application routing; a client
        # that leaves cancels its handler, as Envoy resets the upstream stream
        self._server = HeadDeadlineServer(
            self._handle,
            head_timeout_s=self.head_timeout_s,
            handler_cancellation=True,
            max_field_size=65536,
            keepalive_timeout=_KEEPALIVE_S,
            access_log=None,
        )
        self._runner = web.ServerRunner(self._server, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, backlog=1024, reuse_address=True)
        await site.start()
        # the runner's public list of bound (host, port, ...) addresses; port 0 picked one
        self.port = int(self._runner.addresses[0][1])
        return self.port

    async def close(self) -> None:
        await self.resumer.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        with contextlib.suppress(ValueError):
            self.plane.sandbox_listeners.remove(self.release)
        for key in list(self._pools):
            await self.release(key)

    def _pool(self, record: RouterRecord) -> aiohttp.ClientSession:
        """Keep-alive connections into one sandbox, dropped when it is checkpointed or stopped."""
        key = record.handle or record.address
        session = self._pools.get(key)
        if session is None or session.closed:
            session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    limit=0, keepalive_timeout=30.0, use_dns_cache=False
                ),
                auto_decompress=False,
                # an agent answers SYNs in microseconds; a silent address is a dead sandbox
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.connect_timeout_s),
                skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
                cookie_jar=aiohttp.DummyCookieJar(),  # a proxy passes cookies, never keeps them
            )
            self._pools[key] = session
        return session

    async def release(self, handle: str) -> None:
        session = self._pools.pop(handle, None)
        if session is not None:
            await session.close()

    # ------------------------------------------------------------------ request path
    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        tunnel = tunnel_of(request)
        if request.method == "CONNECT":
            if tunnel is None:
                return await self._connect(request)
            return self._refuse_upgrade()  # main_internal has no CONNECT upgrade config
        upgrade = _upgrade(request)
        if upgrade is not None and upgrade != "websocket":
            return self._refuse_upgrade()  # Envoy's upgrade_failed: no resume runs
        target, host = request.raw_path, request.headers.get("Host", "")
        if not target.startswith("/"):
            absolute = _absolute_target(target)
            if absolute is None:
                return text_reply(400, "request target must be a path or an absolute http:// URL")
            host, target = absolute  # RFC 9112 §3.2.2: the target's authority is the Host
        try:
            host.encode()
        except UnicodeEncodeError:
            return text_reply(400, "invalid Host header: not UTF-8")
        routed = await self._route(request, tunnel)
        if isinstance(routed, web.StreamResponse):
            return routed
        override = host if host != request.headers.get("Host", "") else None
        return await self._deliver(request, target, override, routed, websocket=upgrade is not None)

    @staticmethod
    def _refuse_upgrade() -> web.StreamResponse:
        refused = bare_reply(403)
        refused.force_close()  # the bytes after the head are another protocol
        return refused

    async def _route(
        self, request: web.BaseRequest, tunnel: Tunnel | None
    ) -> _Route | web.StreamResponse:
        """ext_proc's part: the actor and its worker, or the answer that replaces the request."""
        started = time.perf_counter()
        template = ("unknown", "unknown")
        outcome, resume = "resume_error", UNKNOWN
        try:
            value = hdr.target_value(request.headers, tunnel.target if tunnel else None)
            ref = hdr.parse_target_actor(value)
            if ref is None:
                outcome = "not_found"
                return text_reply(404, "invalid actor reference")
            try:
                actor, resume = await self.resumer.resume(ref, wait_s=self.extproc_timeout_s)
            except TimeoutError:
                # Envoy's ext_proc message timeout: its own bodiless 504; the flight goes on
                outcome = "cancelled"
                return bare_reply(504)
            except (AteapiError, ParkingFull) as exc:
                denied = map_resume_error(ref, exc)
                outcome = denied.outcome
                return denied.reply()
            template = (
                actor.actor_template.atespace or "unknown",
                actor.actor_template.name or "unknown",
            )
            assignment = actor.status.worker_assignment
            ips = assignment.worker_pod_ips
            if not ips or not _is_ip(ips[0]):
                return text_reply(500, f"actor {ref} routing failed")
            outcome = "ok"
            port = tunnel.port if tunnel is not None else hdr.DEFAULT_ACTOR_PORT
            return _Route(ref, port, assignment.worker.name or None)
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        finally:
            self.metrics.route_duration.labels(*template, outcome, resume).observe(
                time.perf_counter() - started
            )

    async def _deliver(
        self,
        request: web.BaseRequest,
        target: str,
        host: str | None,
        route: _Route,
        *,
        websocket: bool,
    ) -> web.StreamResponse:
        """atunnel's part: the actor must be active on the named worker; then the exchange."""
        record = self.plane.lookup(route.ref.atespace, route.ref.name)
        if record is None or not record.address or (record.worker or None) != route.worker:
            return go_error(421, "misdirected request", **{hdr.STALE_ASSIGNMENT_HEADER: "true"})
        authority = upstream_authority(record.address, route.port)
        if authority is None:
            log.warning("actor %s: its sandbox address %r holds no IP", route.ref, record.address)
            return go_error(502, "bad gateway")
        exchange = forward_websocket if websocket else forward
        try:
            return await exchange(request, target, host, self._pool(record), authority, self.limits)
        except SandboxDown as down:
            log.info("actor %s: its sandbox at %s is not answering: %s", route.ref, authority, down)
            # the plane crashes the actor if its workload is dead (upstream: atelet does)
            await self.plane.sandbox_gone(str(route.ref), record.handle)
            return go_error(502, "bad gateway")

    async def _connect(self, request: web.BaseRequest) -> web.StreamResponse:
        """Terminate a CONNECT: 200, then serve the tunnel's bytes as HTTP (Envoy's
        `connect_terminate` listener handing them to `main_internal`)."""
        server = self._server
        assert server is not None
        values = request.headers.getall(hdr.TARGET_ACTOR_HEADER, [])
        tunnel = Tunnel(
            target=",".join(values) if values else None, port=hdr.connect_port(request.raw_path)
        )
        inside = await serve_inside(lambda: server.connection(tunnel))
        response = web.StreamResponse(status=200, headers={"Server": "envoy"})
        try:
            await response.prepare(request)
            response.force_close()
            down = Feed(request.transport)
            request.protocol.set_parser(down)  # type: ignore[arg-type]
            await splice(
                down, response.write, inside.feed, inside.write, idle_timeout_s=self.idle_timeout_s
            )
        finally:
            if inside.transport is not None:
                inside.transport.close()
        if request.transport is not None:
            request.transport.close()
        return response
