"""A restart finishes what a killed backend left half-way, from what is on disk.

`recovery.py` hands over every actor found PAUSING, SUSPENDING or RESUMING. A park's image is
committed (`snapshots.commit_snapshot`: fsynced, then renamed from `.partial`) before its record
changes, so the folder the record names tells the truth:

* it exists: the image is complete; the park is finished as it would have been (PAUSED or
  SUSPENDED at that new generation). The newest complete state is never dropped.
* it does not: the unfinished `.partial` goes. A sandbox that still runs is adopted (RUNNING,
  nothing lost); a paused actor whose upload was cut short stays PAUSED on its local image;
  otherwise the actor is CRASHED with a message naming what is lost.
* a RESUMING actor whose restored sandbox runs on its slot is adopted (RUNNING). One whose
  sandbox is not found is left to `recovery.py`, which crashes it as upstream does.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from gym_substrate.local.control.durability import (
    drop_pending_durable,
    lost_since,
    restore_local,
)
from gym_substrate.local.control.records import (
    PAUSED,
    PAUSING,
    RESUMING,
    RUNNING,
    SUSPENDED,
    SUSPENDING,
    ActorRecord,
    SnapshotRecord,
    Storage,
)
from gym_substrate.local.runtimes.base import (
    RETAINED_MARKERS,
    CheckpointResult,
    RuntimeFailure,
    Slot,
    SnapshotKind,
    SnapshotRef,
)
from gym_substrate.local.snapshots import partial_path, remove_snapshot, tree_bytes

if TYPE_CHECKING:
    from gym_substrate.local.control.crashes import Crashes
    from gym_substrate.local.control.parking import Parking
    from gym_substrate.local.control.shared import Shared

__all__ = ["INTERRUPTED_STATES", "Interrupted"]

log = logging.getLogger(__name__)

INTERRUPTED_STATES = frozenset({PAUSING, SUSPENDING, RESUMING})


def _pending(record: ActorRecord) -> tuple[SnapshotRecord, Storage] | None:
    """The newest generation's unfinished storage (the park in flight), if any."""
    if not record.snapshots:
        return None
    newest = max(record.snapshots, key=lambda s: s.generation)
    for stored in newest.storage:
        if stored.status == "IN_PROGRESS":
            return newest, stored
    return None


def _left_alive(dest: Path, handle: str) -> bool:
    """The committed folder says its sandbox was kept alive (the process runtime's stopped
    pause, the gVisor freeze tier's frozen one)."""
    for name, key in RETAINED_MARKERS:
        try:
            marker = json.loads((dest / name).read_text())
        except (OSError, ValueError):
            continue
        if bool(handle) and isinstance(marker, dict) and marker.get(key) == handle:
            return True
    return False


