"""The fast lane sleeps no more than 50 ms at a time, for real (issue 33).

A fast test drives time through fakes: an injected clock and sleep (the router's resumer, the
provider's retry and capacity waits take a `Pacer`), or scaled-down deadlines. A real
`asyncio.sleep`/`time.sleep` of more than `LIMIT_S` that runs to its end, in the test or in the
code under test, is what made the lane slow; conftest wraps both for every `fast` test and
fails the test that took one. A sleep that is cancelled early (a background loop that the test
stops) held nothing and does not count, nor does a wait on an event with a timeout, nor a sleep
in a thread that was already running when the test started (a wider fixture's or an earlier
test's background loop, such as the process-wide embedded backend's recovery watch: its
2-second sleep landed in whichever fast test was running, under CI load).
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["LIMIT_S", "watch_sleeps"]

LIMIT_S = 0.05


def _caller() -> str:
    """Where the sleep was called from (file:line), so a failure names the code to change."""
    frame = sys._getframe(2)
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


@contextmanager
def watch_sleeps(
    patch: Callable[[object, str, Any], None], limit_s: float = LIMIT_S
) -> Iterator[list[str]]:
    """Wrap `asyncio.sleep` and `time.sleep` (through `patch`, a `monkeypatch.setattr`); yields
    the list of real sleeps over `limit_s` that ran to their end, as readable lines."""
    long: list[str] = []
    me = threading.get_ident()
    background = {thread.ident for thread in threading.enumerate()} - {me}
    real_async, real_sync = asyncio.sleep, time.sleep

    async def async_sleep(delay: float, *args: Any, **kwargs: Any) -> Any:
        where = _caller()
        result = await real_async(delay, *args, **kwargs)
        if delay > limit_s and threading.get_ident() not in background:
            long.append(f"asyncio.sleep({delay:g}) at {where}")
        return result

    def sync_sleep(delay: float) -> None:
        where = _caller()
        real_sync(delay)
        if delay > limit_s and threading.get_ident() not in background:
            long.append(f"time.sleep({delay:g}) at {where}")

    patch(asyncio, "sleep", async_sleep)
    patch(time, "sleep", sync_sleep)
    yield long
