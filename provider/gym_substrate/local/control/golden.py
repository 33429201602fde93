"""Golden builds: each new template's warmed-up snapshot, kept as a published tag.

As upstream's template reconciler (controlapi/template_reconciler.go), a build observes the
golden actor `ate-golden/<template uid>` and takes one step per pass: create it; resume it (a
cold boot, which waits for the wakeup probes); let it warm up (0 s when every container has a
probe, else 20 s, recorded as `snapshot_time`); suspend it; tag the snapshot as the published
tag `ate-golden/<template uid>`; delete the actor; record the tag in the template's
`golden_snapshot_status.golden_tag`. A failure that retrying cannot mend ends the build with
`error_message` `<Reason>: <detail>` (GoldenTagConflict, GoldenActorInvalid,
GoldenActorCrashed, GoldenActorUnexpectedState); anything else (no free worker, a held lease)
is retried with backoff. Builds run in the background and resume after a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

import grpc

from gym_substrate.local.control.records import (
    CRASHED,
    GOLDEN_ATESPACE,
    RESUMING,
    RUNNING,
    SUSPENDED,
    SUSPENDING,
    TemplateRecord,
)
from gym_substrate.local.control.warm_targets import kick_warm_pool
from gym_substrate.local.errors import AteapiError

if TYPE_CHECKING:
    from gym_substrate.local.control.actors import Actors
    from gym_substrate.local.control.atespaces import Atespaces
    from gym_substrate.local.control.parking import Parking
    from gym_substrate.local.control.resume import Resume
    from gym_substrate.local.control.shared import Shared
    from gym_substrate.local.control.tags import Tags

__all__ = ["WARMUP_S", "GoldenBuilder"]

log = logging.getLogger(__name__)

# the golden actor's warm-up when some container has no wakeup probe
WARMUP_S = 20.0
_RETRY_FIRST_S = 0.2
_RETRY_MAX_S = 5.0
_MAX_ERROR = 4096


class _Failed(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.text = f"{reason}: {detail}"


def _truncate(text: str) -> str:
    data = text.encode()[:_MAX_ERROR]
    return data.decode(errors="ignore")


class GoldenBuilder:
    def __init__(
        self,
        shared: Shared,
        *,
        atespaces: Atespaces,
        actors: Actors,
        tags: Tags,
        resume: Resume,
        parking: Parking,
    ) -> None:
        self.shared = shared
        self.atespaces = atespaces
        self.actors = actors
        self.tags = tags
        self.resume = resume
        self.parking = parking
        self._tasks: dict[str, asyncio.Task[None]] = {}  # template uid -> its build

    def build(self, record: TemplateRecord) -> None:
        """Start ``record``'s build unless it is done or already running."""
        if record.golden_tag or record.golden_error or record.meta.uid in self._tasks:
            return
        task = asyncio.get_running_loop().create_task(self._run(record.meta.key, record.meta.uid))
        self._tasks[record.meta.uid] = task
        task.add_done_callback(lambda _: self._tasks.pop(record.meta.uid, None))

    def start_all(self) -> None:
        for record in list(self.shared.state.templates.values()):
            self.build(record)

    async def cancel(self, record: TemplateRecord) -> None:
        task = self._tasks.pop(record.meta.uid, None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def stop(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def wait(self, record: TemplateRecord) -> None:
        """Until ``record``'s build ends (tests, `local up`'s first template)."""
        task = self._tasks.get(record.meta.uid)
        if task is not None:
            await asyncio.shield(task)

    # ---------------------------------------------------------------- the loop
    async def _run(self, key: str, uid: str) -> None:
        delay = _RETRY_FIRST_S
        while True:
            record = self.shared.state.templates.get(key)
            if record is None or record.meta.uid != uid:
                return
            if record.golden_tag or record.golden_error:
                return
            try:
                async with self.shared.locks.lock(f"template:{key}", f"ActorTemplate {key}"):
                    wait = await self._pass(record)
            except _Failed as failed:
                log.warning("golden build of %s failed: %s", key, failed.text)
                self.shared.state.save(record, golden_error=_truncate(failed.text))
                return
            except AteapiError as exc:
                log.info("golden build of %s: %s; retrying in %.1f s", key, exc.message, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, _RETRY_MAX_S)
                continue
            delay = _RETRY_FIRST_S
            if wait is None:
                return
            if wait > 0:
                await asyncio.sleep(wait)

    async def _pass(self, record: TemplateRecord) -> float | None:
        """One step; the seconds until the next pass, or None when the build is done."""
        shared = self.shared
        golden = f"{GOLDEN_ATESPACE}/{record.meta.uid}"
        tag = shared.state.tags.get(golden)
        if tag is not None:
            if tag.template_uid != record.meta.uid or tag.source_actor != golden:
                raise _Failed(
                    "GoldenTagConflict", "golden tag belongs to another actor or template"
                )
            if tag.snapshot is not None and tag.snapshot.completed("DURABLE") is not None:
                await self._save(record, golden)
                return None
            await self.tags.remove(tag)
            return 0.0
        actor = shared.state.actors.get(golden)
        if actor is None:
            self.atespaces.ensure(GOLDEN_ATESPACE)
            try:
                self.actors.insert(GOLDEN_ATESPACE, record.meta.uid, record, source=None)
            except AteapiError as exc:
                if exc.code == grpc.StatusCode.INVALID_ARGUMENT:
                    raise _Failed(
                        "GoldenActorInvalid", f"creating golden actor: {exc.message}"
                    ) from exc
                raise
            return 0.0
        if actor.state == CRASHED:
            detail = "golden actor crashed before its snapshot was taken"
            if actor.crash_message:
                detail += f": {actor.crash_message}"
            raise _Failed("GoldenActorCrashed", detail)
        if actor.state in (SUSPENDED, RESUMING):
            own = actor.latest_durable()
            if actor.state == SUSPENDED and own is not None and own.owner == "ACTOR":
                await self._tag(golden)
                return 0.0
            await self.resume.run(golden)
            warmup = self._warmup(record)
            shared.state.save(record, snapshot_time=shared.clock() + warmup)
            return warmup
        if actor.state == RUNNING:
            current = shared.state.templates[record.meta.key]
            if not current.snapshot_time:
                warmup = self._warmup(record)
                shared.state.save(current, snapshot_time=shared.clock() + warmup)
                return warmup
            remaining = current.snapshot_time - shared.clock()
            if remaining > 0:
                return remaining
            await self.parking.suspend_key(golden)
            await self._tag(golden)
            return 0.0
        if actor.state == SUSPENDING:
            await self.parking.suspend_key(golden)
            await self._tag(golden)
            return 0.0
        raise _Failed(
            "GoldenActorUnexpectedState",
            f"golden actor in unexpected state ACTOR_STATE_{actor.state}",
        )

    @staticmethod
    def _warmup(record: TemplateRecord) -> float:
        from gym_substrate.ateapi import ateapi_pb2 as pb

        template = pb.ActorTemplate.FromString(record.message)
        probed = all(c.HasField("wakeup_probe") for c in template.containers)
        return 0.0 if probed else WARMUP_S

    async def _tag(self, golden: str) -> None:
        await self.tags.insert(golden, golden, "PUBLISHED")

    async def _save(self, record: TemplateRecord, golden: str) -> None:
        actor = self.shared.state.actors.get(golden)
        if actor is not None:
            await self.actors.remove(actor)
        current = self.shared.state.templates.get(record.meta.key)
        if current is not None and current.meta.uid == record.meta.uid:
            self.shared.state.save(current, golden_tag=golden)
            kick_warm_pool(self.shared)
            log.info("golden tag of %s: %s", record.meta.key, golden)
