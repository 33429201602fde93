"""The router's HTTP/1.1 server: aiohttp's connection handler with a deadline on request heads.

aiohttp limits only idle keep-alive connections, not a client dribbling header bytes, so
`_HeadDeadline` adds that: a request head must be whole within `HEAD_TIMEOUT_S` of its first
byte or the connection gets 408 and is closed (atunnel's ReadHeaderTimeout is the same 10 s,
`internal/atunnel/ingress.go`, read_file id 68666963451). The admin listener uses it too.

A connection can carry a `Tunnel`: the bytes of a CONNECT tunnel the router terminated, served
as HTTP by a connection of this same server (Envoy's internal listener `main_internal`,
`cmd/atenet/internal/router/xds.go@18d1c266`).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

__all__ = ["HEAD_TIMEOUT_S", "HeadDeadlineServer", "Tunnel", "tunnel_of"]

log = logging.getLogger(__name__)

# a request head (request line + headers) must be complete this long after its first byte
HEAD_TIMEOUT_S = 10.0
_TIMEOUT_408 = (
    b"HTTP/1.1 408 Request Timeout\r\nContent-Type: text/plain\r\nConnection: close\r\n"
    b"Content-Length: %d\r\n\r\n%s"
)


@dataclass(frozen=True)
class Tunnel:
    """What Envoy's CONNECT listener keeps in filter state for the requests inside a tunnel.

    ``target`` is the outer CONNECT's `ate-target-actor` value (`dev.ate.target.actor`), None
    when it had none; ``port`` is the actor port its authority named (`dev.ate.connect.authority`).
    """

    target: str | None
    port: int


class _HeadDeadline(RequestHandler):
    """aiohttp's connection handler plus a deadline on unfinished request heads.

    The timer starts with the first byte of a request head (not while a handler runs, so
    request bodies, tunnels and idle keep-alive connections are not affected) and stops when
    aiohttp has parsed the head. Tied to aiohttp's handler internals (``_request_count``,
    ``_current_request``, ``_messages``); test_hostile_router.py pins the behaviour.
    """

    def __init__(
        self, *args: Any, head_timeout_s: float, tunnel: Tunnel | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self._head_timeout_s = head_timeout_s
        self._head_timer: asyncio.TimerHandle | None = None
        self.tunnel = tunnel

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
        self._handler_kwargs.pop("handler_cancellation", None)  # the server's, not a handler's
        self._head_timeout_s = head_timeout_s

    def __call__(self) -> RequestHandler:
        return self.connection()

    def connection(self, tunnel: Tunnel | None = None) -> RequestHandler:
        """A handler for one connection; ``tunnel`` when it carries a CONNECT tunnel's bytes."""
        return _HeadDeadline(
            self,
            loop=self._loop,
            head_timeout_s=self._head_timeout_s,
            tunnel=tunnel,
            **self._handler_kwargs,
        )


def tunnel_of(request: web.BaseRequest) -> Tunnel | None:
    """The tunnel a request arrived in, None for a request on the router's own port."""
    protocol = request.protocol
    return protocol.tunnel if isinstance(protocol, _HeadDeadline) else None
