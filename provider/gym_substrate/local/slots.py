"""The worker pool: a fixed number of slots, each held by at most one sandbox at a time.

A slot's holder is an actor key (``atespace/actor_id``) while that actor is RESUMING through
SUSPENDING (a resume that failed keeps it, as ateapi's AssignWorker leaves the worker assigned),
or ``golden:<template>`` while a golden snapshot is taken. Each slot is a "worker"
to ateapi clients (``ListWorkers``): a stable uid and a version that bumps on every change of
holder, stored so both survive a restart.
"""

from __future__ import annotations

import dataclasses

import grpc

from gym_substrate.local.errors import ApiError
from gym_substrate.local.runtimes.base import Slot
from gym_substrate.local.store import Store, WorkerRecord

__all__ = ["WORKER_NAMESPACE", "WORKER_POOL", "SlotPool"]

WORKER_POOL = "local"  # the ``ate.dev/worker-pool`` label and Actor.worker_pool_name
WORKER_NAMESPACE = "local"  # where the workers "run", as Actor.ateom_pod_namespace


class SlotPool:
    def __init__(self, store: Store, size: int, instance: str) -> None:
        if size < 1:
            raise ValueError("workers must be at least 1")
        self.store = store
        self.size = size
        self.instance = instance
        self._holders: list[str | None] = [None] * size
        self._workers: list[WorkerRecord] = []

    def load(self) -> None:
        """Read (or create) the workers' stored uids and versions; every slot starts free."""
        self._workers = self.store.workers(self.size)

    def take(self, owner: str) -> int:
        """Hold the first free slot for ``owner``; FAILED_PRECONDITION when none is free."""
        for index, holder in enumerate(self._holders):
            if holder is None:
                self._holders[index] = owner
                self._bump(index)
                return index
        raise ApiError(grpc.StatusCode.FAILED_PRECONDITION, "no free workers available")

    def free(self, index: int | None) -> None:
        """Release a slot (nothing for None, an out-of-range or an already free slot)."""
        if index is not None and 0 <= index < self.size and self._holders[index] is not None:
            self._holders[index] = None
            self._bump(index)

    def holder(self, index: int) -> str | None:
        """The key of what holds slot ``index`` (None when free or out of range)."""
        return self._holders[index] if 0 <= index < self.size else None

    def is_free(self, index: int) -> bool:
        return 0 <= index < self.size and self._holders[index] is None

    def adopt(self, index: int, owner: str) -> None:
        """Mark a free slot as held by a sandbox that kept running across a restart."""
        self._holders[index] = owner

    def uid(self, index: int) -> str:
        return self._workers[index].uid

    def pod_name(self, index: int) -> str:
        return f"{self.instance}-{Slot(index).name}"

    def counts(self) -> tuple[int, int]:
        """(busy, free) slots, for the workers gauge."""
        busy = sum(1 for holder in self._holders if holder is not None)
        return busy, self.size - busy

    def entries(self) -> list[tuple[WorkerRecord, str | None]]:
        """Each worker with the key of what holds it (None when free)."""
        return [(worker, self._holders[index]) for index, worker in enumerate(self._workers)]

    def _bump(self, index: int) -> None:
        version = self.store.bump_worker(index)
        self._workers[index] = dataclasses.replace(self._workers[index], version=version)
