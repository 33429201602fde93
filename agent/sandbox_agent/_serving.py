"""How connections are served: HTTP/1.1 keep-alive on asyncio, the contract's timeouts and errors.

One `_Connection` per client runs its requests one after another (pipelined requests wait their
turn in its buffer):

- a request the server cannot parse (a request line or a header over 8190 bytes, more than 128
  headers, bytes that are not HTTP) is answered with the contract's JSON error body, and the
  connection is closed;
- the header timeout runs from the first byte of a request to the end of its headers; when it
  fires, the agent answers `408 request_timeout` and closes the connection (slowloris);
- the idle timeout closes a connection with no request in flight silently (a client that never
  sends, or an idle pool connection);
- a handler that gives up on a stalled body answers 408 (app.py, _files.py), and then the
  connection is closed at once instead of lingering for a body that is not coming; a body a
  handler left unread is otherwise drained for a while, so the connection can be kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, BinaryIO

from ._config import AgentConfig
from ._errors import code_for_status, error_body, error_response
from ._http import MAX_HEADERS, MAX_LINE, HTTPError, Request, Response, parse_head, render_head

__all__ = ["AgentServer"]

log = logging.getLogger("sandbox_agent")
access_log = logging.getLogger("sandbox_agent.access")

_HIGH_WATER = 2 << 20  # stop reading from a client that sends faster than the handler takes
_LINE_CRLF = MAX_LINE + 2  # a line at its limit, with its CRLF
_MAX_HEAD = _LINE_CRLF * (MAX_HEADERS + 2)  # the request line and every header at their limits
_LINGER_S = 10.0  # how long an unread body is drained before the connection is given up
_SHUTDOWN_S = 3.0  # how long requests in flight may finish at shutdown
_MAX_MESSAGE = 300


class _Connection(asyncio.Protocol):
    """One client connection: a receive buffer, and the task that serves its requests."""

    def __init__(self, server: AgentServer) -> None:
        self._server = server
        self._loop = asyncio.get_running_loop()
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        self._eof = False
        self._waiter: asyncio.Future[bool] | None = None
        self._drain: asyncio.Future[None] | None = None
        self._reading = True
        self.task: asyncio.Task[None] | None = None
        self._remote: str | None = None
        self.busy = False  # a request is in flight

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self._remote = peer[0] if isinstance(peer, tuple) else None
        self._server.connections.add(self)
        self.task = self._loop.create_task(self._serve())

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if len(self.buffer) > _HIGH_WATER and self._reading and self.transport is not None:
            self._reading = False
            self.transport.pause_reading()
        self._wake(True)

    def eof_received(self) -> bool:
        self._eof = True
        self._wake(False)
        return True  # keep the write side open for the answer in progress

    def connection_lost(self, exc: BaseException | None) -> None:
        self._eof = True
        self.transport = None
        self._server.connections.discard(self)
        self._wake(False)
        if self._drain is not None and not self._drain.done():
            self._drain.set_exception(ConnectionResetError("client disconnected"))

    def pause_writing(self) -> None:
        self._drain = self._loop.create_future()

    def resume_writing(self) -> None:
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)
        self._drain = None

    def _wake(self, value: bool) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(value)

    async def _wait(self, deadline: float | None = None) -> bool:
        """Wait for more bytes; False at `deadline` or when the client sends no more."""
        if self._eof:
            return False
        if not self._reading and self.transport is not None:
            self._reading = True
            self.transport.resume_reading()
        waiter: asyncio.Future[bool] = self._loop.create_future()
        self._waiter = waiter
        timer = None if deadline is None else self._loop.call_at(deadline, self._wake, False)
        try:
            return await waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()

    async def more(self) -> None:
        """For request bodies: wait for more bytes, or ConnectionResetError."""
        if not await self._wait():
            raise ConnectionResetError("the client closed the connection before the body ended")

    def send(self, data: bytes) -> None:
        if self.transport is None:
            raise ConnectionResetError("client disconnected")
        self.transport.write(data)

    async def flush(self) -> None:
        if self._drain is not None:
            await self._drain

    async def send_head(self, request: Request, resp: Response, length: int) -> None:
        self.send(render_head(resp.status, resp.headers, length, _connection_header(request)))
        await self.flush()

    async def sendfile(self, file: BinaryIO, offset: int, count: int) -> None:
        if self.transport is None:
            raise ConnectionResetError("client disconnected")
        await self._loop.sendfile(self.transport, file, offset, count)

    async def _serve(self) -> None:
        try:
            while await self._one_request():
                pass
        except (ConnectionError, asyncio.CancelledError):
            pass
        except Exception:
            log.exception("internal error serving a connection from %s", self._remote)
        finally:
            self.busy = False
            if self.transport is not None:
                self.transport.close()

    async def _one_request(self) -> bool:
        """Serve the next request; False when the connection is to be closed."""
        head = await self._read_head()
        if head is None:
            return False
        self.busy = True
        try:
            try:
                request = Request(parse_head(head), self, self, self._remote)
            except HTTPError as exc:
                self._malformed(exc.status, exc.message)
                return False
            resp = await self._server.handler(request)
            keep = await self._respond(request, resp)
            if keep and not request.body_done:
                keep = await self._linger(request)
            return keep and not self._server.closing
        finally:
            self.busy = False

    async def _read_head(self) -> bytes | None:
        """The next request's head, or None: the client left, idled out or was too slow."""
        buf = self.buffer
        while buf[:2] == b"\r\n":  # blank lines between requests are tolerated
            del buf[:2]
        if not buf:
            deadline = self._loop.time() + self._server.config.idle_timeout_s
            while not buf or buf == b"\r":
                if not await self._wait(deadline):
                    return None
                while buf[:2] == b"\r\n":
                    del buf[:2]
        deadline = self._loop.time() + self._server.config.header_timeout_s
        while (end := buf.find(b"\r\n\r\n")) < 0:
            if b"\n\n" in buf or len(buf) > _MAX_HEAD:
                reason = "line endings must be CRLF" if len(buf) <= _MAX_HEAD else "head too long"
                self._malformed(400, reason)
                return None
            last_line = len(buf) - buf.rfind(b"\n") - 1
            if last_line > _LINE_CRLF:
                self._malformed(
                    400, f"request line or header line too long: at most {MAX_LINE} bytes"
                )
                return None
            if not await self._wait(deadline):
                if self._eof:
                    return None
                access_log.info("- - 408 (request headers not received in time)")
                self.send(self._server.timeout_answer)
                return None
        head = bytes(buf[:end])
        del buf[: end + 4]
        return head

    def _malformed(self, status: int, message: str) -> None:
        detail = " ".join(message.split())[:_MAX_MESSAGE] or "unreadable request"
        access_log.info("- - %d (malformed request from %s: %s)", status, self._remote, detail)
        resp = error_response(status, code_for_status(status), f"malformed HTTP request: {detail}")
        with contextlib.suppress(ConnectionError):
            self.send(render_head(resp.status, resp.headers, len(resp.body), "close") + resp.body)

    async def _respond(self, request: Request, resp: Response) -> bool:
        """Send `resp` (unless a streaming handler sent it); True to keep the connection."""
        keep = _connection_header(request) != "close" and not resp.close
        if request.head_sent:
            return keep and resp.status != 408
        if resp.status == 408 or request.body_broken:  # stalled or unframeable body: close
            keep = False
        connection = "keep-alive" if keep and request.version == 0 else None
        head = render_head(resp.status, resp.headers, len(resp.body), connection or _close(keep))
        body = b"" if request.method == "HEAD" else resp.body
        self.send(head + body if len(body) < 65536 else head)
        if len(body) >= 65536:
            self.send(body)
        await self.flush()
        return keep

    async def _linger(self, request: Request) -> bool:
        """Drain a body the handler left unread; True if it ended in time."""
        try:
            async with asyncio.timeout(_LINGER_S):
                while await request.read_chunk():
                    pass
        except (TimeoutError, HTTPError):
            return False
        return True


