"""CRASHED (controlapi/crash.go): the control plane's crash reporter.

An actor crashes when its sandbox cannot be started or checkpointed, dies while it runs, or is
lost with its worker (a stopped backend, a worker whose epoch rises): its worker is freed, its
snapshots are kept, and `status.crash` says why (`<op> failed: <message>`, the first crash
wins). Every workflow that can leave an actor broken gets this part (`transitions.guard`,
`resume`, `parking`, `interrupted`, `recovery`); it needs only what the parts share.
"""

from __future__ import annotations

import asyncio
import logging

from gym_substrate.local.control.records import (
    CRASHED,
    PAUSING,
    RESUMING,
    REVERTING,
    RUNNING,
    SUSPENDED,
    SUSPENDING,
    ActorRecord,
    WorkerRecord,
)
from gym_substrate.local.control.shared import Shared
from gym_substrate.local.errors import AteapiError

__all__ = ["ATEOM_RESTARTED", "WORKER_GONE", "Crashes", "crash_message"]

log = logging.getLogger(__name__)

_MAX_MESSAGE = 4096
_OPERATIONS = {"create", "resume", "suspend", "pause", "delete", "revert"}
# the operation a worker's loss interrupts, by the state it finds an actor in
_INTERRUPTED = {RESUMING: "resume", SUSPENDING: "suspend", PAUSING: "pause", REVERTING: "revert"}
WORKER_GONE = "worker pod went away while hosting the actor"
ATEOM_RESTARTED = "ateom restarted while hosting the actor"


def crash_message(operation: str, message: str) -> str:
    """`<op> failed: <message>` for a lifecycle operation, the bare message otherwise."""
    text = f"{operation} failed: {message}" if operation in _OPERATIONS else message
    return text.encode()[:_MAX_MESSAGE].decode(errors="ignore")


class Crashes:
    """Moves actors to CRASHED, on the parts' shared state, pool, leases and clock."""

    def __init__(self, shared: Shared) -> None:
        self.shared = shared

    async def crash(self, record: ActorRecord, operation: str, message: str) -> ActorRecord:
        """Move ``record`` to CRASHED: its worker freed, its sandbox stopped, its snapshots kept."""
        shared = self.shared
        current = shared.state.actors.get(record.key, record)
        await shared.stop_sandbox(current.handle)
        shared.pool.release(current.slot, current.key)
        changes: dict[str, object] = {
            "state": CRASHED,
            "worker": "",
            "slot": None,
            "handle": "",
            "address": "",
        }
        if current.state != CRASHED:
            changes["crash_message"] = crash_message(operation, message)
            changes["crash_time"] = shared.clock()
        crashed = shared.state.save(current, **changes)
        template = shared.state.templates.get(crashed.template)
        shared.metrics.crashes.labels(
            operation if operation in _OPERATIONS else "unknown",
            template.meta.atespace if template else "",
            template.meta.name if template else "",
        ).inc()
        log.warning("actor %s CRASHED: %s", crashed.key, crashed.crash_message)
        return crashed

    async def crash_dead_sandbox(self, record: ActorRecord) -> None:
        """The sandbox of a RUNNING actor exited (seen by the router or the watchdog). An
        operation holding the actor's lease meanwhile finds the sandbox gone itself."""
        try:
            async with self.shared.locks.lock(record.key):
                current = self.shared.state.actors.get(record.key)
                if current is None or current.state != RUNNING or current.handle != record.handle:
                    return
                await self.crash(current, "", "the actor's sandbox exited while it was running")
        except AteapiError:
            return

    async def crash_lost(self, record: ActorRecord, message: str) -> None:
        """An actor whose sandbox went with its worker; the operation it was in is named.

        Taken under the actor's lease, waiting for an operation in flight to end first (as the
        epoch sweep skips a busy actor and comes back to it).
        """
        while True:
            try:
                async with self.shared.locks.lock(record.key):
                    current = self.shared.state.actors.get(record.key)
                    if (
                        current is None
                        or current.worker != record.worker
                        or current.state
                        in (
                            SUSPENDED,
                            CRASHED,
                        )
                    ):
                        return
                    await self.crash(current, _INTERRUPTED.get(current.state, ""), message)
                    return
            except AteapiError:
                await self.shared.locks.wait_idle(record.key, 1.0)

    def crash_for_epoch(self, worker: WorkerRecord) -> None:
        """A worker's epoch rose: crash every actor it held from an earlier epoch."""
        for record in list(self.shared.state.actors.values()):
            if (
                record.worker == worker.meta.name
                and record.worker_epoch < worker.epoch
                and record.state != SUSPENDED
            ):
                task = asyncio.get_running_loop().create_task(
                    self.crash_lost(record, ATEOM_RESTARTED)
                )
                self.shared.track(task)
