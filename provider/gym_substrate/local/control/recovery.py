"""What a start finds, what a stop leaves, and the watch on running sandboxes.

At start, a RUNNING actor whose sandbox still runs is adopted, as if its worker had kept
running; a park or resume the backend was killed in is finished from what is on disk
(`interrupted.py`: a complete image is kept, a restored sandbox adopted); an actor whose
sandbox is gone is CRASHED (`ateom restarted while hosting the actor`) and
its worker's epoch rises, as when a worker's ateom restarts upstream. Nothing falls back to an
older snapshot silently: a crashed actor says so until it is reverted. A golden actor that was
lost is removed instead, so its template's build starts over. At stop (`local down`) every
sandbox goes, and the actors that ran in one are CRASHED (`worker pod went away while hosting
the actor`) unless the backend suspends them first; a golden actor mid-build is removed. While
the backend runs, a watchdog crashes a RUNNING actor whose sandbox exited, and one left in a
transitional state with no operation behind it (`transitions.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

from gym_substrate.local.control.crashes import ATEOM_RESTARTED, WORKER_GONE
from gym_substrate.local.control.interrupted import INTERRUPTED_STATES, Interrupted
from gym_substrate.local.control.records import (
    CRASHED,
    GOLDEN_ATESPACE,
    HOLDING_STATES,
    PAUSED,
    RUNNING,
    SUSPENDED,
    ActorRecord,
)
from gym_substrate.local.control.transitions import Orphans
from gym_substrate.local.runtimes.base import RuntimeFailure, Slot

if TYPE_CHECKING:
    from gym_substrate.local.control.actors import Actors
    from gym_substrate.local.control.crashes import Crashes
    from gym_substrate.local.control.parking import Parking
    from gym_substrate.local.control.shared import Shared
    from gym_substrate.local.control.tags import Tags

__all__ = ["WATCH_INTERVAL_S", "Recovery"]

log = logging.getLogger(__name__)

WATCH_INTERVAL_S = 2.0


class Recovery:
    def __init__(
        self,
        shared: Shared,
        *,
        crashes: Crashes,
        actors: Actors,
        tags: Tags,
        parking: Parking,
        watch_interval_s: float = WATCH_INTERVAL_S,
    ) -> None:
        self.shared = shared
        self.crashes = crashes
        self.actors = actors
        self.tags = tags
        self.watch_interval_s = watch_interval_s
        self._watchdog: asyncio.Task[None] | None = None
        self.interrupted = Interrupted(shared, crashes, parking)
        self.orphans = Orphans(shared.state, shared.locks, shared.metrics, crashes, shared.clock)

    async def settle(self) -> None:
        """Wait for the background steps (`Shared.track`), those they start included."""
        await self.shared.settle()

    # ---------------------------------------------------------------- start
    async def recover(self) -> None:
        shared = self.shared
        await self.tags.recover()  # before golden builds start: a cut-short golden tag goes
        keep: set[str] = set()
        lost_workers: set[str] = set()
        for record in list(shared.state.actors.values()):
            if record.state in (SUSPENDED, CRASHED):
                continue
            if record.state == PAUSED:
                if record.retained_handle:
                    keep.add(record.retained_handle)
                continue
            if record.state == RUNNING and await self._adopt(record):
                keep.add(record.handle)
                continue
            if record.state in INTERRUPTED_STATES and record.atespace != GOLDEN_ATESPACE:
                kept = await self.interrupted.settle(record)
                if kept is not None:
                    if kept:
                        keep.add(kept)
                    continue
            if record.atespace == GOLDEN_ATESPACE:
                log.info("golden actor %s was lost; its template's build starts over", record.key)
                await self.actors.remove(record)
                continue
            if record.worker:
                lost_workers.add(record.worker)
            log.warning(
                "actor %s was %s but its sandbox is gone: it is CRASHED (RevertActor takes it "
                "back to its last durable snapshot)",
                record.key,
                record.state,
            )
            await self.crashes.crash_lost(record, ATEOM_RESTARTED)
        for name in lost_workers:
            worker = shared.pool.by_name(name)
            if worker is not None:
                shared.pool.record_restart(worker)
        for line in await shared.runtime.sweep(keep):
            log.warning("removed a sandbox no actor claims: %s", line)

    async def _adopt(self, record: ActorRecord) -> bool:
        shared = self.shared
        template = shared.state.templates.get(record.template)
        if not record.handle or record.slot is None or template is None:
            return False
        try:
            spec = shared.spec(record, template)
            adopted = await shared.runtime.adopt(
                spec, Slot(record.slot), record.handle, record.address
            )
        except (RuntimeFailure, ValueError) as exc:
            log.warning("adopting %s failed: %s", record.key, exc)
            return False
        if adopted is None or not shared.pool.adopt(record.slot, record.key):
            return False
        if adopted.address != record.address or adopted.handle != record.handle:
            shared.state.save(record, handle=adopted.handle, address=adopted.address)
        log.info("adopted running actor %s at %s", record.key, adopted.address)
        return True

    # ---------------------------------------------------------------- stop
    async def stop_all(self) -> None:
        """`local down`: stop every sandbox; what ran in one is CRASHED (its worker went)."""
        shared = self.shared
        await self.settle()
        for record in list(shared.state.actors.values()):
            if record.atespace == GOLDEN_ATESPACE and record.state != SUSPENDED:
                await self.actors.remove(record)  # its build starts over at the next start
                continue
            if record.state in HOLDING_STATES and (record.handle or record.worker):
                await self.crashes.crash_lost(record, WORKER_GONE)
            if record.retained_handle:
                await shared.stop_sandbox(record.retained_handle)
        await self.settle()

    # ---------------------------------------------------------------- the watchdog
    def start_watchdog(self) -> None:
        if self._watchdog is None:
            self._watchdog = asyncio.get_running_loop().create_task(self._watch())

    async def stop_watchdog(self) -> None:
        task, self._watchdog = self._watchdog, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.watch_interval_s)
            await self.watch_once()

    async def watch_once(self) -> None:
        """Crash RUNNING actors whose sandbox exited, and repair orphaned transitions."""
        shared = self.shared
        try:
            await self.orphans.sweep()
        except Exception:  # noqa: BLE001 - a watch must not die of one actor
            log.exception("the orphaned-transition sweep failed")
        for record in list(shared.state.actors.values()):
            if record.state != RUNNING or not record.handle:
                continue
            try:
                alive = await shared.runtime.is_alive(record.handle)
            except Exception:  # noqa: BLE001 - a watch must not die of one sandbox
                log.debug("is_alive(%s) failed", record.handle, exc_info=True)
                continue
            if not alive and not shared.locks.busy(record.key):
                await self.crashes.crash_dead_sandbox(record)
