"""RevertActor (controlapi/workflow_revert.go); crashing is `crashes.py`'s.

A CRASHED actor refuses resume, pause and suspend; RevertActor takes it (or a RUNNING or
PAUSED one) back to SUSPENDED at its newest durable snapshot, dropping local and unfinished
ones: everything since that snapshot is gone, which is what the client asked for.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses

import grpc

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.local.control.crashes import Crashes
from gym_substrate.local.control.records import (
    CRASHED,
    PAUSED,
    REVERTING,
    RUNNING,
    SUSPENDED,
    ActorRecord,
)
from gym_substrate.local.control.shared import Shared
from gym_substrate.local.control.transitions import guard
from gym_substrate.local.control.validation import validated_ref
from gym_substrate.local.errors import AteapiError
from gym_substrate.local.snapshots import remove_snapshot

__all__ = ["Revert"]


class Revert:
    def __init__(self, shared: Shared, crashes: Crashes) -> None:
        self.shared = shared
        self.crashes = crashes

    async def rpc(self, request: pb.RevertActorRequest) -> ActorRecord:
        key = validated_ref(request, "actor")
        async with (
            self.shared.locks.lock(key),
            guard(self.shared.state, self.crashes, key, "revert"),
        ):
            record = self.shared.state.actor(key)
            if record.state not in (RUNNING, PAUSED, CRASHED, REVERTING):
                raise AteapiError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"Actor {key} is not in a revertable state (got: ACTOR_STATE_{record.state}, "
                    "want one of [ACTOR_STATE_RUNNING ACTOR_STATE_PAUSED ACTOR_STATE_CRASHED])",
                )
            return await self._revert(record)

    async def _revert(self, record: ActorRecord) -> ActorRecord:
        shared = self.shared
        record = shared.state.save(record, state=REVERTING)
        for handle in (record.handle, record.retained_handle):
            await shared.stop_sandbox(handle)
        shared.pool.release(record.slot, record.key)
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
        return shared.state.save(
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
