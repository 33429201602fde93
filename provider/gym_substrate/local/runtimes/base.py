"""The seam between the local control plane and whatever runs an actor's sandbox.

This module is the contract only (``SandboxRuntime`` and the values it trades); it imports no
runtime, and the runtimes import it. ``runtimes/__init__.py`` picks and builds one.

The control plane (``local/control/``) owns every decision Substrate's ateapi makes: which slot
an actor gets, which snapshot it resumes from, where a snapshot is written, and what the SQLite
record says. A runtime only does what atelet + ateom do on a node: boot, checkpoint, restore,
upload a paused checkpoint, kill. Keeping that split means the ``process`` and ``gvisor``
runtimes cannot disagree about lifecycle semantics, and a runtime is testable against a fake
control plane and vice versa.

Contract every runtime honours:

Directories
    * ``RuntimeConfig.runtime_dir`` belongs to the runtime alone (runsc ``--root``, bundles, logs,
      per-actor working folders). Nothing else writes there.
    * Snapshot directories (``dest`` arguments) are chosen by the control plane: pause snapshots
      under ``<state_dir>/snapshots/local/``, suspend snapshots under the template's storage
      location as ``<location>/atespaces/<atespace>/actors/<uid>/<RFC3339>-<rand>/``, tags'
      copies as ``<location>/atespaces/<atespace>/tags/<uid>/``. The directory does not exist when
      the call starts (its parent does); the runtime creates it and fills it. On failure the
      control plane removes it, so a runtime need not clean a half-written ``dest``. The control
      plane deletes snapshot directories; a runtime never does (``upload`` may consume the
      local snapshot it is given).
    * A durable snapshot (EXTERNAL, and a TAG copy of one) is self-contained: the control plane
      copies it into a tag and restores it into another actor of the same template.

Identity and addresses
    * ``handle`` is an opaque string the runtime invents (a runsc container id, ``pid:starttime``);
      the control plane stores it in SQLite and hands it back to ``stop``/``checkpoint``/
      ``adopt``/``is_alive``, also after a control-plane restart. Handles and every host-wide name
      a runtime creates (netns, veth, container ids, cgroups) start with ``RuntimeConfig.instance``
      so two backends on one machine never collide and ``cleanup()`` finds exactly its own.
    * ``address`` is where the actor's agent answers HTTP, the router's upstream: a bare IPv4
      address with the agent on port 80, or ``ip:port`` for a process runtime that may not bind
      port 80. The IP is the slot's ``worker_ip``.
    * The agent must be able to learn its actor id at request time: gVisor bind-mounts
      ``/run/ate/actor-id`` (rebuilt on every start/restore, as atelet does); the process runtime
      sets ``SANDBOX_AGENT_ACTOR_ID``.

Slots
    * ``RuntimeConfig.workers`` slots are numbered 0..workers-1 and fixed for the instance's life
      (the control plane groups them into workers of several actors each).

Calls
    * ``start`` returns only once the template's wakeup probe answers 200 on ``address`` (or at
      once when it has none), or raises ``RuntimeFailure`` after ``timeout_s``, having killed
      what it started.
    * ``checkpoint`` always ends with the sandbox no longer running and holding no slot resources
      (a LOCAL one may leave it stopped or frozen off its slot, as ``retained_handle``);
      on failure it raises ``RuntimeFailure`` (and the sandbox counts as lost: gVisor kills a
      sandbox whose checkpoint failed).
    * Idempotent: ``stop`` (an unknown or already-dead handle is fine), ``sweep``, ``cleanup``,
      ``forget_actor``, ``open``, ``close``.
    * Every method may block for seconds; runtimes run blocking work off the event loop.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

from gym_substrate.core.procfs import pss_bytes

__all__ = [
    "ActorSpec",
    "CheckpointResult",
    "NothingToPark",
    "RETAINED_MARKERS",
    "Rootfs",
    "RuntimeConfig",
    "RuntimeFailure",
    "SandboxRuntime",
    "Slot",
    "SnapshotKind",
    "SnapshotRef",
    "StartedSandbox",
    "TemplateSpec",
    "pss_bytes",
]


class NothingToPark:
    """``park_paused`` for a runtime whose pauses leave nothing that must become an image (the
    process runtime: a paused agent's files are on disk, its stopped process ends at down)."""

    async def park_paused(self) -> None:
        return None


class RuntimeFailure(Exception):
    """A sandbox operation failed; the message says what and, where known, how to fix it."""

    def __init__(self, message: str, *, sandbox_lost: bool = False) -> None:
        super().__init__(message)
        self.sandbox_lost = sandbox_lost


# A LOCAL snapshot folder whose sandbox a runtime keeps alive names that sandbox, so a restart
# that finds the folder committed but not yet recorded keeps the sandbox: (file, key) pairs.
RETAINED_MARKERS = (("manifest.json", "handle"), ("frozen.json", "sandbox"))


@dataclass(frozen=True)
class Rootfs:
    """Where a sandbox's root filesystem comes from.

    ``host``: the host's ``/`` read-only under an in-memory overlay (gVisor
    ``--overlay2=root:memory``), the process runtime's bubblewrap binding it read-only.
    ``directory``: ``path`` (absolute, existing) as ``/``, the same way; the process runtime
    can give that only under bubblewrap. ``binds``: (host file or folder, path inside) pairs
    bound read-only into the sandbox, e.g. the static agent (``rootfs.AGENT_PATH``) or the
    unpacked agent's folder; the path inside must exist in the tree.
    """

    kind: Literal["host", "directory"]
    path: Path | None = None
    binds: tuple[tuple[Path, str], ...] = ()


@dataclass(frozen=True)
class TemplateSpec:
    """What the runtime runs for an ActorTemplate (its one container, resolved to this machine).

    ``readyz_path`` None means the template has no wakeup probe: a start returns once the
    process runs, as ResumeActor returns once the container has started upstream.
    """

    atespace: str
    name: str
    command: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    readyz_path: str | None
    readyz_port: int
    snapshot_location: Path
    rootfs: Rootfs
    probe_timeout_s: float = 30.0

    @property
    def key(self) -> str:
        return f"{self.atespace}/{self.name}"


@dataclass(frozen=True)
class ActorSpec:
    atespace: str
    actor_id: str
    template: TemplateSpec

    @property
    def key(self) -> str:
        return f"{self.atespace}/{self.actor_id}"


@dataclass(frozen=True)
class Slot:
    """One worker of the pool: index 0..workers-1. A running actor holds exactly one."""

    index: int

    @property
    def name(self) -> str:
        return f"worker-{self.index}"


class SnapshotKind(enum.Enum):
    LOCAL = "local"  # PauseActor: node-local disk
    EXTERNAL = "external"  # SuspendActor: the actor's own, in the template's snapshot store
    TAG = "tag"  # a tag's copy (a golden tag's too): restorable into any actor of the template


@dataclass(frozen=True)
class SnapshotRef:
    kind: SnapshotKind
    path: Path


@dataclass(frozen=True)
class StartedSandbox:
    handle: str
    address: str  # bare IP (agent on port 80), else "ip:port"; becomes Actor.ateom_pod_ip
    memory_restored: bool  # True when process memory came back from a snapshot


@dataclass(frozen=True)
class CheckpointResult:
    snapshot: SnapshotRef
    # (kind, bytes) per checkpoint file, e.g. ("pages", 2900000); feeds atelet.snapshot.size.
    files: tuple[tuple[str, int], ...] = ()
    memory_kept: bool = True  # False when a resume from it restarts processes (process runtime)
    # A sandbox left alive (stopped) by a LOCAL checkpoint, e.g. the process runtime's SIGSTOPped
    # agent: the control plane keeps it out of ``sweep`` while PAUSED and ``stop``s it on
    # DeleteActor. gVisor leaves it None (its sandbox exits after checkpointing).
    retained_handle: str | None = None

    @property
    def size_bytes(self) -> int:
        return sum(size for _, size in self.files)


@dataclass(frozen=True)
class RuntimeConfig:
    runtime_dir: Path  # owned by the runtime alone
    instance: str  # short [a-z0-9] prefix unique per state dir, stable across restarts
    workers: int
    extra: Mapping[str, str] = field(default_factory=dict)


@runtime_checkable
class SandboxRuntime(Protocol):
    """What the control plane needs from a sandbox runtime. See the module docstring."""

    name: str  # "process" | "gvisor"
    isolates: bool  # False: the actor can touch the host (process runtime)
    memory_survives_suspend: bool

    def worker_ip(self, slot: Slot) -> str:
        """The bare IP of ``slot`` (its worker pod's IP in ListWorkers), once ``open``."""
        ...

    def warning(self) -> str | None:
        """A line the CLI prints at ``up`` (e.g. the process runtime isolates nothing)."""
        ...

    async def open(self) -> None:
        """Prepare host-wide resources (per-slot netns, ...); once per control-plane start."""
        ...

    async def close(self) -> None:
        """Release what ``open`` holds without touching running sandboxes (they get adopted)."""
        ...

    async def start(
        self,
        actor: ActorSpec,
        slot: Slot,
        source: SnapshotRef | None,
        *,
        timeout_s: float,
    ) -> StartedSandbox:
        """Run ``actor`` on ``slot``: restore ``source``, or cold boot when it is None."""
        ...

    async def checkpoint(
        self, actor: ActorSpec, handle: str, kind: SnapshotKind, dest: Path
    ) -> CheckpointResult:
        """Checkpoint a running sandbox into ``dest`` (LOCAL for pause, EXTERNAL for suspend).

        The sandbox is stopped afterwards and its slot resources are free.
        """
        ...

    async def upload(
        self, actor: ActorSpec, local: SnapshotRef, retained_handle: str, dest: Path
    ) -> CheckpointResult:
        """SuspendActor of a PAUSED actor: make its node-local snapshot (and the sandbox a LOCAL
        checkpoint left, if any) a durable one in ``dest``; ``local`` may be consumed."""
        ...

    async def stop(self, handle: str) -> None:
        """Kill the sandbox now (no checkpoint). Idempotent."""
        ...

    async def is_alive(self, handle: str) -> bool: ...

    async def adopt(
        self, actor: ActorSpec, slot: Slot, handle: str, address: str
    ) -> StartedSandbox | None:
        """Take over a sandbox found after a control-plane restart; None if it is gone."""
        ...

    async def sweep(self, keep: Collection[str]) -> list[str]:
        """Kill every sandbox of this instance whose handle is not in ``keep``; describe each."""
        ...

    async def forget_actor(self, actor: ActorSpec) -> None:
        """Drop per-actor files the runtime keeps (DeleteActor). Idempotent."""
        ...

    async def memory_bytes(self, handle: str) -> int | None:
        """Memory the running sandbox uses (PSS/RSS summed), for `local bench`; None if unknown."""
        ...

    async def park_paused(self) -> None:
        """`local down`, before sandboxes are stopped: make every PAUSED actor's LOCAL snapshot
        outlive them (gVisor's frozen tier checkpoints its frozen sandboxes into their folders;
        nothing to do where a pause already wrote an image)."""
        ...

    async def cleanup(self) -> list[str]:
        """Remove every sandbox and host-wide resource of this instance (netns, veths, mounts,
        scratch dirs). Per-actor data a PAUSED/SUSPENDED actor's snapshot still needs (e.g. the
        process runtime's working folders) stays until ``forget_actor``."""
        ...

    async def leftovers(self) -> list[str]:
        """Describe anything of this instance still on the host; [] after ``cleanup``."""
        ...
