"""The control plane's records: what SQLite stores and the in-memory mirror holds.

Plain frozen dataclasses, so a record handed to a caller never changes under it; every write makes a
new one with a higher `Meta.version` (the ateapi precondition). States are
`gym_substrate.core.states`' names (`RUNNING`, `CRASHED`, ...), re-exported here for the backend's
modules. What only the local backend needs (sandbox handles, snapshot folders, runtime slots) sits
beside the API fields and never reaches a client.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from gym_substrate.core.states import (
    CRASHED,
    DELETING,
    HOLDING_STATES,
    PAUSED,
    PAUSING,
    RESUMING,
    REVERTING,
    RUNNING,
    STATES,
    SUSPENDED,
    SUSPENDING,
)

__all__ = [
    "CRASHED",
    "DELETING",
    "DRAINING",
    "GOLDEN_ATESPACE",
    "HOLDING_STATES",
    "PAUSED",
    "PAUSING",
    "RESUMING",
    "REVERTING",
    "RUNNING",
    "STATES",
    "SUSPENDED",
    "SUSPENDING",
    "WORKER_ACTIVE",
    "ActorRecord",
    "Fidelity",
    "AtespaceRecord",
    "Meta",
    "SnapshotRecord",
    "Storage",
    "TagRecord",
    "TemplateRecord",
    "WorkerRecord",
    "new_meta",
    "ref_key",
]

# the reserved atespace of the templates' golden actors and golden tags
GOLDEN_ATESPACE = "ate-golden"


WORKER_ACTIVE = "ACTIVE"
DRAINING = "DRAINING"

Durability = Literal["LOCAL", "DURABLE"]
Progress = Literal["IN_PROGRESS", "COMPLETED"]
Owner = Literal["ACTOR", "TAG"]
Fidelity = Literal["MEMORY", "ROOTFS", "VOLUMES"]


def ref_key(atespace: str, name: str) -> str:
    """`atespace/name`: how a resource is keyed, shown and referred to in config."""
    return f"{atespace}/{name}"


@dataclass(frozen=True)
class Meta:
    """`ResourceMetadata`: the caller names it, the server owns uid, version and the times."""

    atespace: str
    name: str
    uid: str
    version: int
    create_time: float
    update_time: float

    @property
    def key(self) -> str:
        return ref_key(self.atespace, self.name)

    def bumped(self, now: float | None = None) -> Meta:
        return replace(self, version=self.version + 1, update_time=now or time.time())


def new_meta(atespace: str, name: str, now: float | None = None) -> Meta:
    stamp = now or time.time()
    return Meta(atespace, name, str(uuid.uuid4()), 1, stamp, stamp)


@dataclass(frozen=True)
class Storage:
    """One place a snapshot generation is kept: a folder on this machine."""

    durability: Durability
    status: Progress
    path: str
    fidelity: Fidelity = "MEMORY"  # what it holds: the runtime's memory, or files only


@dataclass(frozen=True)
class SnapshotRecord:
    """One generation of an actor's or a tag's snapshot (`Snapshot`)."""

    generation: int
    owner: Owner
    template_uid: str
    storage: tuple[Storage, ...]

    def completed(self, durability: Durability | None = None) -> Storage | None:
        """The generation's COMPLETED storage of ``durability`` (LOCAL first when None)."""
        order: tuple[Durability, ...] = (
            ("LOCAL", "DURABLE") if durability is None else (durability,)
        )
        for wanted in order:
            for stored in self.storage:
                if stored.durability == wanted and stored.status == "COMPLETED":
                    return stored
        return None


@dataclass(frozen=True)
class AtespaceRecord:
    meta: Meta


@dataclass(frozen=True)
class TemplateRecord:
    """An ActorTemplate: the message as created (spec only) and what the runtime runs."""

    meta: Meta
    message: bytes  # the ActorTemplate as accepted, metadata and status cleared
    runtime_spec: dict[str, Any]  # templates.template_to_json of the resolved TemplateSpec
    golden_tag: str = ""  # "ate-golden/<uid>" once built
    golden_error: str = ""  # "<Reason>: <detail>", terminal
    snapshot_time: float = 0.0  # when the golden actor's warm-up ends


@dataclass(frozen=True)
class TagRecord:
    meta: Meta
    scope: Literal["ATESPACE", "PUBLISHED"]
    source_actor: str  # atespace/name
    template_uid: str
    snapshot: SnapshotRecord | None  # None until the copy has a folder


@dataclass(frozen=True)
class ActorRecord:
    meta: Meta
    template: str  # atespace/name of its ActorTemplate
    template_uid: str  # the template it was created under (templates are immutable)
    state: str = SUSPENDED
    worker_selector: dict[str, str] = field(default_factory=dict)
    source_tag: str = ""  # atespace/name, set once at creation
    snapshots: tuple[SnapshotRecord, ...] = ()
    last_generation: int = 0
    crash_message: str = ""
    crash_time: float = 0.0
    # placement: the worker (its name), the runtime slot, and the worker's epoch at placement
    worker: str = ""
    slot: int | None = None
    worker_epoch: int = 0
    # the running sandbox: runtime handle and the agent's address (bare IP, or ip:port)
    handle: str = ""
    address: str = ""
    # a sandbox a LOCAL checkpoint left alive (the process runtime's stopped agent)
    retained_handle: str = ""

    @property
    def key(self) -> str:
        return self.meta.key

    @property
    def atespace(self) -> str:
        return self.meta.atespace

    @property
    def name(self) -> str:
        return self.meta.name

    def latest(self) -> SnapshotRecord | None:
        """The newest generation with a completed storage, which a resume restores."""
        for snapshot in sorted(self.snapshots, key=lambda s: s.generation, reverse=True):
            if snapshot.completed() is not None:
                return snapshot
        return None

    def latest_durable(self) -> SnapshotRecord | None:
        """The newest generation stored durably: what a revert goes back to, a tag copies."""
        for snapshot in sorted(self.snapshots, key=lambda s: s.generation, reverse=True):
            if snapshot.completed("DURABLE") is not None:
                return snapshot
        return None


@dataclass(frozen=True)
class WorkerRecord:
    """A worker 'pod': `capacity` runtime slots from `first_slot` on, under one name."""

    meta: Meta
    index: int
    pod_uid: str
    first_slot: int
    capacity: int
    labels: dict[str, str] = field(default_factory=dict)
    state: str = WORKER_ACTIVE
    epoch: int = 1
    observed_epoch: int = 1

    @property
    def slots(self) -> range:
        return range(self.first_slot, self.first_slot + self.capacity)
