"""How connections are served: the contract's JSON error body also for the HTTP parser's errors.

aiohttp answers a request it cannot parse (a request line or a header over 8190 bytes, more than
128 headers, bytes that are not HTTP) by itself, in text/plain, before any middleware runs: the
answer is built by `RequestHandler.handle_error`. `AgentRunner` therefore serves the app through
its own `web.Server`, whose connections (`_Connection`) answer those errors with the contract's
JSON error body, and still close the connection after them.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import web

from ._config import AgentConfig
from ._errors import code_for_status, error_response

__all__ = ["AgentRunner"]

log = logging.getLogger("sandbox_agent")
access_log = logging.getLogger("sandbox_agent.access")

_READ_BUFSIZE = 1 << 20  # uploads arrive in fewer, larger pieces (fewer loop iterations)
_MAX_MESSAGE = 300


class _Connection(web.RequestHandler):
    """One client connection: aiohttp's protocol, answering its errors in JSON."""

    __slots__ = ()

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
        self._connection = {"access_log": None, "read_bufsize": _READ_BUFSIZE}

    async def _make_server(self) -> web.Server:
        stock = await super()._make_server()  # runs the app's startup hooks and freezes it
        return _Server(
            stock.request_handler,
            request_factory=stock.request_factory,
            handler_cancellation=stock.handler_cancellation,
            connection=self._connection,
        )
