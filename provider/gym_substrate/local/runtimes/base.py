"""The seam between the local control plane and whatever runs an actor's sandbox.

This module is the contract only (``SandboxRuntime`` and the values it trades); it imports no
runtime, and the runtimes import it. ``runtimes/__init__.py`` picks and builds one.

The control plane (``lifecycle.py``) owns every decision Substrate's ateapi makes: which slot an
actor gets, which snapshot it resumes from (its latest, else the template's golden one unless
``boot``, else a cold boot), where a snapshot is written, and what the SQLite record says. A
runtime only does what atelet + ateom do on a node: boot, checkpoint, restore, kill. Keeping that
split means the ``process`` and ``gvisor`` runtimes cannot disagree about lifecycle semantics,
and a runtime is testable against a fake control plane and vice versa.

Contract every runtime honours:

Directories
    * ``RuntimeConfig.runtime_dir`` belongs to the runtime alone (runsc ``--root``, bundles, logs,
      per-actor working folders). Nothing else writes there.
    * Snapshot directories (``dest`` arguments) are chosen by the control plane: pause snapshots
      under ``<state_dir>/snapshots/local/``, suspend snapshots under the template's
      ``snapshotsConfig.location`` as ``<location>/<actor_id>/<RFC3339>-<rand>/``, golden ones as
      ``<location>/ate-golden-<template name>/<RFC3339>-<rand>/``. The directory does not exist
      when the call starts (its parent does); the runtime creates it and fills it. On failure the
      control plane removes it, so a runtime need not clean a half-written ``dest``. The control
      plane deletes snapshot directories (``DeleteActor``, superseded snapshots); a runtime never
      does.

Identity and addresses
    * ``handle`` is an opaque string the runtime invents (a runsc container id, ``pid:starttime``);
      the control plane stores it in SQLite and hands it back to ``stop``/``checkpoint``/
      ``adopt``/``is_alive``, also after a control-plane restart. Handles and every host-wide name
      a runtime creates (netns, veth, container ids, cgroups) start with ``RuntimeConfig.instance``
      so two backends on one machine never collide and ``cleanup()`` finds exactly its own.
    * ``address`` is where the actor's agent answers HTTP; it becomes the actor's
      ``ateom_pod_ip`` and the router's upstream. As on a real cluster it is a bare IPv4
      address with the agent on port 80 (the real router dials ``<ip>:80``,
      cmd/atenet/internal/router/extproc.go); only a process runtime that may not bind port 80
      records ``ip:port``. The IP is the slot's ``worker_ip`` (a pod's IP, which
      workflow_resume.go copies onto the actor at RESUMING).
    * The agent must be able to learn its actor id at request time: gVisor bind-mounts
      ``/run/ate/actor-id`` (rebuilt on every start/restore, as atelet does); the process runtime
      sets ``SANDBOX_AGENT_ACTOR_ID``.

Slots
    * ``RuntimeConfig.workers`` slots are numbered 0..workers-1 and fixed for the instance's life.

Calls
    * ``start`` returns only once the template's readyz answers 200 on ``address`` (or raises
      ``RuntimeFailure`` after ``timeout_s``, having killed what it started).
    * ``checkpoint`` always ends with the sandbox no longer running and holding no slot resources;
      on failure it raises ``RuntimeFailure`` (and the sandbox counts as lost: gVisor kills a
      sandbox whose checkpoint failed).
    * Idempotent: ``stop`` (an unknown or already-dead handle is fine), ``sweep``, ``cleanup``,
      ``forget_actor``, ``open``, ``close``. ``prepare_template`` may be called at every ``up``.
    * Every method may block for seconds; runtimes run blocking work off the event loop.
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

__all__ = [
    "ActorSpec",
    "CheckpointResult",
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


def pss_bytes(pids: Iterable[int]) -> int:
    """Proportional set size summed over ``pids`` (``smaps_rollup``), in bytes.

    Both runtimes report an actor's memory this way, so their figures compare. It reads /proc:
    call it off the event loop. Processes that vanished meanwhile count as zero.
    """
    total = 0
    for pid in pids:
        try:
            text = Path(f"/proc/{pid}/smaps_rollup").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("Pss:"):
                total += int(line.split()[1]) * 1024
                break
    return total


class RuntimeFailure(Exception):
    """A sandbox operation failed; the message says what and, where known, how to fix it."""

    def __init__(self, message: str, *, sandbox_lost: bool = False) -> None:
        super().__init__(message)
        self.sandbox_lost = sandbox_lost


@dataclass(frozen=True)
class Rootfs:
    """Where a sandbox's root filesystem comes from.

    ``host``: the host's ``/`` read-only under an in-memory overlay (gVisor
    ``--overlay2=root:memory``), the process runtime's bubblewrap binding it read-only.
    ``directory``: ``path`` (absolute, existing) as ``/``, the same way; the process runtime
    can give that only under bubblewrap. ``binds``: (host file, path inside) pairs bound
    read-only into the sandbox, e.g. the static agent (``rootfs.AGENT_PATH``); the path inside
    must exist in the tree.
    """

    kind: Literal["host", "directory"]
    path: Path | None = None
    binds: tuple[tuple[Path, str], ...] = ()


@dataclass(frozen=True)
class TemplateSpec:
    """An ActorTemplate as the runtime needs it (containers[0] only; validated by templates.py)."""

    namespace: str
    name: str
    command: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    readyz_path: str
    readyz_port: int
    snapshot_location: Path
    rootfs: Rootfs

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def digest(self) -> str:
        """Stable hash of everything that shapes a snapshot; a golden snapshot is keyed by it."""
        body = json.dumps(
            {
                "command": list(self.command),
                "env": [list(pair) for pair in self.env],
                "readyz": [self.readyz_path, self.readyz_port],
                "rootfs": [self.rootfs.kind, str(self.rootfs.path or "")]
                + (
                    [[str(src), dst] for src, dst in self.rootfs.binds] if self.rootfs.binds else []
                ),
            },
            sort_keys=True,
        )
        return hashlib.sha256(body.encode()).hexdigest()[:16]


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
    EXTERNAL = "external"  # SuspendActor: the template's snapshot store
    GOLDEN = "golden"  # the template's golden snapshot (in the snapshot store)


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

    async def prepare_template(
        self, template: TemplateSpec, slot: Slot, dest: Path
    ) -> CheckpointResult | None:
        """Boot the template once on ``slot``, wait for readyz, checkpoint into ``dest``.

        Returns the golden snapshot, or None when the runtime has no golden snapshots (process).
        The slot is free again when this returns.
        """
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

    async def cleanup(self) -> list[str]:
        """Remove every sandbox and host-wide resource of this instance (netns, veths, mounts,
        scratch dirs). Per-actor data a PAUSED/SUSPENDED actor's snapshot still needs (e.g. the
        process runtime's working folders) stays until ``forget_actor``."""
        ...

    async def leftovers(self) -> list[str]:
        """Describe anything of this instance still on the host; [] after ``cleanup``."""
        ...
