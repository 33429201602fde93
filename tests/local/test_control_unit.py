"""The control plane against a scripted runtime: snapshot choice, failures, recovery, clocks.

A fake runtime makes the failure paths (a restore that fails, a checkpoint that dies, a sandbox
that vanished while the control plane was down, a golden tag that belongs to someone else)
deterministic and the clock injectable; the real runtimes are covered by the gRPC suites
(test_fidelity_control.py, test_fidelity_resources.py). Each test says which upstream
behaviour it pins, as the gRPC suites' docstrings cite it.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import grpc
import pytest
from control_fakes import (  # noqa: E402
    Clock,
    FakeRuntime,
    create_actor,
    host_template,
    path_exists,
    start_plane,
    stop_plane,
)

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.local.control.records import TagRecord, new_meta
from gym_substrate.local.control.worker_rpcs import WorkerRpcs
from gym_substrate.local.errors import AteapiError
from gym_substrate.local.images import ImageCatalogue
from gym_substrate.local.runtimes.base import (
    RuntimeFailure,
    SandboxRuntime,
    SnapshotKind,
    SnapshotRef,
)
from gym_substrate.local.snapshots import partial_path
from gym_substrate.local.templates import default_template

C = grpc.StatusCode


@pytest.fixture
def runtime() -> FakeRuntime:
    return FakeRuntime()


def test_fake_runtime_satisfies_the_protocol() -> None:
    assert isinstance(FakeRuntime(), SandboxRuntime)


async def test_golden_build_and_snapshot_choice(tmp_path: Path, runtime: FakeRuntime) -> None:
    """real: the golden actor cold-boots (atelet Run), is suspended and tagged
    (template_reconciler.go@00cd6e96); an actor born on the golden tag restores it; a resume
    takes the newest LOCAL COMPLETED snapshot first, then the newest DURABLE one
    (`ensureAteletRestored`, kagent:controlapi/workflow_resume.go@2559ec02); a suspend writes
    under `<storage>/atespaces/<atespace>/actors/<uid>/`, a tag under `.../tags/<tag uid>/`
    (resources.NewTagSnapshotURI, upstream-resources.md §2.1); a suspend of a PAUSED actor
    uploads its local snapshot (atelet UploadPausedCheckpoint, workflow_suspend.go@2559ec02)."""
    plane = await start_plane(tmp_path, runtime)
    template = plane.state.templates["local/sandbox"]
    store = tmp_path / "store" / "atespaces"
    golden_key = f"ate-golden/{template.meta.uid}"
    assert runtime.starts[0] == (golden_key, None)
    tag = plane.state.tags[template.golden_tag]
    assert template.golden_tag == golden_key
    tag_folder = Path(tag.snapshot.storage[0].path)  # type: ignore[union-attr]
    assert tag_folder == store / "ate-golden" / "tags" / tag.meta.uid
    assert golden_key not in plane.state.actors  # deleted once tagged

    record = create_actor(plane, "a")
    await plane.resume.run("t/a")
    assert runtime.starts[-1] == ("t/a", SnapshotRef(SnapshotKind.TAG, tag_folder))
    await plane.parking.pause(pb.PauseActorRequest(actor=pb.ObjectRef(atespace="t", name="a")))
    local = Path(plane.state.actors["t/a"].latest().completed("LOCAL").path)  # type: ignore[union-attr]
    assert local.parent == tmp_path / "snapshots" / "local"
    await plane.resume.run("t/a")
    assert runtime.starts[-1] == ("t/a", SnapshotRef(SnapshotKind.LOCAL, local))
    suspended = await plane.parking.suspend_key("t/a")
    external = Path(suspended.latest_durable().completed("DURABLE").path)  # type: ignore[union-attr]
    assert external.parent == store / "t" / "actors" / record.meta.uid
    await plane.recovery.settle()
    assert not path_exists(local)  # superseded
    assert path_exists(tag_folder)  # a tag's is never the actor's to remove
    await plane.resume.run("t/a")
    assert runtime.starts[-1] == ("t/a", SnapshotRef(SnapshotKind.EXTERNAL, external))

    await plane.parking.pause(pb.PauseActorRequest(actor=pb.ObjectRef(atespace="t", name="a")))
    paused_record = plane.state.actors["t/a"]
    uploaded = await plane.parking.suspend_key("t/a")
    (key, source, retained, dest) = runtime.uploads[-1]
    assert (key, source.kind) == ("t/a", SnapshotKind.LOCAL)
    assert retained == paused_record.retained_handle
    newest = uploaded.latest_durable()
    assert newest is not None
    assert newest.generation == paused_record.last_generation
    # written under a .partial name, recorded once renamed (committed)
    assert partial_path(Path(newest.completed("DURABLE").path)) == dest  # type: ignore[union-attr]
    assert not path_exists(dest)
    await plane.recovery.settle()
    assert not path_exists(external)
    await stop_plane(plane)


async def test_a_failed_start_crashes_the_actor_and_frees_its_worker(
    tmp_path: Path, runtime: FakeRuntime
) -> None:
    """real: atelet Restore failing crashes the actor (`resume failed: atelet Restore: <msg>`),
    releasing its worker first (kagent:controlapi/crash.go@2559ec02), so another actor gets the
    only worker; the caller reads `actor <ref> crashed: ...` (design.md: INTERNAL)."""
    plane = await start_plane(tmp_path, runtime, workers=1)
    create_actor(plane, "a")
    create_actor(plane, "b")
    runtime.fail_start = "restore exploded"
    with pytest.raises(AteapiError) as info:
        await plane.resume.run("t/a")
    assert (info.value.code, info.value.message) == (
        C.INTERNAL,
        "actor t/a crashed: atelet Restore: restore exploded",
    )
    crashed = plane.state.actors["t/a"]
    assert (crashed.state, crashed.crash_message) == (
        "CRASHED",
        "resume failed: atelet Restore: restore exploded",
    )
    assert (crashed.worker, crashed.slot) == ("", None)
    runtime.fail_start = None
    resumed, ran = await plane.resume.run("t/b")
    assert (resumed.state, ran) == ("RUNNING", True)
    await stop_plane(plane)


@pytest.mark.parametrize("lost", [True, False])
async def test_a_failed_checkpoint_crashes_the_actor(
    tmp_path: Path, runtime: FakeRuntime, lost: bool
) -> None:
    """real: a failing atelet Checkpoint crashes the actor (`suspend failed: atelet Checkpoint:
    <msg>`), keeping its snapshots (kagent:controlapi/crash.go@2559ec02, workflow_suspend.go);
    the half-written snapshot is removed and its sandbox is not left running."""
    plane = await start_plane(tmp_path, runtime, workers=1)
    record = create_actor(plane, "a")
    await plane.resume.run("t/a")
    runtime.fail_checkpoint = RuntimeFailure("checkpoint exploded", sandbox_lost=lost)
    with pytest.raises(AteapiError) as info:
        await plane.parking.suspend_key("t/a")
    lost_what = (
        "lost: the sandbox's memory and files since its snapshot generation 1 (RevertActor "
        "takes it back there)"
    )
    assert (info.value.code, info.value.message) == (
        C.INTERNAL,
        f"actor t/a crashed: atelet Checkpoint: checkpoint exploded; {lost_what}",
    )
    crashed = plane.state.actors["t/a"]
    assert (crashed.state, crashed.crash_message) == (
        "CRASHED",
        f"suspend failed: atelet Checkpoint: checkpoint exploded; {lost_what}",
    )
    assert not list(
        (tmp_path / "store" / "atespaces" / "t" / "actors").glob(f"{record.meta.uid}/*")
    )
    assert runtime.alive == {}
    # the borrowed generation is kept, and so is the unfinished one (revert drops it)
    assert crashed.snapshots[0] == record.snapshots[0]
    assert [(s.generation, s.storage[0].status) for s in crashed.snapshots] == [
        (1, "COMPLETED"),
        (2, "IN_PROGRESS"),
    ]
    await stop_plane(plane)


@pytest.mark.parametrize("operation", ["pause", "suspend"])
async def test_a_failed_checkpoint_that_leaves_the_sandbox_alive_keeps_it_running(
    tmp_path: Path, runtime: FakeRuntime, operation: str
) -> None:
    """Issue 24: a park that fails without losing the sandbox must not crash the actor nor
    pretend it parked: it is RUNNING on the same sandbox, the unfinished generation and its
    files are gone, and the answer says the actor keeps running."""
    plane = await start_plane(tmp_path, runtime, workers=1)
    record = create_actor(plane, "a")
    running, _ = await plane.resume.run("t/a")
    runtime.fail_checkpoint = RuntimeFailure("checkpoint hiccup", sandbox_lost=False)
    runtime.survive_failure = True
    ref = pb.ObjectRef(atespace="t", name="a")
    park = (
        plane.parking.pause(pb.PauseActorRequest(actor=ref))
        if operation == "pause"
        else plane.parking.suspend_key("t/a")
    )
    with pytest.raises(AteapiError) as info:
        await park
    assert info.value.code == C.INTERNAL
    assert "the actor keeps running (RUNNING)" in info.value.message
    assert "checkpoint hiccup" in info.value.message
    after = plane.state.actors["t/a"]
    assert (after.state, after.handle, after.slot) == ("RUNNING", running.handle, running.slot)
    assert after.snapshots == record.snapshots
    assert not after.crash_message
    assert not await asyncio.to_thread(lambda: list(tmp_path.rglob("*.partial")))
    runtime.fail_checkpoint = None
    suspended = await plane.parking.suspend_key("t/a")
    assert suspended.state == "SUSPENDED"
    await stop_plane(plane)


async def test_recovery_adopts_what_runs_and_crashes_what_is_gone(
    tmp_path: Path, runtime: FakeRuntime
) -> None:
    """real: a worker whose ateom restarted crashes what it held (`ateom restarted while hosting
    the actor`, prefixed by the operation it interrupted: `pause failed: ...`) and its epoch
    rises (kagent:controlapi/crash.go@2559ec02; ReconcileAssignments read_file id
    70457524383). Here: a control plane that stopped without stopping sandboxes adopts those
    still running, crashes the others and sweeps what nothing claims."""
    plane = await start_plane(tmp_path, runtime, workers=3)
    for name in ("keep", "vanish", "stuck"):
        create_actor(plane, name)
        await plane.resume.run(f"t/{name}")
    stuck = plane.state.actors["t/stuck"]
    plane.state.save(stuck, state="PAUSING")
    vanish = plane.state.actors["t/vanish"]
    epochs = {w.meta.name: w.epoch for w in plane.pool.all()}
    await plane.detach()  # the control plane goes; its sandboxes stay
    plane.state.store.close()
    del runtime.alive[vanish.handle]
    runtime.alive["orphan"] = "t/nobody"

    again = await start_plane(tmp_path, runtime, workers=3)
    keep = again.state.actors["t/keep"]
    assert keep.state == "RUNNING"
    assert runtime.swept_keep == {keep.handle}
    assert "orphan" not in runtime.alive
    lost = again.state.actors["t/vanish"]
    assert (lost.state, lost.crash_message) == (
        "CRASHED",
        "ateom restarted while hosting the actor",
    )
    interrupted = again.state.actors["t/stuck"]
    assert (interrupted.state, interrupted.crash_message) == (
        "CRASHED",
        "pause failed: ateom restarted while hosting the actor",
    )
    after = {w.meta.name: w.epoch for w in again.pool.all()}
    assert after[vanish.worker] == epochs[vanish.worker] + 1
    assert after[keep.worker] == epochs[keep.worker]
    assert again.pool.counts() == (1, 2)
    await stop_plane(again)


async def test_the_backends_own_template_is_kept_replaced_or_left(
    tmp_path: Path, runtime: FakeRuntime, caplog: pytest.LogCaptureFixture
) -> None:
    """At start the backend's own template is created through CreateActorTemplate's code;
    templates are immutable upstream (no Update RPC, functionaltest/
    actor_template_test.go@0e4768ab), so a changed one (a new agent build) replaces the stored
    one only while no actor uses it, with a fresh uid and golden tag; otherwise the stored one
    is kept, with a warning saying how to pick up the new one."""
    plane = await start_plane(tmp_path, runtime)
    first = plane.state.templates["local/sandbox"]
    base = host_template(tmp_path, plane.images)
    assert await plane.templates.ensure(base) == first
    changed = pb.ActorTemplate()
    changed.CopyFrom(base)
    changed.containers[0].args.append("--verbose")
    replaced = await plane.templates.ensure(changed)
    await plane.golden.wait(replaced)
    replaced = plane.state.templates["local/sandbox"]
    assert replaced.meta.uid != first.meta.uid
    assert replaced.golden_tag == f"ate-golden/{replaced.meta.uid}"
    assert first.golden_tag not in plane.state.tags
    create_actor(plane, "user")
    with caplog.at_level(logging.WARNING, logger="gym_substrate.local.control.templates"):
        kept = await plane.templates.ensure(base)
    assert kept == replaced
    assert "1 actor(s) use it" in caplog.text
    await stop_plane(plane)


async def test_a_second_operation_is_aborted_and_the_first_stays_waitable(
    tmp_path: Path, runtime: FakeRuntime
) -> None:
    """real: the actor's lease refuses a second workflow with ABORTED `another operation is in
    progress for this actor` (`acquireLease`, walkthrough read_file id 68660195273); the router
    waits for the one in flight instead of backing off blindly (`wait_idle`)."""
    plane = await start_plane(tmp_path, runtime)
    create_actor(plane, "a")
    runtime.gate = asyncio.Event()
    first = asyncio.ensure_future(plane.resume.run("t/a"))
    await asyncio.sleep(0)
    with pytest.raises(AteapiError) as info:
        await plane.parking.suspend_key("t/a")
    assert (info.value.code, info.value.message) == (
        C.ABORTED,
        "another operation is in progress for this actor",
    )
    assert not first.done()
    waiter = asyncio.ensure_future(plane.wait_idle("t/a", 5.0))
    await asyncio.sleep(0)
    runtime.gate.set()
    assert await waiter is True
    record, ran = await first
    assert (record.state, ran) == ("RUNNING", True)
    assert await plane.wait_idle("t/a", 5.0) is False
    assert not plane.locks.busy()
    assert (await plane.parking.suspend_key("t/a")).state == "SUSPENDED"
    await stop_plane(plane)


async def test_an_injected_clock_stamps_metadata_and_crashes(
    tmp_path: Path, runtime: FakeRuntime
) -> None:
    """real: the store sets create_time = update_time = now at insert and update_time = now on
    each write (kagent:store/atepg/atepg.go@042414e0); a crash records crash_time = now, the
    first crash winning (kagent:controlapi/crash.go@2559ec02). The plane takes its clock."""
    clock = Clock()
    plane = await start_plane(tmp_path, runtime, clock=clock)
    clock.now += 10
    record = create_actor(plane, "a")
    assert (record.meta.create_time, record.meta.update_time) == (clock.now, clock.now)
    clock.now += 5
    running, _ = await plane.resume.run("t/a")
    assert (running.meta.create_time, running.meta.update_time) == (clock.now - 5, clock.now)
    clock.now += 7
    crashed = await plane.crashes.crash(running, "", "the actor's sandbox exited")
    assert crashed.crash_time == clock.now
    clock.now += 1
    again = await plane.crashes.crash(crashed, "resume", "later")
    assert (again.crash_time, again.crash_message) == (clock.now - 1, "the actor's sandbox exited")
    template = plane.state.templates["local/sandbox"]
    assert template.snapshot_time == 1_000_000.0  # probed: no warm-up
    await stop_plane(plane)


async def test_a_golden_tag_of_another_template_ends_the_build(
    tmp_path: Path, runtime: FakeRuntime
) -> None:
    """real: a tag already at `ate-golden/<uid>` that another actor or template made ends the
    build for good: `GoldenTagConflict: golden tag belongs to another actor or template`
    (controlapi/template_reconciler.go@00cd6e96)."""
    plane = await start_plane(tmp_path, runtime)
    base = host_template(tmp_path, plane.images)
    base.metadata.name = "second"
    record = plane.templates.create(pb.CreateActorTemplateRequest(actor_template=base))
    # before its build's first pass: someone else's tag under the golden name
    plane.state.insert(
        TagRecord(new_meta("ate-golden", record.meta.uid), "PUBLISHED", "t/else", "x", None)
    )
    await plane.golden.wait(record)
    done = plane.state.templates["local/second"]
    assert done.golden_error == "GoldenTagConflict: golden tag belongs to another actor or template"
    assert done.golden_tag == ""
    await stop_plane(plane)


async def test_deleting_a_worker_crashes_its_actors_and_it_can_register_again(
    tmp_path: Path, runtime: FakeRuntime
) -> None:
    """real: when a worker pod goes away (DeleteWorker) the actors it held are CRASHED with
    `worker pod went away while hosting the actor` (`crashBoundActor`, read_file id
    70085660369); CreateWorker registers a pod as a worker (controlapi/worker.go@06e9dc87).
    Here only a pod of this backend can come back, under a new name."""
    plane = await start_plane(tmp_path, runtime)
    rpcs = WorkerRpcs(plane)
    create_actor(plane, "a")
    running, _ = await plane.resume.run("t/a")
    worker = plane.pool.by_name(running.worker)
    assert worker is not None
    request = pb.DeleteWorkerRequest(worker=pb.ObjectRef(name=worker.meta.name))
    removed = await rpcs.delete(request)
    crashed = plane.state.actors["t/a"]
    assert (crashed.state, crashed.crash_message) == (
        "CRASHED",
        "worker pod went away while hosting the actor",
    )
    assert len(plane.pool.all()) == 1
    pod = plane.pool.pod_name(removed)
    back = rpcs.create(
        pb.CreateWorkerRequest(worker=pb.Worker(worker_namespace="local", worker_pod=pod))
    )
    assert back.meta.name != removed.meta.name
    assert len(plane.pool.all()) == 2
    with pytest.raises(AteapiError) as info:
        rpcs.create(
            pb.CreateWorkerRequest(worker=pb.Worker(worker_namespace="local", worker_pod="x"))
        )
    assert info.value.code == C.FAILED_PRECONDITION
    await stop_plane(plane)


async def test_a_template_on_the_hosts_root_needs_the_operators_opt_in(
    tmp_path: Path, runtime: FakeRuntime
) -> None:
    """Issue 24: from inside a process-runtime actor, a client created a template on the image
    local/host, an actor of it, and read the host's files. Without `local up
    --allow-host-rootfs` (or `--rootfs host`) such a template is FAILED_PRECONDITION naming the
    flag, and one stored while it was allowed crashes its actor at resume instead of running."""
    state = tmp_path / "state"
    plane = await start_plane(state, runtime)  # allowed: the default template is on the host's /
    plane.atespaces.ensure("t")
    own = create_actor(plane, "old")
    await stop_plane(plane)

    images = ImageCatalogue(state)
    tree = tmp_path / "tree"
    for folder in ("bin", "usr"):
        (tree / folder).mkdir(parents=True)
    image = images.register_tree("mine", tree)
    template = default_template(state / "store", image, None)
    strict = await start_plane(state, runtime, template=template, allow_host_rootfs=False)
    host = images.latest("local/host")
    assert host is not None
    on_host = pb.ActorTemplate()
    on_host.CopyFrom(template)
    on_host.metadata.name = "on-host"
    for reference in (host.reference, "local/host@sha256:" + "0" * 64):
        on_host.containers[0].image = reference
        with pytest.raises(AteapiError) as refused:
            strict.templates.create(pb.CreateActorTemplateRequest(actor_template=on_host))
        assert refused.value.code == C.FAILED_PRECONDITION
        assert "--allow-host-rootfs" in refused.value.message
    assert "t/on-host" not in strict.state.templates

    # "old" uses the stored default template (on the host's /, stored while allowed), so it
    # is kept; its actor cannot start now
    assert strict.state.templates["local/sandbox"].meta.uid == own.template_uid
    with pytest.raises(AteapiError) as crashed:
        await strict.resume.run(own.key)
    assert "--allow-host-rootfs" in crashed.value.message
    assert strict.state.actors[own.key].state == "CRASHED"
    assert runtime.alive == {}
    assert strict.pool.counts()[0] == 0
    await stop_plane(strict)
