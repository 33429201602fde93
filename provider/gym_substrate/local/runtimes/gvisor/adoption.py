"""A control plane that restarts finds its actors' sandboxes still running: adopt them.

A RUNNING actor's sandbox is named in its record; a RESUMING one's restore may have run without
being recorded, so its sandbox is found by the actor and slot its folder's meta.json names, and
kept only once its wakeup probe answers (its resume may have ended before it did).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from gym_substrate.local.runtimes.base import ActorSpec, RuntimeFailure, Slot, StartedSandbox

if TYPE_CHECKING:
    from gym_substrate.local.runtimes.gvisor.runtime import GvisorRuntime

__all__ = ["adopt"]

log = logging.getLogger(__name__)


async def adopt(
    rt: GvisorRuntime, actor: ActorSpec, slot: Slot, handle: str, address: str
) -> StartedSandbox | None:
    """``actor``'s live sandbox on ``slot`` (``handle``, or found when unrecorded), or None."""
    rt._net(slot)  # the runtime is open and the slot exists
    expected = rt.worker_ip(slot)
    unrecorded = not handle
    if unrecorded:  # a restore the backend did not live to record (a RESUMING actor)
        handle = await _find_sandbox(rt, actor, slot) or ""
        if not handle:
            return None
    sandbox = rt._sandboxes.get(handle) or rt._load_sandbox(handle)
    if sandbox is None or sandbox.slot != slot.index or not await rt.is_alive(handle):
        return None
    if unrecorded:  # its resume may have ended before the wakeup probe answered
        deadline = time.monotonic() + actor.template.probe_timeout_s
        try:
            await rt._wait_ready(actor.template, expected, handle, deadline)
        except RuntimeFailure as exc:
            log.warning("not adopting %s for %s: %s", handle, actor.key, exc)
            await rt._discard(handle)
            return None
    if address != expected:
        log.warning("adopted %s answers at %s, not the recorded %s", handle, expected, address)
    return StartedSandbox(handle=handle, address=expected, memory_restored=True)


async def _find_sandbox(rt: GvisorRuntime, actor: ActorSpec, slot: Slot) -> str | None:
    """The running sandbox of ``actor`` on ``slot`` (its id), found by its meta.json."""
    if not rt.sandboxes_dir.is_dir():
        return None
    for directory in sorted(rt.sandboxes_dir.iterdir()):
        sandbox = rt._load_sandbox(directory.name)
        if (
            sandbox is not None
            and sandbox.actor_key == actor.key
            and sandbox.slot == slot.index
            and await rt.is_alive(sandbox.cid)
        ):
            return sandbox.cid
    return None