class Interrupted:
    def __init__(self, shared: Shared, crashes: Crashes, parking: Parking) -> None:
        self.shared = shared
        self.crashes = crashes
        self.parking = parking

    async def settle(self, record: ActorRecord) -> str | None:
        """Finish ``record``'s interrupted operation; the sandbox handle to keep ("" for none),
        or None when it is left to the caller (a RESUMING actor whose sandbox is gone)."""
        if record.state == RESUMING:
            return await self._resuming(record)
        pending = _pending(record)
        if pending is None:
            return None
        _generation, stored = pending
        dest = Path(stored.path)
        if await asyncio.to_thread(dest.is_dir):
            return await self._complete(record, stored, dest)
        await asyncio.to_thread(remove_snapshot, partial_path(dest))
        if record.state == SUSPENDING and not record.handle:
            return await self._upload_cut(record, dest)
        adopted = await self._adopt(record)
        if adopted:
            current = self.shared.state.actor(record.key)
            generation = max(s.generation for s in current.snapshots)
            self.shared.state.save(
                current,
                state=RUNNING,
                snapshots=tuple(s for s in current.snapshots if s.generation != generation),
            )
            log.warning(
                "actor %s was %s when the backend stopped, before its image was complete: "
                "the unfinished image is removed and the running sandbox adopted (RUNNING)",
                record.key,
                record.state,
            )
            return adopted
        operation = "pause" if record.state == PAUSING else "suspend"
        await self.crashes.crash(
            record,
            operation,
            "the backend stopped before its checkpoint was complete, and the sandbox is gone; "
            + lost_since(record),
        )
        return ""

    async def _complete(self, record: ActorRecord, stored: Storage, dest: Path) -> str:
        shared = self.shared
        template = shared.state.templates.get(record.template)
        durability = stored.durability
        alive = bool(record.handle) and await self._alive(record.handle)
        retained = (
            record.handle
            if alive and await asyncio.to_thread(_left_alive, dest, record.handle)
            else ""
        )
        if alive and not retained:
            await shared.stop_sandbox(record.handle)
        if template is None:  # nothing can resume it; keep the image for a revert
            await self.crashes.crash(record, "", "its template is gone")
            return ""
        size = await asyncio.to_thread(tree_bytes, dest)
        kind = SnapshotKind.LOCAL if durability == "LOCAL" else SnapshotKind.EXTERNAL
        result = CheckpointResult(
            snapshot=SnapshotRef(kind, dest),
            files=(("files", size),),
            memory_kept=shared.runtime.memory_survives_suspend or bool(retained),
            retained_handle=retained or None,
        )
        target = PAUSED if durability == "LOCAL" else SUSPENDED
        self.parking.finish(record, template, durability, result, target)
        log.warning(
            "actor %s was %s when the backend stopped; its image %s was complete: %s",
            record.key,
            record.state,
            dest,
            target,
        )
        return retained

    async def _upload_cut(self, record: ActorRecord, dest: Path) -> str:
        latest = record.latest()
        local = latest.completed("LOCAL") if latest is not None else None
        partial = partial_path(dest)
        if local is not None and await asyncio.to_thread(restore_local, partial, Path(local.path)):
            current = self.shared.state.actor(record.key)
            self.shared.state.save(current, state=PAUSED, snapshots=drop_pending_durable(current))
            log.warning(
                "actor %s was uploading its paused image when the backend stopped: the "
                "unfinished copy is removed and it stays PAUSED",
                record.key,
            )
            return record.retained_handle
        await self.crashes.crash(
            record,
            "suspend",
            "the backend stopped during the upload of its paused image, which is gone; "
            + lost_since(record),
        )
        return ""

    async def _resuming(self, record: ActorRecord) -> str | None:
        adopted = await self._adopt(record)
        if not adopted:
            return None
        current = self.shared.state.actor(record.key)
        self.shared.state.save(current, state=RUNNING, retained_handle="")
        log.warning(
            "actor %s was RESUMING when the backend stopped; its restored sandbox runs: adopted "
            "(RUNNING)",
            record.key,
        )
        return adopted

    async def _alive(self, handle: str) -> bool:
        try:
            return await self.shared.runtime.is_alive(handle)
        except (RuntimeFailure, OSError):
            return False

    async def _adopt(self, record: ActorRecord) -> str:
        """Adopt ``record``'s sandbox on its slot (RESUMING: found by the runtime); its handle,
        or "" when there is none to adopt."""
        shared = self.shared
        template = shared.state.templates.get(record.template)
        if record.slot is None or template is None:
            return ""
        try:
            adopted = await shared.runtime.adopt(
                shared.spec(record, template), Slot(record.slot), record.handle, record.address
            )
        except (RuntimeFailure, ValueError) as exc:
            log.warning("adopting %s failed: %s", record.key, exc)
            return ""
        if adopted is None or not shared.pool.adopt(record.slot, record.key):
            return ""
        shared.state.save(
            shared.state.actor(record.key), handle=adopted.handle, address=adopted.address
        )
        return adopted.handle
