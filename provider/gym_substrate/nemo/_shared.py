"""Connections shared by every provider instance on one event loop.

Gym's `AsyncSandbox` builds a new provider per sandbox and calls `aclose()` at `stop()`, so a
channel per provider would mean a TLS handshake per rollout. Instead the gRPC channel, the HTTP
pool and the exec semaphore live here, keyed by (event loop, connection config, concurrency) and
reference-counted; the last `release()` closes them. Keys include the loop because `grpc.aio` and
aiohttp objects are bound to the loop they were created on (Gym's sync `Sandbox` runs its own).
A provider given its own `control` and `http` (tests, embedders) shares nothing.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Concatenate, ParamSpec, TypeVar

import aiohttp

from gym_substrate.nemo.agent_client import AiohttpTransport, HttpTransport
from gym_substrate.nemo.config import ConnectionConfig
from gym_substrate.nemo.control_client import ControlAPI, ControlClient, create_channel

__all__ = ["Lease", "SharedResources", "acquire", "holding", "private", "release", "shared_count"]

_Key = tuple[asyncio.AbstractEventLoop, ConnectionConfig, int]
P = ParamSpec("P")
R = TypeVar("R")


@dataclass(eq=False)
class SharedResources:
    key: _Key | None  # None: private to one provider, never in the shared table
    control: ControlAPI
    transport: HttpTransport
    exec_slots: asyncio.Semaphore
    close: Callable[[], Awaitable[None]]
    known_atespaces: set[str] = field(default_factory=set)
    known_templates: set[str] = field(default_factory=set)  # checked usable (GetActorTemplate)
    refs: int = 0


_lock = threading.Lock()
_shared: dict[_Key, SharedResources] = {}


def _open(
    conn: ConnectionConfig, control: ControlAPI | None, transport: HttpTransport | None
) -> tuple[ControlAPI, HttpTransport, Callable[[], Awaitable[None]]]:
    """The clients not given, created for `conn`, and one closer for what was created here."""
    closers: list[Callable[[], Awaitable[None]]] = []
    if control is None:
        channel = create_channel(conn)
        control = ControlClient(channel, conn)
        closers.append(lambda: channel.close(None))
    if transport is None:
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
        session = aiohttp.ClientSession(
            connector=connector, auto_decompress=False, skip_auto_headers=("User-Agent",)
        )
        transport = AiohttpTransport(session)
        closers.insert(0, session.close)

    async def close() -> None:
        for closer in closers:
            await closer()

    return control, transport, close


def acquire(conn: ConnectionConfig, concurrency: int) -> SharedResources:
    """Take a reference on the resources for the running loop (creating them on first use)."""
    loop = asyncio.get_running_loop()
    key = (loop, conn, concurrency)
    with _lock:
        res = _shared.get(key)
        if res is None:
            control, transport, close = _open(conn, None, None)
            res = SharedResources(
                key=key,
                control=control,
                transport=transport,
                exec_slots=asyncio.Semaphore(concurrency),
                close=close,
            )
            _shared[key] = res
        res.refs += 1
        return res


def private(
    conn: ConnectionConfig,
    concurrency: int,
    *,
    control: ControlAPI | None,
    transport: HttpTransport | None,
) -> SharedResources:
    """Resources for one provider given its own clients; what it was not given is made here."""
    control, transport, close = _open(conn, control, transport)
    return SharedResources(
        key=None,
        control=control,
        transport=transport,
        exec_slots=asyncio.Semaphore(concurrency),
        close=close,
        refs=1,
    )


async def release(res: SharedResources) -> None:
    """Drop a reference; the last one closes the channel and the HTTP pool."""
    with _lock:
        res.refs -= 1
        last = res.refs <= 0
        if last and res.key is not None:
            _shared.pop(res.key, None)
    if last:
        await res.close()


def shared_count() -> int:
    """How many shared resource sets are open (for tests and metrics)."""
    with _lock:
        return len(_shared)


class Lease:
    """One provider's share of the resources, held only while it has sandboxes or calls.

    Gym's facade never calls `aclose()` after a failed `start()`, so a share held until
    `aclose()` would keep the HTTP pool open (and warn "Unclosed client session" at exit). The
    share is taken on first use and given back when the last call returns with no sandbox left.
    """

    def __init__(self, open_: Callable[[], SharedResources], idle: Callable[[], bool]) -> None:
        self._open = open_
        self._idle = idle
        self.resources: SharedResources | None = None
        self.calls = 0

    def get(self) -> SharedResources:
        if self.resources is None:
            self.resources = self._open()
        return self.resources

    async def release(self) -> None:
        res, self.resources = self.resources, None
        if res is not None:
            await release(res)

    async def after_call(self) -> None:
        if not self.calls and self._idle():
            await self.release()


def holding(
    method: Callable[Concatenate[Any, P], Coroutine[Any, Any, R]],
) -> Callable[Concatenate[Any, P], Coroutine[Any, Any, R]]:
    """Count a provider method as a call on `self._lease` (see `Lease`)."""

    @functools.wraps(method)
    async def call(self: Any, /, *args: P.args, **kwargs: P.kwargs) -> R:
        lease: Lease = self._lease
        lease.calls += 1
        try:
            return await method(self, *args, **kwargs)
        finally:
            lease.calls -= 1
            await lease.after_call()

    return call
