"""Give the large gRPC messages' freed memory back to the system now and then (glibc).

RSS under 1-3 MB messages is neither a cache nor a leak: the Python heap stays at 2 MB
(tracemalloc) while glibc keeps the freed gRPC/protobuf buffers of the large messages. 200
of them took RSS from 61 to ~240 MB, a plateau near 275 MB after 400; with the backend
embedded, malloc_trim(0) 30 s later brought it back to ~75 MB. So trim now and then.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
from typing import Any

__all__ = ["TRIM_EVERY_S", "malloc_trim", "trim_heap_forever"]

TRIM_EVERY_S = 30.0


def malloc_trim() -> Any:
    """glibc's malloc_trim, or None elsewhere (musl, macOS)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    return getattr(ctypes.CDLL(name), "malloc_trim", None)


async def trim_heap_forever(trim: Any) -> None:
    """Call ``trim(0)`` (off the event loop) every `TRIM_EVERY_S` seconds until cancelled."""
    while True:
        await asyncio.sleep(TRIM_EVERY_S)
        await asyncio.to_thread(trim, 0)