def _close(keep: bool) -> str | None:
    return None if keep else "close"


def _connection_header(request: Request) -> str | None:
    """`Connection` of the answer: "close", "keep-alive" (HTTP/1.0) or None (HTTP/1.1 default)."""
    tokens = request.headers.get("connection", "").lower()
    if "close" in tokens:
        return "close"
    if request.version == 0:
        return "keep-alive" if "keep-alive" in tokens else "close"
    return None


class AgentServer:
    """The agent's listening socket and its connections, serving `app` (see the module doc)."""

    def __init__(self, app: Any, config: AgentConfig) -> None:
        self.app = app
        self.config = config
        self.handler = app.handle
        self.connections: set[_Connection] = set()
        self.closing = False
        self._server: asyncio.Server | None = None
        answer = error_body(
            "request_timeout",
            f"the request line and headers did not arrive within {config.header_timeout_s:g} s; "
            "the connection is closed",
        )
        self.timeout_answer = (
            b"HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(answer), answer)
        )

    async def start(self, host: str, port: int) -> tuple[str, int]:
        """Run the app's startup, then listen; the bound (host, port). OSError if it cannot."""
        await self.app.startup()
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Connection(self), host, port, backlog=1024, reuse_address=True
        )
        addr = self._server.sockets[0].getsockname()
        return addr[0], addr[1]

    async def close(self) -> None:
        """Stop listening, stop the app (jobs and sessions end), let requests finish, close."""
        if self._server is not None:
            self._server.close()
        self.closing = True
        await self.app.shutdown()
        busy = {c.task for c in self.connections if c.busy and c.task is not None}
        for conn in list(self.connections):
            if not conn.busy and conn.transport is not None:
                conn.transport.close()  # idle: nothing to finish
        if busy:
            await asyncio.wait(busy, timeout=_SHUTDOWN_S)
        tasks = [c.task for c in list(self.connections) if c.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None
