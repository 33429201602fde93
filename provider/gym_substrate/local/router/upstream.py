"""The exchange with the actor's sandbox, as Envoy and atunnel carry it.

- Bodies stream both ways over the pooled keep-alive connections the caller passes (aiohttp
  sets TCP_NODELAY): the router sits on the latency path of every exec.
- Envoy's route timeout counts from the end of the request body (a slow upload is never cut by
  it): an answer not complete by then is `504 upstream request timeout`, or a cut connection
  once its headers went out. Between two chunks of a request body the stream idle timeout
  applies: `408 stream timeout`.
- A sandbox that refuses or does not take the connection within the connect timeout raises
  `SandboxDown`; the caller answers atunnel's `502 bad gateway`
  (`internal/atunnel/ingress.go`, read_file id 68666963451, the proxy's ErrorHandler).
- A WebSocket handshake is forwarded as is; on the actor's 101 both directions are relayed
  (`tunnel.splice`) until one side ends or the stream idles.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from gym_substrate.local.router import headers as hdr
from gym_substrate.local.router.errors import text_reply
from gym_substrate.local.router.tunnel import Feed, splice

__all__ = [
    "Limits",
    "SandboxDown",
    "forward",
    "forward_websocket",
    "go_error",
    "upstream_authority",
]

log = logging.getLogger(__name__)

_CHUNK = 256 * 1024
_SMALL_BODY = 64 * 1024
_CONNECT_FAILED = (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError)


class SandboxDown(Exception):
    """The sandbox did not take the request (atunnel's dial or round trip failed)."""


@dataclass(frozen=True)
class Limits:
    """Envoy's limits and the values the actor sees about the hop."""

    route_timeout_s: float
    idle_timeout_s: float
    router_ip: str  # atunnel's peer: what the actor reads in X-Forwarded-For

    @property
    def expected_timeout_ms(self) -> int:
        return max(1, round(self.route_timeout_s * 1000))


def upstream_authority(address: str, port: int = hdr.DEFAULT_ACTOR_PORT) -> str | None:
    """`<ip>:<port>` to dial for a sandbox address; None when it holds no IP.

    A record of `ip:p` (a process-runtime agent without root cannot listen on 80) serves
    port 80 on `p`; every other port is dialled as asked.
    """
    text, own_port = address, None
    name, colon, port_text = address.rpartition(":")
    if colon and port_text.isdigit() and ("." in name or name.startswith("[")):
        text, own_port = name.removeprefix("[").removesuffix("]"), int(port_text)
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return None
    if own_port is not None and port == hdr.DEFAULT_ACTOR_PORT:
        port = own_port
    return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"


def go_error(status: int, text: str, **extra: str) -> web.Response:
    """Go's `http.Error(w, text, status)` from atunnel, as Envoy relays it."""
    headers = hdr.go_error_headers()
    headers.update(extra)
    return web.Response(status=status, body=f"{text}\n".encode(), headers=headers)


def _cut(request: web.BaseRequest, response: web.StreamResponse) -> web.StreamResponse:
    """Close the client's connection: too late for another answer."""
    if request.transport is not None:
        request.transport.close()
    return response


async def forward(
    request: web.BaseRequest,
    target: str,
    host: str | None,
    pool: aiohttp.ClientSession,
    authority: str,
    limits: Limits,
) -> web.StreamResponse:
    """One request to `http://<authority><target>` and its answer back, streamed; ``host``
    replaces the Host header (the authority of an absolute-form target)."""
    headers = hdr.upstream_headers(
        request.headers,
        router_ip=limits.router_ip,
        expected_timeout_ms=limits.expected_timeout_ms,
        host=host,
    )
    url = URL(f"http://{authority}{target}", encoded=True)  # forwarded as sent
    begun: list[web.StreamResponse] = []  # the streamed answer, once there is one
    loop = asyncio.get_running_loop()
    body = _Body(request, limits.idle_timeout_s) if request.body_exists else None
    try:
        # Envoy's route timeout starts once the whole request (its body too) is in
        async with asyncio.timeout(None) as limit:
            start_clock = _clock_starter(limit, loop, limits.route_timeout_s)
            if body is None:
                start_clock()
            else:
                body.at_end = start_clock
            try:
                upstream_cm, upstream, sent = await _send(pool, request, url, headers, body)
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
                # a pooled keep-alive connection died with its sandbox; retry once on a
                # fresh one when no body bytes were consumed
                if body is not None:
                    raise
                upstream_cm, upstream, sent = await _send(pool, request, url, headers, body)
            try:
                return await _relay(request, upstream, loop.time() - sent, begun)
            finally:
                await upstream_cm.__aexit__(None, None, None)
    except (TimeoutError, aiohttp.ClientError) as exc:
        return _failed(request, exc, body, begun[0] if begun else None)


async def _send(
    pool: aiohttp.ClientSession,
    request: web.BaseRequest,
    url: URL,
    headers: CIMultiDict[str],
    body: _Body | None,
) -> tuple[Any, aiohttp.ClientResponse, float]:
    """The request sent: its context manager, the actor's response (headers in) and when it
    went out; a connection the actor refuses or does not take is `SandboxDown`."""
    sent = asyncio.get_running_loop().time()
    try:
        upstream_cm = pool.request(
            request.method,
            url,
            headers=headers,
            data=body.chunks() if body is not None else None,
            allow_redirects=False,
            compress=None,
        )
        upstream = await upstream_cm.__aenter__()
    except _CONNECT_FAILED as exc:
        raise SandboxDown(str(exc) or type(exc).__name__) from exc
    return upstream_cm, upstream, sent


async def _relay(
    request: web.BaseRequest,
    upstream: aiohttp.ClientResponse,
    waited_s: float,
    begun: list[web.StreamResponse],
) -> web.StreamResponse:
    """The actor's answer back to the client: a small body in one write, else streamed (the
    streamed response goes into `begun` first, so a failure midway knows headers went out)."""
    kept = hdr.downstream_headers(upstream.headers.items(), waited_s)
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
    response = web.StreamResponse(status=upstream.status, reason=upstream.reason, headers=kept)
    begun.append(response)
    if length is None and request.version >= (1, 1):
        response.enable_chunked_encoding()
    await response.prepare(request)
    async for chunk in upstream.content.iter_chunked(_CHUNK):
        await response.write(chunk)
    await response.write_eof()
    return response


def _failed(
    request: web.BaseRequest,
    exc: BaseException,
    body: _Body | None,
    response: web.StreamResponse | None,
) -> web.StreamResponse:
    """What the client gets when the exchange failed, as Envoy answers it: 408 for a stalled
    upload, a cut connection once headers went out, 504 for the route timeout; anything else
    is `SandboxDown`."""
    if body is not None and body.idle:
        # Envoy's stream idle timeout: the upload stalled for that long
        answer = text_reply(408, "stream timeout")
        answer.force_close()
        return answer
    if response is not None and response.prepared:
        return _cut(request, response)  # headers went out: cut, as Envoy does
    if isinstance(exc, TimeoutError):
        return text_reply(504, "upstream request timeout")
    raise SandboxDown(str(exc) or type(exc).__name__) from exc


async def forward_websocket(
    request: web.BaseRequest,
    target: str,
    host: str | None,
    pool: aiohttp.ClientSession,
    authority: str,
    limits: Limits,
) -> web.StreamResponse:
    """Forward the handshake; on 101 relay both ways until one side ends or idles."""
    loop = asyncio.get_running_loop()
    sent = loop.time()
    headers = hdr.upstream_headers(
        request.headers,
        router_ip=limits.router_ip,
        expected_timeout_ms=limits.expected_timeout_ms,
        host=host,
        upgrade=True,
    )
    try:
        async with asyncio.timeout(limits.route_timeout_s):
            upstream = await pool.request(
                request.method,
                URL(f"http://{authority}{target}", encoded=True),
                headers=headers,
                allow_redirects=False,
                compress=None,
            )
    except TimeoutError:
        return text_reply(504, "upstream request timeout")
    except aiohttp.ClientError as exc:
        raise SandboxDown(str(exc) or type(exc).__name__) from exc
    connection = upstream.connection
    try:
        upgraded = upstream.status == 101 and connection is not None
        kept = hdr.downstream_headers(
            upstream.headers.items(), loop.time() - sent, upgrade=upgraded
        )
        transport = connection.transport if connection is not None else None
        protocol = connection.protocol if connection is not None else None
        if not upgraded or transport is None or protocol is None:
            # the actor declined the upgrade: its answer goes back like any other
            return web.Response(
                status=upstream.status,
                reason=upstream.reason,
                body=await upstream.read(),
                headers=kept,
            )
        response = web.StreamResponse(status=101, reason=upstream.reason, headers=kept)
        await response.prepare(request)
        response.force_close()
        # both connections stop being HTTP: their bytes go to our feeds from here on
        down = Feed(request.transport)
        request.protocol.set_parser(down)  # type: ignore[arg-type]
        up = Feed(transport)
        protocol.set_parser(up, None)

        async def to_up(data: bytes) -> None:
            transport.write(data)
            if protocol.writing_paused:
                await protocol._drain_helper()  # what aiohttp's own writers wait on

        await splice(down, response.write, up, to_up, idle_timeout_s=limits.idle_timeout_s)
        return _cut(request, response)
    finally:
        upstream.close()


class _Body:
    """A request body streamed upstream, under Envoy's stream idle timeout between chunks."""

    def __init__(self, request: web.BaseRequest, idle_timeout_s: float) -> None:
        self._request = request
        self._idle_timeout_s = idle_timeout_s
        self.at_end: Callable[[], None] = lambda: None
        self.idle = False

    async def chunks(self) -> AsyncIterator[bytes]:
        content = self._request.content
        while True:
            try:
                async with asyncio.timeout(self._idle_timeout_s):
                    chunk = await content.readany()
            except TimeoutError:
                self.idle = True
                raise
            if not chunk:
                break
            yield chunk
        self.at_end()


def _clock_starter(
    limit: asyncio.Timeout, loop: asyncio.AbstractEventLoop, seconds: float
) -> Callable[[], None]:
    """A callback that arms ``limit`` ``seconds`` from when it is called (once; never late)."""

    def start() -> None:
        if limit.when() is None and not limit.expired():
            with contextlib.suppress(RuntimeError):  # the exchange already ended
                limit.reschedule(loop.time() + seconds)

    return start
