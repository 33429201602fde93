"""A control plane that restarts finds its actors' sandboxes still running: adopt them.

A RUNNING actor's sandbox is named in its record; a RESUMING one's restore may have run without
being recorded, so its sandbox is found by the actor and slot its folder's meta.json names, and
kept only once its wakeup probe answers (its resume may have ended before it did). It works on
the runtime's slot networks and sandbox registry (``slots.py``, ``sandboxes.py``), not on the
runtime itself, so it does not import the runtime back (issue 33).
"""

from __future__ import annotations

import logging
import time

from gym_substrate.local.runtimes.base import ActorSpec, RuntimeFailure, Slot, StartedSandbox
from gym_substrate.local.runtimes.gvisor.sandboxes import Sandboxes
from gym_substrate.local.runtimes.gvisor.slots import SlotNets

__all__ = ["adopt"]

log = logging.getLogger(__name__)


async def adopt(
    nets: SlotNets,
    sandboxes: Sandboxes,
    actor: ActorSpec,
    slot: Slot,
    handle: str,
    address: str,
) -> StartedSandbox | None:
    """``actor``'s live sandbox on ``slot`` (``handle``, or found when unrecorded), or None."""
    nets.current(slot)  # the runtime is open and the slot exists
    expected = nets.worker_ip(slot)
    unrecorded = not handle
    if unrecorded:  # a restore the backend did not live to record (a RESUMING actor)
        handle = await _find_sandbox(sandboxes, actor, slot) or ""
        if not handle:
            return None
    sandbox = sandboxes.get(handle)
    if sandbox is None or sandbox.slot != slot.index or not await sandboxes.is_alive(handle):
        return None
    if await sandboxes.thaw(handle):  # frozen by a pause the killed backend never recorded
        log.warning("adopting %s for %s: it was frozen; thawed", handle, actor.key)
    if unrecorded:  # its resume may have ended before the wakeup probe answered
        deadline = time.monotonic() + actor.template.probe_timeout_s
        try:
            await sandboxes.wait_ready(actor.template, expected, handle, deadline)
        except RuntimeFailure as exc:
            log.warning("not adopting %s for %s: %s", handle, actor.key, exc)
            await sandboxes.discard(handle)
            return None
    if address != expected:
        log.warning("adopted %s answers at %s, not the recorded %s", handle, expected, address)
    return StartedSandbox(handle=handle, address=expected, memory_restored=True)


async def _find_sandbox(sandboxes: Sandboxes, actor: ActorSpec, slot: Slot) -> str | None:
    """The running sandbox of ``actor`` on ``slot`` (its id), found by its meta.json."""
    if not sandboxes.dir.is_dir():
        return None
    for directory in sorted(sandboxes.dir.iterdir()):
        sandbox = sandboxes.load(directory.name)
        if (
            sandbox is not None
            and sandbox.actor_key == actor.key
            and sandbox.slot == slot.index
            and await sandboxes.is_alive(sandbox.cid)
        ):
            return sandbox.cid
    return None
