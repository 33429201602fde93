"""The worker pool: N worker 'pods', each holding up to K actors, over N*K runtime slots.

A worker is what ateapi's scheduler places actors on (scheduling.go): it has room while its
allocated actors are fewer than its capacity, and placement takes two eligible workers with
room at random and keeps the less loaded one. No room anywhere is RESOURCE_EXHAUSTED
`no free workers available`. Each actor still runs in a runtime slot of its own (its own
network namespace and address under gVisor): slots `i*K .. i*K+K-1` belong to worker i, whose
IP is its first slot's. Workers are stored with their uid, version and epoch, so both survive a
restart; their names are opaque (the pod uid, as upstream's syncer names them).
"""

from __future__ import annotations

import dataclasses
import logging
import random
import socket
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import grpc

from gym_substrate.local.control.records import (
    DRAINING,
    WORKER_ACTIVE,
    WorkerRecord,
    new_meta,
)
from gym_substrate.local.control.store import StateFolderFull, Store
from gym_substrate.local.errors import AteapiError
from gym_substrate.local.runtimes.base import SandboxRuntime, Slot

__all__ = ["NO_ROOM", "WORKER_NAMESPACE", "WORKER_POOL", "Placement", "WorkerPool"]

WORKER_POOL = "local"  # the WorkerPool name and the `ate.dev/worker-pool` label
WORKER_NAMESPACE = "local"  # where the worker pods "run"
NO_ROOM = "no free workers available"

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Placement:
    worker: WorkerRecord
    slot: int


