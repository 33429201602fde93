"""The control plane's test doubles: a scripted runtime, a clock that stands still, a started
plane on them (shared by test_control_unit.py and test_transitions_unit.py)."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Collection
from pathlib import Path
from typing import Any

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.local.control.plane import ControlPlane
from gym_substrate.local.control.store import Store
from gym_substrate.local.images import ImageCatalogue
from gym_substrate.local.metrics import Metrics
from gym_substrate.local.runtimes.base import (
    ActorSpec,
    CheckpointResult,
    RuntimeFailure,
    Slot,
    SnapshotKind,
    SnapshotRef,
    StartedSandbox,
)
from gym_substrate.local.templates import default_template


def _image(dest: Path, size: int) -> None:
    dest.mkdir(parents=True)
    (dest / "pages.img").write_bytes(b"x" * size)


def path_exists(path: Path) -> bool:
    return path.exists()


class FakeRuntime:
    """The runtime contract (runtimes/base.py), scripted: what was started from what, and
    failures on demand."""

    name = "fake"
    isolates = True
    memory_survives_suspend = True

    def __init__(self) -> None:
        self.alive: dict[str, str] = {}  # handle -> actor key
        self.starts: list[tuple[str, SnapshotRef | None]] = []
        self.uploads: list[tuple[str, SnapshotRef, str, Path]] = []
        self.fail_start: str | None = None
        self.fail_checkpoint: RuntimeFailure | None = None
        self.survive_failure = False  # a failed checkpoint leaves the sandbox running
        self.swept_keep: set[str] | None = None
        self.forgotten: list[str] = []
        self.gate: asyncio.Event | None = None  # when set, start() waits for it
        self._n = 0

    def warning(self) -> str | None:
        return None

    def worker_ip(self, slot: Slot) -> str:
        return f"10.0.0.{slot.index + 1}"

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def start(
        self, actor: ActorSpec, slot: Slot, source: SnapshotRef | None, *, timeout_s: float
    ) -> StartedSandbox:
        self.starts.append((actor.key, source))
        if self.gate is not None:
            await self.gate.wait()
        if self.fail_start:
            raise RuntimeFailure(self.fail_start)
        self._n += 1
        handle = f"fk-{self._n}"
        self.alive[handle] = actor.key
        return StartedSandbox(handle, self.worker_ip(slot), source is not None)

    async def checkpoint(
        self, actor: ActorSpec, handle: str, kind: SnapshotKind, dest: Path
    ) -> CheckpointResult:
        if self.fail_checkpoint is not None:
            _image(dest, 1)  # half written
            if not self.survive_failure:
                self.alive.pop(handle, None)
            raise self.fail_checkpoint
        _image(dest, 5)
        self.alive.pop(handle, None)
        return CheckpointResult(SnapshotRef(kind, dest), (("pages", 5),))

    async def upload(
        self, actor: ActorSpec, local: SnapshotRef, retained_handle: str, dest: Path
    ) -> CheckpointResult:
        self.uploads.append((actor.key, local, retained_handle, dest))
        shutil.copytree(local.path, dest)
        return CheckpointResult(SnapshotRef(SnapshotKind.EXTERNAL, dest), (("pages", 5),))

    async def stop(self, handle: str) -> None:
        self.alive.pop(handle, None)

    async def is_alive(self, handle: str) -> bool:
        return handle in self.alive

    async def adopt(
        self, actor: ActorSpec, slot: Slot, handle: str, address: str
    ) -> StartedSandbox | None:
        return StartedSandbox(handle, address, True) if handle in self.alive else None

    async def sweep(self, keep: Collection[str]) -> list[str]:
        self.swept_keep = set(keep)
        gone = [h for h in self.alive if h not in keep]
        for handle in gone:
            del self.alive[handle]
        return gone

    async def forget_actor(self, actor: ActorSpec) -> None:
        self.forgotten.append(actor.key)

    async def memory_bytes(self, handle: str) -> int | None:
        return None

    async def cleanup(self) -> list[str]:
        return await self.sweep(())

    async def park_paused(self) -> None:
        return None

    async def leftovers(self) -> list[str]:
        return list(self.alive)


class Clock:
    """An injected clock: time stands still until a test moves it."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def host_template(state: Path, images: ImageCatalogue) -> pb.ActorTemplate:
    host = images.latest("local/host")
    assert host is not None
    return default_template(state / "store", host, None)


async def start_plane(
    state: Path,
    runtime: FakeRuntime,
    *,
    workers: int = 2,
    per_worker: int = 1,
    clock: Clock | None = None,
    template: pb.ActorTemplate | None = None,
    allow_host_rootfs: bool = True,
) -> ControlPlane:
    """A started plane whose default template's golden build has ended (on the host's `/`, so
    allowed unless a test says otherwise)."""
    images = ImageCatalogue(state)
    plane = ControlPlane(
        Store(state / "state.db"),
        runtime,
        state_dir=state,
        instance="gstest",
        workers=workers,
        actors_per_worker=per_worker,
        metrics=Metrics(),
        images=images,
        allow_host_rootfs=allow_host_rootfs,
        **({"clock": clock} if clock is not None else {}),
    )
    await plane.start([template or host_template(state, images)])
    for record in list(plane.state.templates.values()):
        await plane.golden.wait(record)
    return plane


async def stop_plane(plane: ControlPlane) -> None:
    await plane.shutdown()
    plane.state.store.close()


def create_actor(plane: ControlPlane, name: str, atespace: str = "t", **fields: Any) -> Any:
    plane.atespaces.ensure(atespace)
    actor = pb.Actor(
        metadata=pb.ResourceMetadata(atespace=atespace, name=name),
        actor_template=pb.ObjectRef(atespace="local", name="sandbox"),
        **fields,
    )
    return plane.actors.create(pb.CreateActorRequest(actor=actor))
