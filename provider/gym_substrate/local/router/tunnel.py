"""Byte relays for the two kinds of stream that stop being HTTP: WebSocket and CONNECT.

aiohttp hands over an upgraded connection through `set_parser` (as its own WebSocket code does,
on the server and the client side): every byte after the handshake goes to a parser object,
here `Feed`, which queues the raw bytes instead. `splice` pumps two such feeds into the
opposite writers, with Envoy's stream idle timeout, until either side ends.

A CONNECT tunnel is not relayed to the actor: as Envoy's CONNECT listener does (it hands the
tunnel to the internal listener `main_internal`, `cmd/atenet/internal/router/xds.go@18d1c266`),
the router serves the tunnel's bytes as HTTP itself, on a connection of its own server joined
to the client by a socket pair (`serve_inside`). So each request inside resumes and routes on
its own, and only HTTP can be carried, as upstream at 18d1c266.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Awaitable, Callable

from aiohttp.web_protocol import RequestHandler

__all__ = ["Feed", "RawSide", "serve_inside", "splice"]

_HIGH_WATER = 1 << 20  # stop reading a side while this much of its input waits to be written
_LOW_WATER = 256 << 10


class Feed:
    """A stand-in for aiohttp's payload parser that queues raw bytes, with back pressure."""

    def __init__(self, transport: asyncio.BaseTransport | None) -> None:
        self._transport = transport
        self._queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._buffered = 0
        self._paused = False

    # the parser interface aiohttp's protocols call
    def feed_data(self, data: bytes) -> tuple[bool, bytes]:
        if data:
            self._queue.put_nowait(bytes(data))
            self._buffered += len(data)
            if self._buffered > _HIGH_WATER and not self._paused:
                self._set_reading(False)
        return False, b""

    def feed_eof(self) -> None:
        self._queue.put_nowait(None)

    async def get(self) -> bytes | None:
        """The next bytes, None at the end of the stream."""
        data = await self._queue.get()
        if data is not None:
            self._buffered -= len(data)
            if self._paused and self._buffered < _LOW_WATER:
                self._set_reading(True)
        return data

    def _set_reading(self, on: bool) -> None:
        transport = self._transport
        if not isinstance(transport, asyncio.ReadTransport) or transport.is_closing():
            return
        self._paused = not on
        if on:
            transport.resume_reading()
        else:
            transport.pause_reading()


class RawSide(asyncio.Protocol):
    """A plain socket protocol: its input goes to a `Feed`, its output waits for drain."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.feed = Feed(None)
        self._can_write = asyncio.Event()
        self._can_write.set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.feed = Feed(transport)

    def data_received(self, data: bytes) -> None:
        self.feed.feed_data(data)

    def eof_received(self) -> bool:
        self.feed.feed_eof()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.feed.feed_eof()
        self._can_write.set()

    def pause_writing(self) -> None:
        self._can_write.clear()

    def resume_writing(self) -> None:
        self._can_write.set()

    async def write(self, data: bytes) -> None:
        if self.transport is None or self.transport.is_closing():
            raise ConnectionResetError("the other side of the tunnel is gone")
        self.transport.write(data)
        await self._can_write.wait()


Writer = Callable[[bytes], Awaitable[None]]


async def splice(
    down: Feed, to_down: Writer, up: Feed, to_up: Writer, *, idle_timeout_s: float
) -> str:
    """Relay until one side ends or nothing moves for ``idle_timeout_s``; why it ended.

    Returns "closed" or "idle". Closing the transports is the caller's.
    """
    loop = asyncio.get_running_loop()
    last = loop.time()

    async def pump(source: Feed, sink: Writer) -> None:
        nonlocal last
        while (data := await source.get()) is not None:
            last = loop.time()
            await sink(data)
            last = loop.time()

    pumps = [
        asyncio.ensure_future(pump(down, to_up)),
        asyncio.ensure_future(pump(up, to_down)),
    ]
    try:
        while True:
            left = last + idle_timeout_s - loop.time()
            if left <= 0:
                return "idle"
            done, _ = await asyncio.wait(pumps, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            if done:
                return "closed"
    finally:
        for task in pumps:
            task.cancel()
        for task in pumps:
            with contextlib.suppress(asyncio.CancelledError, OSError, ConnectionError):
                await task


async def serve_inside(make_handler: Callable[[], RequestHandler]) -> RawSide:
    """Start a server connection over a socket pair; return the router's end of the pair.

    Bytes written to the returned side reach ``make_handler()``'s connection as a client's
    would; its answers come back through the side's feed.
    """
    loop = asyncio.get_running_loop()
    ours, theirs = socket.socketpair()
    try:
        ours.setblocking(False)
        theirs.setblocking(False)
        await loop.connect_accepted_socket(make_handler, sock=theirs)
        _, side = await loop.create_connection(RawSide, sock=ours)
    except BaseException:
        ours.close()
        theirs.close()
        raise
    return side
