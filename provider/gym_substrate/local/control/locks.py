"""The leases of ateapi's workflows: one per resource, refused while held.

Substrate runs Resume (off its fast path), Suspend, Pause, Revert, Delete and CreateTag under a
lease named after the actor (`lease:actor:<atespace>:<name>`), and template deletes and golden
builds under the template's (workflow.go `acquireLease`). A second operation on a held lease is
refused with ABORTED "another operation is in progress for this <subject>"; Create, Update and
the reads take none.

A resume runs in its caller's task (`lock`): the RPC's cancellation (a client deadline) stops it
part-way, as a real workflow stops when its request context ends. A checkpoint runs in a task of
its own (`run_detached`): the runtimes cannot stop a checkpoint half-way without losing the
sandbox, so it finishes, holding the lock, after its caller has gone. The router waits for the
operation in flight (`wait_idle`) instead of backing off blindly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc

from gym_substrate.local.errors import AteapiError

__all__ = ["Workflows"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class Workflows:
    def __init__(self) -> None:
        # lease key -> a future done when its lease is released
        self._held: dict[str, asyncio.Future[None]] = {}
        self._holders: dict[str, asyncio.Task[Any] | None] = {}

    def busy(self, actor_id: str | None = None) -> bool:
        """True while an operation holds ``actor_id``'s lock (any actor's when None)."""
        return bool(self._held) if actor_id is None else actor_id in self._held

    def _claim(self, actor_id: str, holder: asyncio.Task[Any] | None, subject: str) -> None:
        if actor_id in self._held:
            raise AteapiError(
                grpc.StatusCode.ABORTED, f"another operation is in progress for this {subject}"
            )
        self._held[actor_id] = asyncio.get_running_loop().create_future()
        self._holders[actor_id] = holder

    def _release(self, actor_id: str) -> None:
        self._holders.pop(actor_id, None)
        released = self._held.pop(actor_id, None)
        if released is not None and not released.done():
            released.set_result(None)

    @contextlib.asynccontextmanager
    async def lock(self, actor_id: str, subject: str = "actor") -> AsyncIterator[None]:
        """Hold ``actor_id``'s lock while the caller's task runs the block (ABORTED if held)."""
        self._claim(actor_id, asyncio.current_task(), subject)
        try:
            yield
        finally:
            self._release(actor_id)

    def run_detached(
        self, actor_id: str, work: Callable[[], Awaitable[T]], subject: str = "actor"
    ) -> asyncio.Task[T]:
        """Take ``actor_id``'s lock and run ``work`` in its own task, which releases the lock.

        The lock is claimed before the task is created, not when it first runs, so a second
        call in the same loop turn is refused here.
        """
        self._claim(actor_id, None, subject)

        async def run() -> T:
            return await work()

        try:
            task = asyncio.get_running_loop().create_task(run())
        except BaseException:
            self._release(actor_id)
            raise
        self._holders[actor_id] = task
        task.add_done_callback(lambda _: self._release(actor_id))
        return task

    async def wait_idle(self, actor_id: str, timeout_s: float) -> bool:
        """Wait until the operation holding ``actor_id`` (if any) ends; True if one was waited."""
        held = self._held.get(actor_id)
        if held is None:
            return False
        await asyncio.wait([held], timeout=timeout_s)
        return True

    async def drain(self, timeout_s: float = 15.0) -> None:
        """Let operations in flight finish; cancel what still holds a lock after ``timeout_s``."""
        if not self._held:
            return
        _, pending = await asyncio.wait(list(self._held.values()), timeout=timeout_s)
        if not pending:
            return
        holders = [task for task in self._holders.values() if task is not None]
        for task in holders:
            task.cancel()
        log.warning("cancelled %d lifecycle operations still running at shutdown", len(holders))
        if self._held:
            await asyncio.wait(list(self._held.values()), timeout=5)
