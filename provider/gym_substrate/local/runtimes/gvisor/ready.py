"""Is a gVisor sandbox's agent ready: its wakeup probe over one short HTTP/1.1 request.

The runtime, the freeze tier and the warm pool all wait for an agent this way after a boot,
restore or thaw; the floor benchmark probes with `http_status` alone. No HTTP client library:
one connection per probe, closed at once, so nothing stays connected into a sandbox that is
about to be checkpointed.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from gym_substrate.local.runtimes.base import RuntimeFailure, TemplateSpec
from gym_substrate.local.runtimes.gvisor._proc import pid_running
from gym_substrate.local.runtimes.gvisor.runsc import Runsc

__all__ = ["http_status", "wait_ready"]


async def http_status(host_ip: str, port: int, path: str, *, timeout_s: float) -> int | None:
    """Status code of ``GET path`` (one short-lived connection), or None if nothing answered."""
    # asyncio.timeout, not wait_for, which can swallow a cancellation (see _proc.run_command)
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection(host_ip, port)
    except (OSError, TimeoutError):
        return None
    try:
        writer.write(
            f"GET {path} HTTP/1.1\r\nHost: {host_ip}\r\nConnection: close\r\n\r\n".encode()
        )
        async with asyncio.timeout(timeout_s):
            line = await reader.readline()
        parts = line.split()
        if len(parts) >= 2 and parts[1].isdigit():
            return int(parts[1])
        return None
    except (OSError, TimeoutError):
        return None
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def wait_ready(
    runsc: Runsc,
    template: TemplateSpec,
    address: str,
    cid: str,
    deadline: float,
    console_tail: Callable[[], str],
) -> None:
    """Until the template's wakeup probe answers 200 at ``address`` (a ``time.monotonic``
    deadline); a sandbox that exits first fails at once. Errors end with its console tail."""
    if template.readyz_path is None:  # no wakeup probe: started is ready
        return
    delay = 0.005
    last_check = time.monotonic()
    while True:
        status = await http_status(
            address, template.readyz_port, template.readyz_path, timeout_s=1.0
        )
        if status == 200:
            return
        now = time.monotonic()
        if now >= deadline:
            raise RuntimeFailure(
                f"wakeup probe {template.readyz_path} on port {template.readyz_port} never "
                f"returned 200 in time (last: {status})" + console_tail()
            )
        if now - last_check > 0.5:  # a crashed agent: stop waiting early
            last_check = now
            pids = runsc.pids(cid)
            if pids is None or not pid_running(pids[0], cid):
                raise RuntimeFailure("the sandbox exited before it became ready" + console_tail())
        await asyncio.sleep(delay)
        delay = min(delay * 1.5, 0.05)
