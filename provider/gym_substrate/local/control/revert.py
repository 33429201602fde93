"""CRASHED and RevertActor (controlapi/crash.go, workflow_revert.go).

An actor crashes when its sandbox cannot be started or checkpointed, dies while it runs, or is
lost with its worker (a stopped backend, a worker whose epoch rises): its worker is freed, its
snapshots are kept, and `status.crash` says why (`<op> failed: <message>`, the first crash
wins). A CRASHED actor refuses resume, pause and suspend; RevertActor takes it (or a RUNNING or
PAUSED one) back to SUSPENDED at its newest durable snapshot, dropping local and unfinished
ones: everything since that snapshot is gone, which is what the client asked for.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from typing import TYPE_CHECKING

import grpc

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.local.control.records import (
    CRASHED,
    PAUSED,
    PAUSING,
    RESUMING,
    REVERTING,
    RUNNING,
    SUSPENDED,
    SUSPENDING,
    ActorRecord,
    WorkerRecord,
)
from gym_substrate.local.control.transitions import guard
from gym_substrate.local.control.validation import validated_ref
from gym_substrate.local.errors import AteapiError
from gym_substrate.local.snapshots import remove_snapshot

if TYPE_CHECKING:
    from gym_substrate.local.control.plane import ControlPlane

__all__ = ["Revert", "crash_message"]

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


class Revert:
    def __init__(self, plane: ControlPlane) -> None:
        self.plane = plane

    async def rpc(self, request: pb.RevertActorRequest) -> ActorRecord:
        key = validated_ref(request, "actor")
        async with self.plane.locks.lock(key), guard(self.plane, key, "revert"):
            record = self.plane.state.actor(key)
            if record.state not in (RUNNING, PAUSED, CRASHED, REVERTING):
                raise AteapiError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"Actor {key} is not in a revertable state (got: ACTOR_STATE_{record.state}, "
                    "want one of [ACTOR_STATE_RUNNING ACTOR_STATE_PAUSED ACTOR_STATE_CRASHED])",
                )
            return await self._revert(record)

    async def _revert(self, record: ActorRecord) -> ActorRecord:
        plane = self.plane
        record = plane.state.save(record, state=REVERTING)
        for handle in (record.handle, record.retained_handle):
            await plane.stop_sandbox(handle)
        plane.pool.release(record.slot, record.key)
        kept = []
        for snapshot in record.snapshots:
            durable = tuple(
                s for s in snapshot.storage if s.durability == "DURABLE" and s.status == "COMPLETED"
            )
            for stored in snapshot.storage:
                if stored not in durable and snapshot.owner == "ACTOR":
                    with contextlib.suppress(OSError):
                        await asyncio.to_thread(remove_snapshot, stored.path)
            if durable:
                kept.append(dataclasses.replace(snapshot, storage=durable))
        return plane.state.save(
            record,
            state=SUSPENDED,
            snapshots=tuple(kept),
            crash_message="",
            crash_time=0.0,
            worker="",
            slot=None,
            handle="",
            address="",
            retained_handle="",
        )

    # ---------------------------------------------------------------- crashes
    async def crash(self, record: ActorRecord, operation: str, message: str) -> ActorRecord:
        """Move ``record`` to CRASHED: its worker freed, its sandbox stopped, its snapshots kept."""
        plane = self.plane
        current = plane.state.actors.get(record.key, record)
        await plane.stop_sandbox(current.handle)
        plane.pool.release(current.slot, current.key)
        changes: dict[str, object] = {
            "state": CRASHED,
            "worker": "",
            "slot": None,
            "handle": "",
            "address": "",
        }
        if current.state != CRASHED:
            changes["crash_message"] = crash_message(operation, message)
            changes["crash_time"] = plane.clock()
        crashed = plane.state.save(current, **changes)
        template = plane.state.templates.get(crashed.template)
        plane.metrics.crashes.labels(
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
            async with self.plane.locks.lock(record.key):
                current = self.plane.state.actors.get(record.key)
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
                async with self.plane.locks.lock(record.key):
                    current = self.plane.state.actors.get(record.key)
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
                await self.plane.locks.wait_idle(record.key, 1.0)

    def crash_for_epoch(self, worker: WorkerRecord) -> None:
        """A worker's epoch rose: crash every actor it held from an earlier epoch."""
        for record in list(self.plane.state.actors.values()):
            if (
                record.worker == worker.meta.name
                and record.worker_epoch < worker.epoch
                and record.state != SUSPENDED
            ):
                task = asyncio.get_running_loop().create_task(
                    self.crash_lost(record, ATEOM_RESTARTED)
                )
                self.plane.recovery.track(task)
