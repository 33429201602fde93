"""One lifecycle operation per actor at a time, each run to completion even if its caller leaves.

Resume, pause, suspend and delete are Substrate workflows: once started they finish, so a client
that disconnects mid-restore does not leave a half-started sandbox behind. A second operation on
an actor that is busy is refused with ABORTED (ateapi's "another operation is in progress"); the
router waits for the one in flight (`wait_idle`) instead of backing off blindly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc

from gym_substrate.local.errors import ApiError

__all__ = ["Workflows"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class Workflows:
    def __init__(self) -> None:
        self._busy: set[str] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._inflight: dict[str, asyncio.Task[Any]] = {}

    def busy(self, key: str | None = None) -> bool:
        """True while an operation holds actor ``key`` (any actor when None)."""
        return bool(self._busy) if key is None else key in self._busy

    def _claim(self, key: str) -> None:
        if key in self._busy:
            raise ApiError(
                grpc.StatusCode.ABORTED, "another operation is in progress for this actor"
            )
        self._busy.add(key)

    @contextlib.asynccontextmanager
    async def lock(self, key: str) -> AsyncIterator[None]:
        """Hold ``key`` for an operation the caller runs inline (ABORTED when it is busy)."""
        self._claim(key)
        try:
            yield
        finally:
            self._busy.discard(key)

    async def run_detached(self, key: str, work: Callable[[], Awaitable[T]]) -> T:
        """Run a lifecycle workflow to completion even if the caller goes away.

        The actor is marked busy before the task is created, not when it first runs: a second
        call in the same loop turn is refused here instead of replacing this task's `_inflight`
        entry (which `wait_idle` relies on). Busy and `_inflight` are released together by the
        task's own done-callback, which runs before the caller sees the result.
        """
        self._claim(key)

        async def run() -> T:
            return await work()

        try:
            task = asyncio.get_running_loop().create_task(run())
        except BaseException:
            self._busy.discard(key)
            raise
        self._tasks.add(task)
        self._inflight[key] = task

        def finished(done: asyncio.Task[T]) -> None:
            self._tasks.discard(done)
            if self._inflight.get(key) is done:
                del self._inflight[key]
                self._busy.discard(key)

        task.add_done_callback(finished)
        return await asyncio.shield(task)

    async def wait_idle(self, key: str, timeout_s: float) -> bool:
        """Wait until the operation in flight on ``key`` (if any) ends; True if one was waited."""
        task = self._inflight.get(key)
        if task is None:
            return False
        await asyncio.wait([task], timeout=timeout_s)
        return True

    async def drain(self, timeout_s: float = 15.0) -> None:
        """Let in-flight workflows finish; cancel what is still running after ``timeout_s``."""
        if not self._tasks:
            return
        _, pending = await asyncio.wait(list(self._tasks), timeout=timeout_s)
        for task in pending:
            task.cancel()
        if pending:
            log.warning("cancelled %d lifecycle operations still running at shutdown", len(pending))
            await asyncio.wait(pending, timeout=5)
