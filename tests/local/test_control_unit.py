"""The control plane against a scripted runtime: snapshot choice, failures, crash recovery.

A fake runtime makes the failure paths (a restore that fails, a checkpoint that kills the
sandbox, a sandbox that vanished while the control plane was down) deterministic; the real
runtimes are covered by the gRPC, router and crash tests.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

import grpc
import pytest

from gym_substrate.local.control import ApiError, ControlPlane
from gym_substrate.local.metrics import Metrics
from gym_substrate.local.runtime import (
    ActorSpec,
    CheckpointResult,
    Runtime,
    RuntimeFailure,
    Slot,
    SnapshotKind,
    SnapshotRef,
    StartedSandbox,
    TemplateSpec,
)
from gym_substrate.local.store import Store
from gym_substrate.local.templates import default_template


def _image(dest: Path, size: int) -> None:
    dest.mkdir(parents=True)
    (dest / "pages.img").write_bytes(b"x" * size)


def _exists(path: Path) -> bool:
    return path.exists()


class FakeRuntime:
    name = "fake"
    isolates = True
    memory_survives_suspend = True

    def __init__(self) -> None:
        self.alive: dict[str, str] = {}  # handle -> actor key
        self.starts: list[tuple[str, SnapshotRef | None]] = []
        self.fail_start: str | None = None
        self.fail_checkpoint: RuntimeFailure | None = None
        self.swept_keep: set[str] | None = None
        self.forgotten: list[str] = []
        self._n = 0

    def warning(self) -> str | None:
        return None

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def prepare_template(
        self, template: TemplateSpec, slot: Slot, dest: Path
    ) -> CheckpointResult | None:
        _image(dest, 10)
        return CheckpointResult(SnapshotRef(SnapshotKind.GOLDEN, dest), (("pages", 10),))

    async def start(
        self, actor: ActorSpec, slot: Slot, source: SnapshotRef | None, *, timeout_s: float
    ) -> StartedSandbox:
        self.starts.append((actor.key, source))
        if self.fail_start:
            raise RuntimeFailure(self.fail_start)
        self._n += 1
        handle = f"fk-{self._n}"
        self.alive[handle] = actor.key
        return StartedSandbox(handle, f"10.0.0.{slot.index + 1}:80", source is not None)

    async def checkpoint(
        self, actor: ActorSpec, handle: str, kind: SnapshotKind, dest: Path
    ) -> CheckpointResult:
        if self.fail_checkpoint is not None:
            if self.fail_checkpoint.sandbox_lost:
                self.alive.pop(handle, None)
            raise self.fail_checkpoint
        _image(dest, 5)
        self.alive.pop(handle, None)
        return CheckpointResult(SnapshotRef(kind, dest), (("pages", 5),))

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

    async def leftovers(self) -> list[str]:
        return list(self.alive)


async def _plane(state: Path, runtime: FakeRuntime, workers: int = 2) -> ControlPlane:
    plane = ControlPlane(
        Store(state / "state.db"),
        runtime,
        state_dir=state,
        instance="gstest",
        workers=workers,
        metrics=Metrics(),
    )
    await plane.start([default_template(state / "store")])
    return plane


def test_fake_runtime_satisfies_the_protocol() -> None:
    assert isinstance(FakeRuntime(), Runtime)


async def test_snapshot_choice_follows_substrate(tmp_path: Path) -> None:
    runtime = FakeRuntime()
    plane = await _plane(tmp_path, runtime)
    golden = plane.golden("local/sandbox")
    assert golden is not None
    assert Path(golden.path).is_relative_to(tmp_path / "store" / "ate-golden-sandbox")
    plane.create_atespace("t")
    for name in ("g", "b"):
        plane.create_actor("t", name, "local", "sandbox", {})
    await plane.resume_actor("t", "g")
    await plane.resume_actor("t", "b", boot=True)
    assert runtime.starts[0][1] == SnapshotRef(SnapshotKind.GOLDEN, Path(golden.path))
    assert runtime.starts[1][1] is None  # boot=true skips the golden snapshot
    paused = await plane.pause_actor("t", "g")
    await plane.resume_actor("t", "g", boot=True)  # boot does not skip the actor's own snapshot
    assert runtime.starts[-1][1] == SnapshotRef(SnapshotKind.LOCAL, Path(paused.snapshot_path))
    suspended = await plane.suspend_actor("t", "g")
    assert not _exists(Path(paused.snapshot_path))  # superseded
    await plane.resume_actor("t", "g")
    external = SnapshotRef(SnapshotKind.EXTERNAL, Path(suspended.snapshot_path))
    assert runtime.starts[-1][1] == external
    assert Path(suspended.snapshot_path).is_relative_to(tmp_path / "store" / "g")
    plane.store.close()


async def test_failed_restore_frees_the_slot_and_keeps_the_record(tmp_path: Path) -> None:
    runtime = FakeRuntime()
    plane = await _plane(tmp_path, runtime, workers=1)
    plane.create_atespace("t")
    before = plane.create_actor("t", "a", "local", "sandbox", {})
    runtime.fail_start = "restore exploded"
    with pytest.raises(ApiError) as info:
        await plane.resume_actor("t", "a")
    assert info.value.code == grpc.StatusCode.INTERNAL
    assert info.value.message == "workflow failed at step CallAteletRestore: restore exploded"
    after = plane.get_actor("t", "a")
    assert after.status == "STATUS_SUSPENDED"
    assert after.slot is None
    assert after.version > before.version
    runtime.fail_start = None
    assert (await plane.resume_actor("t", "a")).status == "STATUS_RUNNING"  # the slot is free
    plane.store.close()


@pytest.mark.parametrize("lost", [True, False])
async def test_failed_checkpoint(tmp_path: Path, lost: bool) -> None:
    runtime = FakeRuntime()
    plane = await _plane(tmp_path, runtime, workers=1)
    plane.create_atespace("t")
    plane.create_actor("t", "a", "local", "sandbox", {})
    running = await plane.resume_actor("t", "a")
    runtime.fail_checkpoint = RuntimeFailure("checkpoint exploded", sandbox_lost=lost)
    with pytest.raises(ApiError) as info:
        await plane.suspend_actor("t", "a")
    assert info.value.code == grpc.StatusCode.INTERNAL
    record = plane.get_actor("t", "a")
    assert record.in_progress_snapshot == ""
    assert not list((tmp_path / "store").glob("a/*"))  # the half-written snapshot is gone
    if lost:
        assert record.status == "STATUS_SUSPENDED"
        assert record.slot is None
        assert record.handle == ""
    else:
        assert record.status == "STATUS_RUNNING"
        assert record.handle == running.handle
    plane.store.close()


async def test_recovery_adopts_or_falls_back(tmp_path: Path) -> None:
    runtime = FakeRuntime()
    plane = await _plane(tmp_path, runtime, workers=3)
    plane.create_atespace("t")
    for name in ("keep", "vanish", "stuck"):
        plane.create_actor("t", name, "local", "sandbox", {})
        await plane.resume_actor("t", name)
    await plane.suspend_actor("t", "vanish")
    await plane.resume_actor("t", "vanish")
    snapshot = plane.get_actor("t", "vanish").snapshot_path
    stuck = plane.get_actor("t", "stuck")
    plane._write(stuck, status="STATUS_PAUSING", in_progress_snapshot=str(tmp_path / "half"))
    (tmp_path / "half").mkdir()
    plane.store.close()  # the control plane "crashes" here: no shutdown
    runtime.alive.pop(plane.get_actor("t", "vanish").handle)
    runtime.alive[("orphan")] = "t/nobody"

    again = await _plane(tmp_path, runtime, workers=3)
    keep = again.get_actor("t", "keep")
    assert keep.status == "STATUS_RUNNING"
    assert runtime.swept_keep == {keep.handle}
    assert "orphan" not in runtime.alive
    vanished = again.get_actor("t", "vanish")
    assert (vanished.status, vanished.snapshot_path, vanished.slot) == (
        "STATUS_SUSPENDED",
        snapshot,
        None,
    )
    recovered = again.get_actor("t", "stuck")
    assert recovered.status == "STATUS_SUSPENDED"
    assert not _exists(tmp_path / "half")
    busy, free = again._worker_counts()
    assert (busy, free) == (1, 2)
    again.store.close()
