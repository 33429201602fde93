"""ResumeActor (controlapi/workflow_resume.go): a worker, a sandbox, the wakeup probe.

A RUNNING actor answers at once with `resumed=false`, lease or no lease (the router resumes on
every request). Otherwise, under the actor's lease: its template (FAILED_PRECONDITION when
gone); a worker (SUSPENDED or PAUSED actors are placed, RESOURCE_EXHAUSTED when no worker has
room; a RESUMING one re-enters on the worker it holds, and crashes if that worker no longer
hosts it; any other state is FAILED_PRECONDITION `AssignWorker prerequisite not met ...`); then
the sandbox from its newest snapshot (node-local first, then durable, else a cold boot), which
returns once the template's wakeup probe answers 200. A start that fails, the probe's timeout
included, CRASHES the actor (`resume failed: atelet Restore: ...`) and answers `actor <ref>
crashed: ...`. A caller that goes away (a client deadline) stops the resume part-way and leaves
the actor RESUMING on its worker, for the next ResumeActor to finish.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import grpc

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.local.control.records import (
    PAUSED,
    RESUMING,
    RUNNING,
    SUSPENDED,
    ActorRecord,
    TemplateRecord,
)
from gym_substrate.local.control.transitions import guard
from gym_substrate.local.control.validation import validated_ref
from gym_substrate.local.crashpoint import crash_point
from gym_substrate.local.errors import AteapiError
from gym_substrate.local.runtimes.base import Slot, SnapshotKind, SnapshotRef

if TYPE_CHECKING:
    from gym_substrate.local.control.crashes import Crashes
    from gym_substrate.local.control.shared import Shared

__all__ = ["START_ALLOWANCE_S", "Resume"]

# what a sandbox may take to start before its wakeup probe's own timeout counts
START_ALLOWANCE_S = 10.0


def _selector(template: TemplateRecord) -> dict[str, str]:
    return dict(pb.ActorTemplate.FromString(template.message).worker_selector.match_labels)


class Resume:
    def __init__(self, shared: Shared, crashes: Crashes) -> None:
        self.shared = shared
        self.crashes = crashes

    async def rpc(self, request: pb.ResumeActorRequest) -> tuple[ActorRecord, bool]:
        return await self.run(validated_ref(request, "actor"))

    async def run(self, key: str) -> tuple[ActorRecord, bool]:
        """Resume actor ``key``; the record and whether a resume ran."""
        state = self.shared.state
        record = state.actor(key)
        if record.state == RUNNING:
            return record, False
        async with (
            self.shared.locks.lock(key),
            guard(self.shared.state, self.crashes, key, "resume"),
        ):
            record = state.actor(key)
            if record.state == RUNNING:
                return record, False
            template = self.shared.template_of(record)
            record = await self._assign(record, template)
            return await self._start(record, template), True

    async def _assign(self, record: ActorRecord, template: TemplateRecord) -> ActorRecord:
        shared = self.shared
        selectors = [_selector(template), record.worker_selector]
        if record.state == RESUMING:
            reason = shared.pool.still_hosts(record.worker, record.slot, record.key)
            worker = shared.pool.by_name(record.worker)
            if (
                not reason
                and worker is not None
                and not all(worker.labels.get(k) == v for s in selectors for k, v in s.items())
            ):
                reason = "assigned worker no longer satisfies the actor's placement constraints"
            if reason:
                await self.crashes.crash(record, "resume", reason)
                raise AteapiError(grpc.StatusCode.ABORTED, f"actor {record.key} crashed")
            return record
        if record.state not in (SUSPENDED, PAUSED):
            raise AteapiError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"AssignWorker prerequisite not met for Actor: {record.key} (got: "
                f"ACTOR_STATE_{record.state}, want ACTOR_STATE_SUSPENDED or ACTOR_STATE_PAUSED)",
            )
        placement = shared.pool.place(record.key, selectors)
        try:
            return shared.state.save(
                record,
                state=RESUMING,
                worker=placement.worker.meta.name,
                slot=placement.slot,
                worker_epoch=placement.worker.epoch,
            )
        except BaseException:  # not recorded (a full state folder): the slot goes back
            shared.pool.release(placement.slot, record.key)
            raise

    def _source(
        self, record: ActorRecord, template: TemplateRecord
    ) -> tuple[SnapshotRef | None, str]:
        """What to start from, and its `ate.snapshot.kind` (local, latest, golden, boot)."""
        latest = record.latest()
        if latest is None:
            return None, "boot"
        local = latest.completed("LOCAL")
        if local is not None:
            return SnapshotRef(SnapshotKind.LOCAL, Path(local.path)), "local"
        durable = latest.completed("DURABLE")
        if durable is None or latest.template_uid != template.meta.uid:
            return None, "boot"  # a replaced template: the snapshot's guest state does not fit
        if latest.owner == "TAG":
            return SnapshotRef(SnapshotKind.TAG, Path(durable.path)), "golden"
        return SnapshotRef(SnapshotKind.EXTERNAL, Path(durable.path)), "latest"

    async def _start(self, record: ActorRecord, template: TemplateRecord) -> ActorRecord:
        shared = self.shared
        source, kind = self._source(record, template)
        step = "atelet Run" if source is None else "atelet Restore"
        started_at = time.perf_counter()
        assert record.slot is not None
        try:
            spec = shared.spec(record, template)
            started = await shared.runtime.start(
                spec,
                Slot(record.slot),
                source,
                timeout_s=spec.template.probe_timeout_s + START_ALLOWANCE_S,
            )
        except Exception as exc:  # noqa: BLE001 - whatever failed, the actor must not stay RESUMING
            await self.crashes.crash(record, "resume", f"{step}: {exc}")
            shared.metrics.lifecycle(
                "resume", template, kind, time.perf_counter() - started_at, "INTERNAL"
            )
            raise AteapiError(
                grpc.StatusCode.INTERNAL, f"actor {record.key} crashed: {step}: {exc}"
            ) from exc
        crash_point("mid-resume-after-restore")
        try:
            record = shared.state.save(
                record,
                state=RUNNING,
                handle=started.handle,
                address=started.address,
                retained_handle="",
            )
        except BaseException:  # not recorded (a full state folder): no sandbox nobody tracks
            await shared.stop_sandbox(started.handle)
            raise
        shared.metrics.lifecycle("resume", template, kind, time.perf_counter() - started_at)
        return record
