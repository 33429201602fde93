"""What a park may cost on disk, and what a failed park or resume tells the client.

Three rules keep an actor's state from vanishing silently (issue 24):

* A park that plainly cannot fit is refused before anything is touched: the runtime's estimate
  of the image (gVisor: the sandbox's memory usage, which is what runsc writes) against the free
  space where the image goes. The actor keeps RUNNING (or PAUSED, for an upload) and the answer
  is RESOURCE_EXHAUSTED saying how much is needed and free.
* A checkpoint that fails but leaves the sandbox running puts the actor back to RUNNING and says
  so: nothing was lost.
* One that loses the sandbox makes the actor CRASHED (upstream's crash semantics: it refuses
  resume until RevertActor), with a message that names what is gone: everything since the
  snapshot a revert goes back to.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import grpc

from gym_substrate.local.control.records import PAUSED, RUNNING, ActorRecord, SnapshotRecord
from gym_substrate.local.errors import AteapiError
from gym_substrate.local.runtimes.base import RuntimeFailure
from gym_substrate.local.snapshots import existing_parent, free_bytes, remove_snapshot, tree_bytes

if TYPE_CHECKING:
    from gym_substrate.local.control.shared import Shared

__all__ = [
    "check_room",
    "drop_pending_durable",
    "keep_paused",
    "keep_running",
    "lost_since",
    "restore_local",
    "sandbox_survived",
]

log = logging.getLogger(__name__)

_MB = 1 << 20


def lost_since(record: ActorRecord) -> str:
    """What an actor that lost its sandbox has lost, and what a revert gives back."""
    durable = record.latest_durable()
    if durable is None:
        return (
            "lost: the sandbox's memory and files since it was created (RevertActor starts it "
            "over from its template)"
        )
    return (
        "lost: the sandbox's memory and files since its snapshot generation "
        f"{durable.generation} (RevertActor takes it back there)"
    )


async def _estimate(shared: Shared, handle: str, durable: bool) -> int | None:
    """The runtime's guess of the bytes a park of ``handle`` writes: ``suspend_estimate`` for a
    durable one where the runtime has it (the process runtime, whose pause writes nothing and
    whose suspend copies the actor's files), else ``checkpoint_estimate`` (gVisor: both write
    an image of the sandbox)."""
    if not durable and not getattr(shared.runtime, "pause_writes_image", lambda: True)():
        return None  # gVisor's freeze tier: a pause keeps the sandbox, no image is written now
    estimate = getattr(shared.runtime, "suspend_estimate", None) if durable else None
    if estimate is None:
        estimate = getattr(shared.runtime, "checkpoint_estimate", None)
    if estimate is None or not handle:
        return None
    try:
        value = await estimate(handle)
    except (RuntimeFailure, OSError, ValueError) as exc:
        log.debug("no checkpoint estimate for %s: %s", handle, exc)
        return None
    return value if isinstance(value, int) and value > 0 else None


async def check_room(
    shared: Shared,
    record: ActorRecord,
    operation: str,
    dest: Path,
    *,
    durable: bool = False,
    upload_from: Path | None = None,
) -> None:
    """RESOURCE_EXHAUSTED when ``dest``'s file system plainly cannot take the new image
    (``durable``: a suspend's; ``upload_from``: a paused actor's local image, moved or copied)."""
    if upload_from is not None:
        needed: int | None = 0
        if not await asyncio.to_thread(_same_device, upload_from, dest):  # else a rename
            needed = await asyncio.to_thread(tree_bytes, upload_from)
        # what the retained sandbox writes beside it (the process runtime's files; gVisor's
        # frozen sandbox, checkpointed now: its memory and in-memory overlay)
        needed = (needed or 0) + (await _estimate(shared, record.retained_handle, True) or 0)
    else:
        needed = await _estimate(shared, record.handle, durable)
    if not needed:
        return
    free = await asyncio.to_thread(free_bytes, dest)
    if free >= needed:
        return
    keeps = "stays PAUSED" if upload_from is not None else "keeps running (RUNNING)"
    raise AteapiError(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        f"{operation} of actor {record.key} refused: its image needs about "
        f"{needed / _MB:.1f} MiB but only {free / _MB:.1f} MiB are free in "
        f"{existing_parent(dest)}; "
        f"nothing was written and the actor {keeps}. Free space there "
        "(or move the state folder / the template's snapshot location) and try again",
    )


def _same_device(source: Path, dest: Path) -> bool:
    try:
        return source.stat().st_dev == existing_parent(dest).stat().st_dev
    except OSError:
        return False


async def sandbox_survived(shared: Shared, handle: str, exc: Exception) -> bool:
    """After a failed checkpoint: is the sandbox still there to keep running?"""
    if isinstance(exc, RuntimeFailure) and exc.sandbox_lost:
        return False
    try:
        return bool(handle) and await shared.runtime.is_alive(handle)
    except (RuntimeFailure, OSError):
        return False


async def keep_running(
    shared: Shared, record: ActorRecord, operation: str, dest: Path, exc: Exception
) -> AteapiError:
    """Undo a park whose checkpoint failed but left the sandbox alive: the new generation goes,
    the actor is RUNNING again; the error to answer with."""
    await asyncio.to_thread(remove_snapshot, dest)
    current = shared.state.actor(record.key)
    snapshots = tuple(s for s in current.snapshots if s.generation != current.last_generation)
    shared.state.save(current, state=RUNNING, snapshots=snapshots)
    log.warning("%s of %s failed; it keeps running: %s", operation, record.key, exc)
    return AteapiError(
        grpc.StatusCode.INTERNAL,
        f"{operation} of actor {record.key} failed and nothing was saved, but its sandbox "
        f"survived: the actor keeps running (RUNNING) with its memory and files: {exc}",
    )


def restore_local(partial: Path, local: Path) -> bool:
    """After a failed upload: put a moved local image back; True if it is (still) there."""
    if not local.is_dir() and partial.is_dir():
        try:
            partial.rename(local)
        except OSError:
            return False
    if local.is_dir():
        shutil.rmtree(partial, ignore_errors=True)
        return True
    return False


def drop_pending_durable(record: ActorRecord) -> tuple[SnapshotRecord, ...]:
    """``record``'s snapshots without their unfinished DURABLE storage (an upload's)."""
    return tuple(
        dataclasses.replace(
            s,
            storage=tuple(
                x for x in s.storage if not (x.durability == "DURABLE" and x.status != "COMPLETED")
            ),
        )
        for s in record.snapshots
    )


def keep_paused(shared: Shared, record: ActorRecord, dest: Path, exc: Exception) -> AteapiError:
    """Undo an upload that failed with the local image intact: the actor is PAUSED again."""
    shutil.rmtree(dest, ignore_errors=True)
    current = shared.state.actor(record.key)
    shared.state.save(current, state=PAUSED, snapshots=drop_pending_durable(current))
    log.warning("suspend of paused %s failed; it stays paused: %s", record.key, exc)
    return AteapiError(
        grpc.StatusCode.INTERNAL,
        f"suspend of actor {record.key} failed and nothing was lost: it stays PAUSED with its "
        f"node-local snapshot: {exc}",
    )
