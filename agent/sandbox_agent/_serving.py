"""How connections are served: the contract's JSON for the HTTP parser's errors, and timeouts.

aiohttp answers a request it cannot parse (a request line or a header over 8190 bytes, more than
128 headers, bytes that are not HTTP) by itself, in text/plain, before any middleware runs: the
answer is built by `RequestHandler.handle_error`. It also puts no limit on how long a request's
headers may take, and keeps an idle connection for an hour. `AgentRunner` therefore serves the
app through its own `web.Server`, whose connections are `_Connection`s:

- `handle_error` answers the contract's JSON error body (and still closes the connection);
- the header timeout runs from the first byte of a request to the end of its headers; when it
  fires, the agent answers `408 request_timeout` and closes the connection (slowloris);
- aiohttp's keep-alive timeout is the idle timeout: a connection with no request in flight is
  closed silently after it (a client that never sends, or an idle pool connection);
- a handler that gives up on a stalled body answers 408 (app.py, _files.py), and then the
  connection is closed at once instead of lingering for a body that is not coming.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import web

from ._config import AgentConfig
from ._errors import code_for_status, error_body, error_response

__all__ = ["AgentRunner"]

log = logging.getLogger("sandbox_agent")
access_log = logging.getLogger("sandbox_agent.access")

_READ_BUFSIZE = 1 << 20  # uploads arrive in fewer, larger pieces (fewer loop iterations)
_MAX_MESSAGE = 300


class _Connection(web.RequestHandler):
    """One client connection: aiohttp's protocol with JSON errors and a header timeout."""

    __slots__ = ("_header_timeout_s", "_header_timer", "_timeout_answer")

    def __init__(
        self, manager: web.Server, *, header_timeout_s: float, timeout_answer: bytes, **kw: Any
    ) -> None:
        super().__init__(manager, **kw)
        self._header_timeout_s = header_timeout_s
        self._header_timer: asyncio.TimerHandle | None = None
        self._timeout_answer = timeout_answer

    def _awaiting_request(self) -> bool:
        # aiohttp's `_waiter` is pending exactly while the connection waits for the headers of
        # its next request (not while a handler runs or reads a body).
        waiter = self._waiter
        return waiter is not None and not waiter.done()

    def data_received(self, data: bytes) -> None:
        if self._header_timer is None and data and self._awaiting_request():
            loop = asyncio.get_running_loop()
            self._header_timer = loop.call_later(self._header_timeout_s, self._headers_too_slow)
        super().data_received(data)
        if self._header_timer is not None and not self._awaiting_request():
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if self._awaiting_request() and self.transport is not None:
            access_log.info("- - 408 (request headers not received in time)")
            self.transport.write(self._timeout_answer)
            self.force_close()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        super().connection_lost(exc)

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """The HTTP parser's (and aiohttp's last-resort) error answer, as the contract's JSON."""
        if request.writer.output_size > 0:  # as aiohttp: too late for another response
            msg = "Response is sent already, cannot send another response with the error message"
            raise ConnectionError(msg)
        if status >= 500:
            log.error("internal error serving %s", request.remote, exc_info=exc)
            text = "internal agent error; the agent log has the details"
        else:
            detail = " ".join((message or str(exc or "") or "unreadable request").split())
            detail = detail[:_MAX_MESSAGE]
            access_log.info(
                "- - %d (malformed request from %s: %s)", status, request.remote, detail
            )
            text = f"malformed HTTP request: {detail}"
        resp = error_response(status, code_for_status(status), text)
        resp.force_close()
        return resp

    async def finish_response(
        self, request: web.BaseRequest, resp: web.StreamResponse, start_time: float | None
    ) -> tuple[web.StreamResponse, bool]:
        result = await super().finish_response(request, resp, start_time)
        if resp.status == 408:  # the client stalled mid-body: close, do not linger for the rest
            self.force_close()
        return result


class _Server(web.Server):
    """aiohttp's low-level server, making `_Connection`s."""

    def __init__(self, handler: Any, *, connection: dict[str, Any], **kwargs: Any) -> None:
        super().__init__(handler, **kwargs)
        self._connection = connection

    def __call__(self) -> web.RequestHandler:
        return _Connection(self, loop=asyncio.get_running_loop(), **self._connection)


class AgentRunner(web.AppRunner):
    """`web.AppRunner` for the agent: its connections follow the contract (see the module doc)."""

    def __init__(self, app: web.Application, config: AgentConfig) -> None:
        super().__init__(app, handle_signals=False, shutdown_timeout=3.0)
        timeout_answer = error_body(
            "request_timeout",
            f"the request line and headers did not arrive within {config.header_timeout_s:g} s; "
            "the connection is closed",
        )
        self._connection = {
            "keepalive_timeout": config.idle_timeout_s,
            "access_log": None,
            "read_bufsize": _READ_BUFSIZE,
            "header_timeout_s": config.header_timeout_s,
            "timeout_answer": (
                b"HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\nConnection: close\r\n\r\n%s"
                % (len(timeout_answer), timeout_answer)
            ),
        }

    async def _make_server(self) -> web.Server:
        stock = await super()._make_server()  # runs the app's startup hooks and freezes it
        return _Server(
            stock.request_handler,
            request_factory=stock.request_factory,
            handler_cancellation=stock.handler_cancellation,
            connection=self._connection,
        )
