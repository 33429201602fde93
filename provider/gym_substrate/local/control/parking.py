"""PauseActor and SuspendActor (controlapi/workflow_pause.go, workflow_suspend.go).

Pause: only a RUNNING actor (a PAUSED one is a success as it is); a new generation with a LOCAL
snapshot kept on this machine. Suspend: a RUNNING actor is checkpointed into a new DURABLE
generation under the template's storage location; a PAUSED one has its local snapshot uploaded
into the same generation. Either way the actor's worker is freed, its local snapshots go, and
older durable ones it owns are replaced (a borrowed tag's never touched). A checkpoint that
fails and loses the sandbox crashes the actor, as atelet's failing Checkpoint does upstream, with
a message naming what is lost; one that leaves the sandbox alive keeps it RUNNING, and one that
plainly cannot fit on disk is refused before it starts (`durability.py`). Images are written to
a `.partial` folder, committed (fsynced, renamed) and only then recorded (`snapshots.py`), so a
restart finds every recorded-or-not image either complete or plainly unfinished
(`interrupted.py`). A checkpoint runs in a task of its own under the actor's lease: a caller
that leaves does not stop it half-way.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

import grpc

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.local.control.durability import (
    check_room,
    keep_paused,
    keep_running,
    lost_since,
    restore_local,
    sandbox_survived,
)
from gym_substrate.local.control.records import (
    GOLDEN_ATESPACE,
    PAUSED,
    PAUSING,
    RUNNING,
    SUSPENDED,
    SUSPENDING,
    ActorRecord,
    Fidelity,
    SnapshotRecord,
    Storage,
    TemplateRecord,
)
from gym_substrate.local.control.transitions import guard
from gym_substrate.local.control.validation import validated_ref
from gym_substrate.local.crashpoint import crash_point
from gym_substrate.local.errors import AteapiError
from gym_substrate.local.runtimes.base import (
    CheckpointResult,
    SnapshotKind,
    SnapshotRef,
)
from gym_substrate.local.snapshots import (
    commit_snapshot,
    new_snapshot_dir,
    partial_path,
    remove_snapshot,
)

if TYPE_CHECKING:
    from gym_substrate.local.control.crashes import Crashes
    from gym_substrate.local.control.shared import Shared

__all__ = ["Parking"]

log = logging.getLogger(__name__)


def _completed(
    snapshot: SnapshotRecord, durability: str, result: CheckpointResult
) -> SnapshotRecord:
    fidelity: Fidelity = "MEMORY" if result.memory_kept else "ROOTFS"
    storage = tuple(
        dataclasses.replace(s, status="COMPLETED", fidelity=fidelity)
        if s.durability == durability
        else s
        for s in snapshot.storage
    )
    return dataclasses.replace(snapshot, storage=storage)


class Parking:
    def __init__(self, shared: Shared, crashes: Crashes) -> None:
        self.shared = shared
        self.crashes = crashes

    # ---------------------------------------------------------------- RPCs
    async def pause(self, request: pb.PauseActorRequest) -> ActorRecord:
        key = validated_ref(request, "actor")
        task = self.shared.locks.run_detached(key, lambda: self._guarded(key, "pause", self._pause))
        return await asyncio.shield(task)

    async def suspend(self, request: pb.SuspendActorRequest) -> ActorRecord:
        return await self.suspend_key(validated_ref(request, "actor"))

    async def suspend_key(self, key: str) -> ActorRecord:
        task = self.shared.locks.run_detached(
            key, lambda: self._guarded(key, "suspend", self._suspend)
        )
        return await asyncio.shield(task)

    async def suspend_all(self, timeout_s: float) -> None:
        """`local down --suspend`: every RUNNING actor, at once; what overruns is crashed."""
        running = [r.key for r in self.shared.state.actors.values() if r.state == RUNNING]
        if not running:
            return
        log.info("suspending %d running actors before stopping", len(running))
        tasks = [asyncio.ensure_future(self.suspend_key(key)) for key in running]
        done, pending = await asyncio.wait(tasks, timeout=timeout_s)
        for task in pending:
            task.cancel()
        for task in done:
            if task.exception() is not None:
                log.warning("suspend at shutdown failed: %s", task.exception())
        await self.shared.locks.drain()

    # ---------------------------------------------------------------- workflows
    async def _guarded(
        self, key: str, operation: str, work: Callable[[str], Awaitable[ActorRecord]]
    ) -> ActorRecord:
        async with guard(self.shared.state, self.crashes, key, operation):
            return await work(key)

    async def _pause(self, key: str) -> ActorRecord:
        shared = self.shared
        record = shared.state.actor(key)
        template = shared.template_of(record)
        if record.state == PAUSED:
            return record
        # ensureMarkedPausing's order: PAUSING goes on, not RUNNING is refused, then the
        # golden rule (workflow_pause.go, current vintage: search id 70284215644)
        if record.state not in (RUNNING, PAUSING):
            raise AteapiError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"MarkPausing prerequisite not met for Actor: {key} (got: "
                f"ACTOR_STATE_{record.state}, want ACTOR_STATE_RUNNING)",
            )
        if record.state == RUNNING and record.atespace == GOLDEN_ATESPACE:
            raise AteapiError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f'actors in atespace "{GOLDEN_ATESPACE}" are golden actors, which cannot be paused',
            )
        dest = new_snapshot_dir(shared.state_dir / "snapshots" / "local", f"{record.name}-")
        await check_room(shared, record, "pause", dest)
        record = self._new_generation(record, template, "LOCAL", dest, PAUSING)
        result = await self._checkpoint(record, template, "pause", SnapshotKind.LOCAL, dest)
        return self.finish(record, template, "LOCAL", result, PAUSED)

    async def _suspend(self, key: str) -> ActorRecord:
        shared = self.shared
        record = shared.state.actor(key)
        template = shared.template_of(record)
        if record.state == SUSPENDED:
            return record
        if record.state not in (RUNNING, PAUSED, SUSPENDING):
            raise AteapiError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"MarkSuspending prerequisite not met for Actor: {key} (got: "
                f"ACTOR_STATE_{record.state}, want ACTOR_STATE_RUNNING or ACTOR_STATE_PAUSED)",
            )
        spec = shared.spec(record, template)
        base = spec.template.snapshot_location / "atespaces" / record.atespace / "actors"
        dest = new_snapshot_dir(base / record.meta.uid)
        latest = record.latest()
        local = latest.completed("LOCAL") if latest is not None else None
        if record.state == PAUSED or (record.state == SUSPENDING and not record.handle):
            if latest is None or local is None:
                await self.crashes.crash(
                    record, "suspend", "node holding the actor's local snapshot is unknown"
                )
                # a plain error upstream, which ServerUnaryInterceptor answers INTERNAL
                # (ateinterceptors.go@2e3e300a; workflow_suspend.go, search id 70362821796)
                raise AteapiError(
                    grpc.StatusCode.INTERNAL,
                    "internal server error: actor is CRASHED because it was in PAUSED state "
                    "with no completed local snapshot",
                )
            await check_room(shared, record, "suspend", dest, upload_from=Path(local.path))
            pending = Storage("DURABLE", "IN_PROGRESS", str(dest), local.fidelity)
            upload = dataclasses.replace(latest, storage=(*latest.storage, pending))
            snapshots = tuple(upload if s is latest else s for s in record.snapshots)
            record = shared.state.save(record, state=SUSPENDING, snapshots=snapshots)
            result = await self._upload(record, template, Path(local.path), dest)
        else:
            if record.state == RUNNING:
                await check_room(shared, record, "suspend", dest, durable=True)
            record = self._new_generation(record, template, "DURABLE", dest, SUSPENDING)
            result = await self._checkpoint(
                record, template, "suspend", SnapshotKind.EXTERNAL, dest
            )
        return self.finish(record, template, "DURABLE", result, SUSPENDED)

    # ---------------------------------------------------------------- steps
    def _new_generation(
        self,
        record: ActorRecord,
        template: TemplateRecord,
        durability: str,
        dest: Path,
        transit: str,
    ) -> ActorRecord:
        generation = record.last_generation + 1
        snapshot = SnapshotRecord(
            generation,
            "ACTOR",
            template.meta.uid,
            (Storage(durability, "IN_PROGRESS", str(dest)),),  # type: ignore[arg-type]
        )
        return self.shared.state.save(
            record,
            state=transit,
            last_generation=generation,
            snapshots=(*record.snapshots, snapshot),
        )

    async def _checkpoint(
        self,
        record: ActorRecord,
        template: TemplateRecord,
        operation: str,
        kind: SnapshotKind,
        dest: Path,
    ) -> CheckpointResult:
        shared = self.shared
        started = time.perf_counter()
        await shared.release_connections(record.handle)
        partial = partial_path(dest)
        try:
            spec = shared.spec(record, template)
            result = await shared.runtime.checkpoint(spec, record.handle, kind, partial)
            crash_point("after-checkpoint-before-commit")
            await asyncio.to_thread(commit_snapshot, partial, dest)
        except Exception as exc:  # noqa: BLE001 - the actor must not stay in transit
            shared.metrics.lifecycle(
                operation, template, "", time.perf_counter() - started, "INTERNAL"
            )
            if await sandbox_survived(shared, record.handle, exc):
                raise await keep_running(shared, record, operation, dest, exc) from exc
            await asyncio.to_thread(remove_snapshot, dest)
            message = f"atelet Checkpoint: {exc}; {lost_since(record)}"
            await self.crashes.crash(record, operation, message)
            raise AteapiError(
                grpc.StatusCode.INTERNAL, f"actor {record.key} crashed: {message}"
            ) from exc
        crash_point("after-checkpoint-before-record")
        shared.metrics.lifecycle(operation, template, "", time.perf_counter() - started)
        return dataclasses.replace(result, snapshot=SnapshotRef(kind, dest))

    async def _upload(
        self, record: ActorRecord, template: TemplateRecord, local: Path, dest: Path
    ) -> CheckpointResult:
        shared = self.shared
        started = time.perf_counter()
        partial = partial_path(dest)
        try:
            spec = shared.spec(record, template)
            result = await shared.runtime.upload(
                spec, SnapshotRef(SnapshotKind.LOCAL, local), record.retained_handle, partial
            )
            crash_point("after-checkpoint-before-commit")
            await asyncio.to_thread(commit_snapshot, partial, dest)
        except Exception as exc:  # noqa: BLE001 - the actor must not stay in transit
            shared.metrics.lifecycle(
                "suspend", template, "", time.perf_counter() - started, "INTERNAL"
            )
            if await asyncio.to_thread(restore_local, partial, local):
                raise keep_paused(shared, record, dest, exc) from exc
            await asyncio.to_thread(remove_snapshot, dest)
            message = f"atelet UploadPausedCheckpoint: {exc}; {lost_since(record)}"
            await self.crashes.crash(record, "suspend", message)
            raise AteapiError(
                grpc.StatusCode.INTERNAL, f"actor {record.key} crashed: {message}"
            ) from exc
        crash_point("after-checkpoint-before-record")
        shared.metrics.lifecycle("suspend", template, "", time.perf_counter() - started)
        return dataclasses.replace(result, snapshot=SnapshotRef(SnapshotKind.EXTERNAL, dest))

    def finish(
        self,
        record: ActorRecord,
        template: TemplateRecord,
        durability: str,
        result: CheckpointResult,
        target: str,
    ) -> ActorRecord:
        """Free the worker, keep the new generation, drop what it replaces."""
        shared = self.shared
        shared.pool.release(record.slot, record.key)
        current = shared.state.actor(record.key)
        newest = max(s.generation for s in current.snapshots)
        kept: list[SnapshotRecord] = []
        doomed: list[str] = []
        retained = result.retained_handle or ""
        for snapshot in current.snapshots:
            newest_generation = snapshot.generation == newest
            if newest_generation:
                snapshot = _completed(snapshot, durability, result)
            if durability == "DURABLE" and not newest_generation:
                # the new durable generation replaces every older one (a tag's stays the tag's)
                if snapshot.owner == "ACTOR":
                    doomed += [s.path for s in snapshot.storage]
                continue
            if durability == "DURABLE" or not newest_generation:
                # a suspend drops every local entry, a pause the older ones
                doomed += [s.path for s in snapshot.storage if s.durability == "LOCAL"]
                snapshot = dataclasses.replace(
                    snapshot, storage=tuple(s for s in snapshot.storage if s.durability != "LOCAL")
                )
            if snapshot.storage:
                kept.append(snapshot)
        stale_retained = current.retained_handle if current.retained_handle != retained else ""
        record = shared.state.save(
            current,
            state=target,
            snapshots=tuple(kept),
            worker="",
            slot=None,
            handle="",
            address="",
            retained_handle=retained,
        )
        for kind, size in result.files:
            shared.metrics.snapshot_size.labels(
                kind, template.meta.atespace, template.meta.name
            ).observe(size)  # noqa: E501
        task = asyncio.get_running_loop().create_task(self._clean(doomed, stale_retained))
        shared.track(task)
        return record

    async def _clean(self, folders: list[str], retained: str) -> None:
        if retained:
            await self.shared.stop_sandbox(retained)
        for folder in folders:
            with contextlib.suppress(OSError):
                await asyncio.to_thread(remove_snapshot, folder)
