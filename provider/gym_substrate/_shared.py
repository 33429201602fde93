"""Connections shared by every provider instance on one event loop.

Gym's `AsyncSandbox` builds a new provider per sandbox and calls `aclose()` at `stop()`, so a
channel per provider would mean a TLS handshake per rollout. Instead the gRPC channel, the aiohttp
pool and the exec semaphore live here, keyed by (event loop, connection config, concurrency) and
reference-counted; the last `release()` closes them. Keys include the loop because `grpc.aio` and
aiohttp objects are bound to the loop they were created on (Gym's sync `Sandbox` runs its own).
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field

import aiohttp
import grpc.aio

from gym_substrate._config import ConnectionConfig
from gym_substrate._grpc import ControlPlane, create_channel

__all__ = ["SharedResources", "acquire", "release", "shared_count"]


@dataclass(eq=False)
class SharedResources:
    key: tuple[asyncio.AbstractEventLoop, ConnectionConfig, int]
    channel: grpc.aio.Channel
    control: ControlPlane
    session: aiohttp.ClientSession
    exec_slots: asyncio.Semaphore
    known_atespaces: set[str] = field(default_factory=set)
    refs: int = 0


_lock = threading.Lock()
_shared: dict[tuple[asyncio.AbstractEventLoop, ConnectionConfig, int], SharedResources] = {}


def acquire(conn: ConnectionConfig, concurrency: int) -> SharedResources:
    """Take a reference on the resources for the running loop (creating them on first use)."""
    loop = asyncio.get_running_loop()
    key = (loop, conn, concurrency)
    with _lock:
        res = _shared.get(key)
        if res is None:
            channel = create_channel(conn)
            connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
            session = aiohttp.ClientSession(
                connector=connector, auto_decompress=False, skip_auto_headers=("User-Agent",)
            )
            res = SharedResources(
                key=key,
                channel=channel,
                control=ControlPlane(channel, conn),
                session=session,
                exec_slots=asyncio.Semaphore(concurrency),
            )
            _shared[key] = res
        res.refs += 1
        return res


async def release(res: SharedResources) -> None:
    """Drop a reference; the last one closes the channel and the HTTP pool."""
    with _lock:
        res.refs -= 1
        last = res.refs <= 0
        if last:
            _shared.pop(res.key, None)
    if last:
        await res.session.close()
        await res.channel.close(None)


def shared_count() -> int:
    """How many shared resource sets are open (for tests and metrics)."""
    with _lock:
        return len(_shared)
