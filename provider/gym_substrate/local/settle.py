"""`local down` after a crash: adopt what the dead backend left running, then stop it as a
live backend's `down` would, and say what happened to each actor.

A backend killed with SIGKILL leaves its sandboxes running and its records saying RUNNING (or
half-way through a park or a resume). `local up` would adopt them; `local down` used to kill them
unseen, so the next start found them gone. Now `down` takes the state folder's lock, starts the
control plane without any listener (no API, router or golden build), lets its recovery adopt
running sandboxes and finish interrupted parks (`control/interrupted.py`), then shuts it down:
with `--suspend` running actors are suspended (nothing lost), without it they are CRASHED as
when worker pods go away (`worker pod went away while hosting the actor`), which RevertActor
undoes. `--discard` skips all this and only removes the sandboxes (`statedir.cleanup_state_dir`).
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

from gym_substrate.local import rootfs, statedir
from gym_substrate.local.control.plane import ControlPlane
from gym_substrate.local.control.records import (
    GOLDEN_ATESPACE,
    HOLDING_STATES,
    ActorRecord,
)
from gym_substrate.local.control.store import StaleStateError, Store, read_meta
from gym_substrate.local.errors import BackendError
from gym_substrate.local.images import ImageCatalogue
from gym_substrate.local.metrics import Metrics
from gym_substrate.local.runtimes import create_runtime
from gym_substrate.local.runtimes.base import RuntimeConfig

__all__ = ["active_actors", "settle_stopped_backend"]

log = logging.getLogger(__name__)


def active_actors(state_dir: Path) -> list[str]:
    """Actors a stopped backend's records still show holding a worker (`atespace/name STATE`)."""
    if not (state_dir / "state.db").exists() or not read_meta(state_dir / "state.db"):
        return []
    try:
        store = Store(state_dir / "state.db")
    except StaleStateError:
        return []  # another schema: nothing of it can be carried over (`down --purge`)
    try:
        records = list(store.load(ActorRecord))
    finally:
        store.close()
    return [
        f"{r.key} {r.state}"
        for r in records
        if r.state in HOLDING_STATES and r.atespace != GOLDEN_ATESPACE
    ]


def _images(state_dir: Path) -> ImageCatalogue:
    """The catalogue as `local up` builds it, from what is on disk (nothing is built here)."""
    images = ImageCatalogue(state_dir)
    base = rootfs.default_rootfs_dir()
    built = rootfs.find_rootfs(base)
    if built is not None:
        images.add_rootfs_build(built.path, built.path / rootfs.MARKER)
    for agent in sorted(base.glob("agent/*/sandbox-agent")):
        images.add_agent(agent)
    return images


def _describe(before: ActorRecord, after: ActorRecord | None, suspend: bool) -> str:
    if after is None:
        return f"actor {before.key} ({before.state}): removed"
    if after.state == "CRASHED":
        hint = "" if suspend else "; `local down --suspend` keeps a running actor's state"
        return (
            f"actor {before.key} ({before.state}): CRASHED: {after.crash_message} (RevertActor "
            f"takes it back to its last durable snapshot){hint}"
        )
    return f"actor {before.key} ({before.state}): its sandbox was adopted, now {after.state}"


async def settle_stopped_backend(state_dir: Path, *, suspend: bool) -> tuple[list[str], list[str]]:
    """Adopt, then stop, what a dead backend of ``state_dir`` left: a line per actor, and what
    the runtime's cleanup removed."""
    meta = read_meta(state_dir / "state.db") if (state_dir / "state.db").exists() else {}
    name = meta.get("runtime")
    if not name:
        return [], []
    try:
        lock_fd = statedir.acquire_lock(state_dir)
    except BackendError:
        return [], []  # a backend is starting there: `cleanup_state_dir` refuses, saying so
    store: Store | None = None
    try:
        store = Store(state_dir / "state.db")
        before = {r.key: r for r in store.load(ActorRecord) if r.state in HOLDING_STATES}
        if not any(r.atespace != GOLDEN_ATESPACE for r in before.values()):
            return [], []
        instance = meta.get("instance") or statedir.instance_name(state_dir)
        workers = int(meta.get("workers") or "1")
        per_worker = int(meta.get("actors_per_worker") or "1")
        runtime = create_runtime(
            name, RuntimeConfig(state_dir / "runtime" / name, instance, workers * per_worker)
        )
        plane = ControlPlane(
            store,
            runtime,
            state_dir=state_dir,
            instance=instance,
            workers=workers,
            actors_per_worker=per_worker,
            metrics=Metrics(),
            images=_images(state_dir),
            # what the dead backend's operator allowed, so its host-rootfs actors are adopted
            allow_host_rootfs=bool(statedir.last_backend_info(state_dir).get("allow_host_rootfs")),
        )
        plane.state.load()
        plane.pool.load()
        await runtime.open()
        await plane.recovery.recover()
        await plane.recovery.settle()
        # as ControlPlane.shutdown, keeping what the cleanup removed to print it
        await plane.golden.stop()
        await plane.locks.drain()
        if suspend:
            await plane.parking.suspend_all(120.0)
        await runtime.park_paused()  # frozen sandboxes become images before they go
        await plane.recovery.stop_all()
        removed = await runtime.cleanup()
        await runtime.close()
        after = plane.state.actors
        lines = [
            _describe(record, after.get(key), suspend)
            for key, record in sorted(before.items())
            if record.atespace != GOLDEN_ATESPACE
        ]
        return lines, removed
    except StaleStateError:
        return [], []  # another schema: nothing of it can be carried over (`down --purge`)
    finally:
        if store is not None:
            with contextlib.suppress(Exception):
                store.close()
        statedir.release_lock(lock_fd)