class WorkerPool:
    def __init__(
        self,
        store: Store,
        runtime: SandboxRuntime,
        *,
        instance: str,
        workers: int,
        per_worker: int,
        clock: Callable[[], float],
        rng: random.Random | None = None,
    ) -> None:
        if workers < 1 or per_worker < 1:
            raise ValueError("a pool needs at least one worker of at least one actor")
        self.store = store
        self.runtime = runtime
        self.instance = instance
        self.count = workers
        self.per_worker = per_worker
        self.clock = clock
        self.rng = rng or random.Random()
        self.node_name = socket.gethostname()
        self.labels = {"ate.dev/worker-pool": WORKER_POOL, "runtime": runtime.name}
        self._workers: dict[int, WorkerRecord] = {}
        self._holders: dict[int, str] = {}  # runtime slot -> actor key
        self._removed: dict[int, WorkerRecord] = {}  # DeleteWorker'd, until re-created
        # calls a worker's epoch rise makes (the control plane crashes what it held)
        self.on_epoch: list[Callable[[WorkerRecord], None]] = []

    @property
    def slots(self) -> int:
        return self.count * self.per_worker

    # ---------------------------------------------------------------- start
    def load(self) -> None:
        """Read the stored workers, make the pool `count` workers of `per_worker` actors."""
        stored = {w.index: w for w in self.store.workers()}
        self.store.delete_workers_from(self.count)
        for index in range(self.count):
            worker = stored.get(index)
            if worker is None:
                pod_uid = str(uuid.uuid4())
                meta = dataclasses.replace(
                    new_meta("", pod_uid, self.clock()), uid=str(uuid.uuid4())
                )
                worker = WorkerRecord(
                    meta,
                    index,
                    pod_uid,
                    index * self.per_worker,
                    self.per_worker,
                    dict(self.labels),
                )
            elif worker.capacity != self.per_worker or worker.first_slot != index * self.per_worker:
                worker = dataclasses.replace(
                    worker,
                    meta=worker.meta.bumped(self.clock()),
                    capacity=self.per_worker,
                    first_slot=index * self.per_worker,
                )
            self._workers[index] = worker
            self.store.put_worker(worker)

    # ---------------------------------------------------------------- reads
    def all(self) -> list[WorkerRecord]:
        return [self._workers[i] for i in sorted(self._workers)]

    def by_name(self, name: str) -> WorkerRecord | None:
        return next((w for w in self._workers.values() if w.meta.name == name), None)

    def get(self, name: str) -> WorkerRecord:
        worker = self.by_name(name)
        if worker is None:
            raise AteapiError(grpc.StatusCode.NOT_FOUND, f"Worker {name} not found")
        return worker

    def of_slot(self, slot: int) -> WorkerRecord | None:
        return self._workers.get(slot // self.per_worker)

    def pod_name(self, worker: WorkerRecord) -> str:
        return f"{self.instance}-worker-{worker.index}"

    def ip(self, worker: WorkerRecord) -> str:
        return self.runtime.worker_ip(Slot(worker.first_slot))

    def holders(self, worker: WorkerRecord) -> dict[int, str]:
        """The worker's busy slots and the actor key holding each."""
        return {s: k for s, k in self._holders.items() if s in worker.slots}

    def allocated(self, worker: WorkerRecord) -> int:
        return sum(1 for slot in self._holders if slot in worker.slots)

    def holder(self, slot: int) -> str | None:
        return self._holders.get(slot)

    def counts(self) -> tuple[int, int]:
        """(busy, free) slots, for the workers gauge."""
        busy = len(self._holders)
        return busy, sum(w.capacity for w in self._workers.values()) - busy

    # ---------------------------------------------------------------- placement
    def _eligible(self, worker: WorkerRecord, selectors: Sequence[Mapping[str, str]]) -> bool:
        if worker.state != WORKER_ACTIVE:
            return False
        return all(worker.labels.get(k) == v for s in selectors for k, v in s.items())

    def place(self, key: str, selectors: Sequence[Mapping[str, str]]) -> Placement:
        """Hold a slot for actor ``key`` on an eligible worker with room (power of two)."""
        candidates = [
            w
            for w in self._workers.values()
            if self._eligible(w, selectors) and self.allocated(w) < w.capacity
        ]
        if not candidates:
            raise AteapiError(grpc.StatusCode.RESOURCE_EXHAUSTED, NO_ROOM)
        if len(candidates) > 1:
            first, second = self.rng.sample(candidates, 2)
            load = {w.index: self.allocated(w) / w.capacity for w in (first, second)}
            worker = first if load[first.index] <= load[second.index] else second
        else:
            worker = candidates[0]
        slot = next(s for s in worker.slots if s not in self._holders)
        self._holders[slot] = key
        try:
            return Placement(self._bump(worker), slot)
        except BaseException:  # the worker's new version was not stored: nothing was taken
            del self._holders[slot]
            raise

    def still_hosts(self, worker_name: str, slot: int | None, key: str) -> str:
        """Why an assignment is no longer good ("" when it is): a RESUMING actor's re-entry."""
        worker = self.by_name(worker_name)
        if worker is None:
            return "assigned worker no longer exists"
        if worker.state != WORKER_ACTIVE:
            return "assigned worker is draining"
        if slot is None or slot not in worker.slots or self._holders.get(slot) != key:
            return "assigned worker no longer hosts the actor"
        return ""

    def release(self, slot: int | None, key: str) -> None:
        """Drop actor ``key``'s claim on ``slot`` (nothing if it holds none there)."""
        if slot is not None and self._holders.get(slot) == key:
            del self._holders[slot]
            worker = self.of_slot(slot)
            if worker is not None:
                try:
                    self._bump(worker)
                except StateFolderFull as exc:
                    # the slot is free all the same (holders are rebuilt from the actors at
                    # start); only the worker's version bump waits for the next stored change
                    log.warning(
                        "worker %s: slot %d freed, version not stored: %s",
                        worker.meta.name,
                        slot,
                        exc.message,
                    )

    def adopt(self, slot: int, key: str) -> bool:
        """Mark ``slot`` held by a sandbox that kept running across a restart."""
        if self.of_slot(slot) is None or slot in self._holders:
            return False
        self._holders[slot] = key
        return True

    # ---------------------------------------------------------------- writes
    def _bump(self, worker: WorkerRecord, **changes: Any) -> WorkerRecord:
        current = self._workers[worker.index]
        updated = dataclasses.replace(current, meta=current.meta.bumped(self.clock()), **changes)
        self.store.put_worker(updated)  # first: a failed write leaves the mirror as stored
        self._workers[worker.index] = updated
        return updated

    def drain(self, name: str) -> WorkerRecord:
        """DrainWorker: idempotent, leaves bound actors alone, stops new placements."""
        worker = self.get(name)
        if worker.state == DRAINING:
            return worker
        return self._bump(worker, state=DRAINING)

    def update(self, name: str, labels: Mapping[str, str], epoch: int) -> WorkerRecord:
        """UpdateWorker's mutable part: labels, and an epoch that may only rise."""
        worker = self.get(name)
        rose = epoch > worker.epoch
        worker = self._bump(worker, labels=dict(labels), epoch=max(epoch, worker.epoch))
        if rose:
            for call in self.on_epoch:
                call(worker)
            worker = self._bump(worker, observed_epoch=worker.epoch)
        return worker

    def remove(self, worker: WorkerRecord) -> WorkerRecord:
        """DeleteWorker: the worker leaves the pool (its actors were crashed already)."""
        for slot in list(self.holders(worker)):
            del self._holders[slot]
        current = self._workers.pop(worker.index)
        self._removed[worker.index] = current
        return current

    def removed_pod(self, pod_name: str) -> WorkerRecord | None:
        return next((w for w in self._removed.values() if self.pod_name(w) == pod_name), None)

    def restore(self, worker: WorkerRecord) -> WorkerRecord:
        """CreateWorker of a pod DeleteWorker took out: back in the pool under a new name."""
        worker = dataclasses.replace(worker, meta=worker.meta.bumped(self.clock()))
        self.store.put_worker(worker)
        self._removed.pop(worker.index, None)
        self._workers[worker.index] = worker
        return worker

    def record_restart(self, worker: WorkerRecord) -> WorkerRecord:
        """A worker whose sandboxes were lost while the backend was down: its epoch rises
        (the actors it held were crashed already)."""
        return self._bump(worker, epoch=worker.epoch + 1, observed_epoch=worker.epoch + 1)
