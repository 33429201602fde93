"""The control plane against a scripted runtime: snapshot choice, failures, crash recovery.

A fake runtime makes the failure paths (a restore that fails, a checkpoint that kills the
sandbox, a sandbox that vanished while the control plane was down) deterministic; the real
runtimes are covered by the gRPC, router and crash tests.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Collection
from pathlib import Path
from typing import Any

import grpc
import pytest

from gym_substrate.local.errors import ApiError
from gym_substrate.local.lifecycle import ControlPlane
from gym_substrate.local.metrics import Metrics
from gym_substrate.local.runtimes.base import (
    ActorSpec,
    CheckpointResult,
    RuntimeFailure,
    SandboxRuntime,
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

    async def prepare_template(
        self, template: TemplateSpec, slot: Slot, dest: Path
    ) -> CheckpointResult | None:
        _image(dest, 10)
        return CheckpointResult(SnapshotRef(SnapshotKind.GOLDEN, dest), (("pages", 10),))

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
    assert isinstance(FakeRuntime(), SandboxRuntime)


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


async def test_failed_restore_keeps_the_worker_and_the_next_resume_continues(
    tmp_path: Path,
) -> None:
    """Real: a failed step leaves the actor RESUMING with its worker; the next ResumeActor
    reuses that worker (AssignWorker) and carries on (workflow_resume.go)."""
    runtime = FakeRuntime()
    plane = await _plane(tmp_path, runtime, workers=1)
    plane.create_atespace("t")
    before = plane.create_actor("t", "a", "local", "sandbox", {})
    plane.create_actor("t", "b", "local", "sandbox", {})
    runtime.fail_start = "restore exploded"
    with pytest.raises(ApiError) as info:
        await plane.resume_actor("t", "a")
    assert info.value.code == grpc.StatusCode.INTERNAL
    assert info.value.message == (
        "workflow failed at step CallAteletRestore: while creating workload from golden "
        "snapshot: restore exploded"
    )
    after = plane.get_actor("t", "a")
    assert after.status == "STATUS_RESUMING"
    assert after.slot == 0
    assert after.version > before.version
    with pytest.raises(ApiError) as info:
        await plane.resume_actor("t", "b")  # "a" still holds the only worker
    assert info.value.message == "no free workers available"
    runtime.fail_start = None
    resumed = await plane.resume_actor("t", "a")
    assert (resumed.status, resumed.slot) == ("STATUS_RUNNING", 0)
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
    busy, free = again.slots.counts()
    assert (busy, free) == (1, 2)
    again.store.close()


async def test_template_in_use_cannot_change(tmp_path: Path) -> None:
    """A changed spec under a name actors use is refused; unchanged is a no-op; unused replaces."""
    runtime = FakeRuntime()
    plane = await _plane(tmp_path, runtime)
    base = default_template(tmp_path / "store")
    golden = plane.golden(base.key)
    assert golden is not None
    assert await plane.add_template(base) is False  # identical: no-op, golden kept
    assert plane.golden(base.key) == golden
    plane.create_atespace("t")
    for name in ("a", "b"):
        plane.create_actor("t", name, "local", "sandbox", {})
    changed = dataclasses.replace(base, command=(*base.command, "--verbose"))
    with pytest.raises(ApiError) as info:
        await plane.add_template(changed)
    assert info.value.code == grpc.StatusCode.FAILED_PRECONDITION
    message = info.value.message
    assert "local/sandbox is used by 2 actor(s)" in message
    assert "--verbose" in message  # names what changed
    assert "Delete those actors" in message
    assert "new metadata.name" in message
    assert plane.templates[base.key] == base
    assert [t for t, _ in plane.store.templates()] == [base]
    assert plane.golden(base.key) == golden
    assert _exists(Path(golden.path))
    for name in ("a", "b"):
        await plane.delete_actor("t", name)
    # no actor uses it any more: the changed spec replaces it, with a fresh golden snapshot
    assert await plane.add_template(changed) is True
    assert plane.templates[base.key] == changed
    fresh = plane.golden(base.key)
    assert fresh is not None
    assert fresh.digest == changed.digest()
    assert not _exists(Path(golden.path))
    plane.store.close()


async def test_up_keeps_a_changed_default_template_while_actors_use_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    runtime = FakeRuntime()
    plane = await _plane(tmp_path, runtime)
    plane.create_atespace("t")
    plane.create_actor("t", "a", "local", "sandbox", {})
    await plane.resume_actor("t", "a")
    await plane.suspend_actor("t", "a")
    await plane.shutdown()
    plane.store.close()
    stored = default_template(tmp_path / "store")
    upgraded = dataclasses.replace(stored, command=("/new/python", "-m", "sandbox_agent"))
    again = ControlPlane(
        Store(tmp_path / "state.db"),
        runtime,
        state_dir=tmp_path,
        instance="gstest",
        workers=2,
        metrics=Metrics(),
    )
    with caplog.at_level("WARNING", logger="gym_substrate.local.template_registry"):
        await again.start([upgraded])  # what `local up` does after an upgrade
    assert again.templates[stored.key] == stored
    warning = "\n".join(r.getMessage() for r in caplog.records)
    assert "local/sandbox differs from the stored one" in warning
    assert "/new/python" in warning
    assert "1 actor(s)" in warning
    resumed = await again.resume_actor("t", "a")
    assert resumed.status == "STATUS_RUNNING"
    again.store.close()


def test_cli_offline_add_refuses_to_change_a_template_in_use(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from gym_substrate.cli.local import local
    from gym_substrate.local.store import ActorRecord

    state = tmp_path / "state"
    state.mkdir()
    path = tmp_path / "tpl.yaml"

    def write(port: int) -> None:
        path.write_text(
            "metadata: {name: mine, namespace: local}\n"
            "spec:\n  containers:\n  - name: agent\n"
            f"    command: [python3, -m, sandbox_agent, --port, '{port}']\n"
            f"    readyz: {{httpGet: {{path: /readyz, port: {port}}}}}\n"
            "  snapshotsConfig: {location: snaps}\n  rootfs: host\n"
        )

    def add() -> Any:
        return CliRunner().invoke(local, ["templates", "add", str(path), "--state-dir", str(state)])

    write(80)
    assert add().exit_code == 0
    assert add().exit_code == 0  # unchanged: fine
    store = Store(state / "state.db")
    (registered,) = [t for t, _ in store.templates()]
    store.add_atespace("t")
    record = ActorRecord("t", "a", "local", "mine", "STATUS_SUSPENDED")
    store.insert_actor(record)
    store.close()
    write(81)
    result = add()
    assert result.exit_code == 1, result.output
    assert "local/mine is used by 1 actor(s)" in result.output
    store = Store(state / "state.db")
    assert [t for t, _ in store.templates()] == [registered]
    store.close()


async def test_concurrent_operation_keeps_the_first_in_flight(tmp_path: Path) -> None:
    """Two calls in one loop turn: the second is ABORTED and the first stays waitable."""
    runtime = FakeRuntime()
    plane = await _plane(tmp_path, runtime)
    plane.create_atespace("t")
    plane.create_actor("t", "a", "local", "sandbox", {})
    runtime.gate = asyncio.Event()
    first = asyncio.ensure_future(plane.resume_actor("t", "a"))
    second = asyncio.ensure_future(plane.resume_actor("t", "a"))
    with pytest.raises(ApiError) as info:
        await second
    assert info.value.code == grpc.StatusCode.ABORTED
    assert not first.done()
    # the router waits on the first operation instead of backing off blindly
    waiter = asyncio.ensure_future(plane.wait_idle("t/a", 5.0))
    await asyncio.sleep(0)
    runtime.gate.set()
    assert await waiter is True
    assert first.done()
    assert (await first).status == "STATUS_RUNNING"
    assert len(runtime.starts) == 1
    assert await plane.wait_idle("t/a", 5.0) is False
    assert not plane.workflows.busy()
    assert (await plane.suspend_actor("t", "a")).status == "STATUS_SUSPENDED"
    plane.store.close()
