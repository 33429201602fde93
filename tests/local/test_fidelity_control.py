"""The local control plane's actors behave as today's ateapi's: lifecycle, workers, crashes.

One test per behaviour of issue 20 §2 (actors, workers with capacity, crash and revert, pause
and suspend generations, leases), each through the gRPC API of a started LocalBackend, on both
runtimes (process and gVisor). Each docstring says what upstream does and where: paths under
cmd/ateapi/internal/ of agent-substrate/substrate, or of its mirror kagent-dev/substrate
(`kagent:`), whose files at 2559ec02/447b0ad3 use the names of the proto we speak
(ateapi.proto@2179589f). Templates, tags,
atespaces, paging and validation are in test_fidelity_resources.py.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import re
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from local_helpers import (
    RUNTIMES,
    answer,
    durable_uri,
    error,
    get_actor,
    kill_sandbox,
    late_workload,
    make_actor,
    poll,
    ref,
    register_template,
    run_in,
    settle_golden,
    snapshots,
    state,
    wait_state,
    workload_actor,
)

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.ateapi import ateapi_pb2_grpc as pb_grpc
from gym_substrate.local import LocalBackend
from gym_substrate.local.control import resume as resume_module
from gym_substrate.local.statedir import state_leftovers

C = grpc.StatusCode
BUSY = "another operation is in progress for this actor"
NO_ROOM = "no free workers available"


@pytest.fixture(params=RUNTIMES)
def runtime_name(request: pytest.FixtureRequest) -> str:
    """Every backend test here runs on both local runtimes."""
    name: str = request.param
    return name


async def _resume(stub: Any, name: str, atespace: str = "t") -> pb.ResumeActorResponse:
    response: pb.ResumeActorResponse = await stub.ResumeActor(
        pb.ResumeActorRequest(actor=ref(name, atespace))
    )
    return response


async def _suspend(stub: Any, name: str, atespace: str = "t") -> pb.Actor:
    response = await stub.SuspendActor(pb.SuspendActorRequest(actor=ref(name, atespace)))
    actor: pb.Actor = response.actor
    return actor


async def _pause(stub: Any, name: str, atespace: str = "t") -> pb.Actor:
    response = await stub.PauseActor(pb.PauseActorRequest(actor=ref(name, atespace)))
    actor: pb.Actor = response.actor
    return actor


async def _revert(stub: Any, name: str, atespace: str = "t") -> pb.Actor:
    response = await stub.RevertActor(pb.RevertActorRequest(actor=ref(name, atespace)))
    actor: pb.Actor = response.actor
    return actor


async def _workers(stub: Any) -> list[pb.Worker]:
    return list((await stub.ListWorkers(pb.ListWorkersRequest())).workers)


async def _golden_tag(stub: Any) -> pb.Tag:
    template = await stub.GetActorTemplate(
        pb.GetActorTemplateRequest(actor_template=ref("sandbox", "local"))
    )
    golden = template.status.golden_snapshot_status.golden_tag
    tag: pb.Tag = await stub.GetTag(pb.GetTagRequest(tag=golden))
    return tag


def _folder(uri: str) -> Path:
    assert uri.startswith("file://localhost/"), uri
    return Path(uri.removeprefix("file://localhost"))


# ---------------------------------------------------------------------------- create


async def test_create_actor_starts_suspended_borrowing_the_golden_tag(stub: Any) -> None:
    """real: CreateActor stores a SUSPENDED actor holding its template's golden tag's snapshot
    as generation 1, owner TAG, stamped with the tag's template uid, last_assigned_generation 1,
    no worker (kagent:controlapi/actor.go@447b0ad3); a taken name is ALREADY_EXISTS `Actor <name>
    already exists` (bare name), a missing atespace FAILED_PRECONDITION `Atespace <a> not found`
    (kagent:store/atepg/actor.go@0cd1db44), a missing template FAILED_PRECONDITION `actor
    template not found` (the wrapped status: internal/ateinterceptors/
    ateinterceptors.go@2e3e300a)."""
    golden = await _golden_tag(stub)
    actor = await make_actor(stub, "a")
    assert state(actor) == "SUSPENDED"
    assert snapshots(actor.status) == [(1, "TAG", ["DURABLE:COMPLETED"])]
    (borrowed,) = actor.status.snapshots
    assert borrowed.actor_template_uid == golden.status.actor_template_uid
    assert durable_uri(borrowed) == durable_uri(golden.status.snapshot)
    assert actor.status.last_assigned_generation == 1
    assert not actor.status.HasField("worker_assignment")
    assert not actor.status.HasField("crash")
    assert (actor.actor_template.atespace, actor.actor_template.name) == ("local", "sandbox")

    def create(name: str, atespace: str = "t", template: str = "sandbox") -> Any:
        message = pb.Actor(
            metadata=pb.ResourceMetadata(atespace=atespace, name=name),
            actor_template=pb.ObjectRef(atespace="local", name=template),
        )
        return stub.CreateActor(pb.CreateActorRequest(actor=message))

    assert await answer(create("a")) == (C.ALREADY_EXISTS, "Actor a already exists")
    assert await answer(create("b", atespace="nope")) == (
        C.FAILED_PRECONDITION,
        "Atespace nope not found",
    )
    assert await answer(create("b", template="nope")) == (
        C.FAILED_PRECONDITION,
        "actor template not found",
    )
    listed = await stub.ListActors(pb.ListActorsRequest(atespace="t"))
    assert [a.metadata.name for a in listed.actors] == ["a"]  # nothing half-created


# ---------------------------------------------------------------------------- resume


async def test_resume_answers_resumed_true_then_false(
    stub: Any, backend: LocalBackend, http: aiohttp.ClientSession
) -> None:
    """real: ResumeActor of a SUSPENDED actor places it on a worker, restores it and answers
    `resumed=true` with the RUNNING actor and its worker_assignment; a RUNNING actor is
    answered at once, `resumed=false`, with no write (kagent:controlapi/workflow_resume.go
    @2559ec02, proto ResumeActorResponse)."""
    await make_actor(stub, "a")
    first = await _resume(stub, "a")
    assert (first.resumed, state(first.actor)) == (True, "RUNNING")
    assignment = first.actor.status.worker_assignment
    workers = {w.metadata.name: w for w in await _workers(stub)}
    worker = workers[assignment.worker.name]
    assert (assignment.worker_pod, list(assignment.worker_pod_ips)) == (
        worker.worker_pod,
        list(worker.ips),
    )
    assert (assignment.worker_pool, assignment.worker_namespace) == ("local", "local")
    assert assignment.node_name == first.actor.status.assigned_node == worker.node_name
    assert assignment.worker_epoch == worker.epoch
    again = await _resume(stub, "a")
    assert (again.resumed, state(again.actor)) == (False, "RUNNING")
    assert again.actor.metadata.version == first.actor.metadata.version
    assert (await run_in(http, backend, "a", "echo up"))["stdout"] == "up\n"
    await _suspend(stub, "a")


async def test_a_running_actor_is_resumed_without_the_lease(
    stub: Any, backend: LocalBackend
) -> None:
    """real: the fast path reads a RUNNING actor without taking its lease
    (kagent:controlapi/workflow_resume.go@2559ec02), so concurrent resumes of it (the router's
    one per request) all succeed with `resumed=false`: 8 threads x 40 calls, never ABORTED.
    (June: the resume took the lock for a RUNNING actor too, and some calls were ABORTED.)"""
    await make_actor(stub, "hot")
    await _resume(stub, "hot")
    channel = grpc.insecure_channel(backend.api_address)
    sync_stub = pb_grpc.ControlStub(channel)  # type: ignore[no-untyped-call]

    def hammer() -> list[tuple[grpc.StatusCode, bool]]:
        out = []
        for _ in range(40):
            try:
                response = sync_stub.ResumeActor(
                    pb.ResumeActorRequest(actor=ref("hot")), timeout=30
                )
                out.append((C.OK, response.resumed))
            except grpc.RpcError as exc:
                out.append((exc.code(), False))  # type: ignore[attr-defined]
        return out

    loop = asyncio.get_running_loop()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = await asyncio.gather(*(loop.run_in_executor(pool, hammer) for _ in range(8)))
    channel.close()
    answers = [item for result in results for item in result]
    assert answers == [(C.OK, False)] * 320
    await _suspend(stub, "hot")


async def test_a_client_deadline_stops_the_resume_and_the_next_one_carries_on(
    stub: Any, backend: LocalBackend
) -> None:
    """real: the workflow runs under the request's context, so a client deadline stops it where
    it is (its lease released once the step in flight has wound down): the actor stays RESUMING
    with its worker_assignment, and the next ResumeActor re-enters on that worker
    (`ensureWorkerAssigned`, kagent:controlapi/workflow_resume.go@2559ec02)."""
    assert backend.plane is not None
    await workload_actor(stub, backend, "cut", late_workload(3))
    request = pb.ResumeActorRequest(actor=ref("cut"))
    failed = await error(stub.ResumeActor(request, timeout=1))
    assert failed.code() == C.DEADLINE_EXCEEDED
    await backend.plane.wait_idle("t/cut", 30)
    left = await wait_state(stub, "cut", "RESUMING")
    assert left.status.worker_assignment.worker.name
    resumed = await _resume(stub, "cut")
    assert (resumed.resumed, state(resumed.actor)) == (True, "RUNNING")
    assert resumed.actor.status.worker_assignment.worker == left.status.worker_assignment.worker
    await _suspend(stub, "cut")


@pytest.mark.slow
async def test_resume_is_bounded_by_the_wakeup_probe_not_a_workflow_deadline(
    stub: Any, backend: LocalBackend
) -> None:
    """real: ResumeActor returns once every container's wakeup probe answers 200, waiting up to
    the probe's `timeout_seconds` (proto ContainerWakeupProbe, ateapi.proto@2179589f; atelet
    polls it, read_file id 68804470604); June's 28 s workflow deadline is gone. A workload ready
    35 s after each restore, under a 60 s probe, is RUNNING after at least those 35 s."""
    await register_template(backend, "for-patient", late_workload(35), probe_timeout_s=60)
    await make_actor(stub, "patient", template="for-patient")
    started = time.monotonic()
    resumed = await _resume(stub, "patient")
    assert state(resumed.actor) == "RUNNING"
    assert time.monotonic() - started >= 35
    await _suspend(stub, "patient")


# ---------------------------------------------------------------------------- update


async def test_update_actor_needs_uid_and_version_preconditions(stub: Any) -> None:
    """real: UpdateActor replaces the spec under the store's uid+version precondition: a missing
    one is INVALID_ARGUMENT `while updating actor <ref>: persistence: precondition required:
    uid` (or version), a stale one ABORTED `concurrent update conflict, please retry`, a missing
    actor NOT_FOUND `actor <ref> not found`; success bumps the version and update_time, keeps uid
    and create_time (kagent:controlapi/actor.go@447b0ad3, store.go read_file id 57605409256,
    kagent:store/atepg/atepg.go@042414e0). The template may change only while SUSPENDED, and
    source_tag never (INVALID_ARGUMENT)."""
    created = await make_actor(stub, "a")

    def update(**changes: Any) -> Any:
        actor = pb.Actor()
        actor.CopyFrom(created)
        actor.ClearField("status")
        for path, value in changes.items():
            if path == "labels":
                actor.worker_selector.match_labels.update(value)
            elif path == "source_tag":
                actor.source_tag.CopyFrom(value)
            else:
                setattr(actor.metadata, path, value)
        return stub.UpdateActor(pb.UpdateActorRequest(actor=actor))

    assert await answer(update(uid="")) == (
        C.INVALID_ARGUMENT,
        "while updating actor t/a: persistence: precondition required: uid",
    )
    assert await answer(update(version=0)) == (
        C.INVALID_ARGUMENT,
        "while updating actor t/a: persistence: precondition required: version",
    )
    stale = created.metadata.version + 1
    conflict = (C.ABORTED, "concurrent update conflict, please retry")
    assert await answer(update(version=stale)) == conflict
    assert await answer(update(uid=str(uuid.uuid4()))) == conflict
    assert await answer(update(name="zz")) == (C.NOT_FOUND, "actor t/zz not found")
    assert (await answer(update(source_tag=ref("v1"))))[0] == C.INVALID_ARGUMENT

    updated: pb.Actor = await update(labels={"zone": "here"})
    assert dict(updated.worker_selector.match_labels) == {"zone": "here"}
    assert updated.metadata.version == created.metadata.version + 1
    assert updated.metadata.uid == created.metadata.uid
    assert updated.metadata.create_time == created.metadata.create_time
    assert (
        updated.metadata.update_time.ToNanoseconds() > created.metadata.update_time.ToNanoseconds()
    )
    assert await answer(update(labels={"zone": "there"})) == conflict  # created's version
    # the whole spec is replaced: a selector left out is cleared
    cleared: pb.Actor = await stub.UpdateActor(
        pb.UpdateActorRequest(
            actor=pb.Actor(metadata=updated.metadata, actor_template=updated.actor_template)
        )
    )
    assert not cleared.worker_selector.match_labels
    await _resume(stub, "a")
    running = await get_actor(stub, "a")
    repoint = pb.Actor(
        metadata=running.metadata, actor_template=pb.ObjectRef(atespace="local", name="other")
    )
    assert await answer(stub.UpdateActor(pb.UpdateActorRequest(actor=repoint))) == (
        C.FAILED_PRECONDITION,
        "actor must be ACTOR_STATE_SUSPENDED to change its actor template "
        "(got: ACTOR_STATE_RUNNING)",
    )
    await _suspend(stub, "a")


# ---------------------------------------------------------------------------- delete


async def test_delete_actor_needs_suspended_or_crashed_unless_any_state(
    stub: Any, backend: LocalBackend
) -> None:
    """real: DeleteActor takes the actor's lease, checks DeleteOptions before the state (ABORTED
    `Actor <ref> does not have uid <uid>` / `concurrent update conflict, please retry`), then
    needs SUSPENDED or CRASHED unless any_state: FAILED_PRECONDITION `Actor <ref> is not in a
    deletable state (state: ACTOR_STATE_RUNNING)`; it answers the deleted record as DELETING
    and removes the actor's own snapshots, never a tag's (kagent:controlapi/
    workflow_delete.go@447b0ad3); a second delete is NOT_FOUND `Actor <ref> not found`."""
    golden = await _golden_tag(stub)
    await make_actor(stub, "run")
    running = (await _resume(stub, "run")).actor
    other = str(uuid.uuid4())
    cases = [
        (
            pb.DeleteOptions(uid=other),
            (C.ABORTED, f"Actor t/run does not have uid {other}"),
        ),
        (
            pb.DeleteOptions(version=running.metadata.version + 5),
            (C.ABORTED, "concurrent update conflict, please retry"),
        ),
        (
            pb.DeleteOptions(),
            (
                C.FAILED_PRECONDITION,
                "Actor t/run is not in a deletable state (state: ACTOR_STATE_RUNNING)",
            ),
        ),
    ]
    for options, expected in cases:
        request = pb.DeleteActorRequest(actor=ref("run"), options=options)
        assert await answer(stub.DeleteActor(request)) == expected
    deleted: pb.Actor = await stub.DeleteActor(
        pb.DeleteActorRequest(
            actor=ref("run"),
            any_state=True,
            options=pb.DeleteOptions(uid=running.metadata.uid, version=running.metadata.version),
        )
    )
    assert (deleted.metadata.name, state(deleted)) == ("run", "DELETING")
    assert deleted.metadata.version > running.metadata.version
    assert await answer(stub.GetActor(pb.GetActorRequest(actor=ref("run")))) == (
        C.NOT_FOUND,
        "Actor t/run not found",
    )
    assert await answer(stub.DeleteActor(pb.DeleteActorRequest(actor=ref("run")))) == (
        C.NOT_FOUND,
        "Actor t/run not found",
    )
    assert all(w.status.allocated.actors == 0 for w in await _workers(stub))

    # a SUSPENDED actor goes without any_state; its own snapshot goes, the golden tag's stays
    await make_actor(stub, "own")
    await _resume(stub, "own")
    suspended = await _suspend(stub, "own")
    own = _folder(durable_uri(suspended.status.snapshots[0]))
    assert own.is_dir()
    await stub.DeleteActor(pb.DeleteActorRequest(actor=ref("own")))
    assert not own.exists()
    assert _folder(durable_uri(golden.status.snapshot)).is_dir()


# ---------------------------------------------------------------------------- leases


async def test_a_second_operation_on_a_busy_actor_is_aborted(
    stub: Any, backend: LocalBackend
) -> None:
    """real: Resume (off its fast path), Suspend, Pause, Revert and Delete take the lease
    `lease:actor:<atespace>:<name>`; while it is held they answer ABORTED `another operation is
    in progress for this actor` (`acquireLease`, walkthrough read_file id 68660195273;
    kagent:controlapi/workflow.go@05be62dc). Get and Update take none, and the lease is per
    atespace and name: u/busy is not held up by t/busy. (June: DeleteActor took no lock and
    answered by status, and the lock was the actor id alone.)"""
    await workload_actor(stub, backend, "busy", late_workload(2))
    await make_actor(stub, "busy", atespace="u")
    resume = asyncio.ensure_future(_resume(stub, "busy"))
    during = await wait_state(stub, "busy", "RESUMING")
    assert during.status.worker_assignment.worker.name
    r = ref("busy")
    for call in (
        stub.ResumeActor(pb.ResumeActorRequest(actor=r)),
        stub.SuspendActor(pb.SuspendActorRequest(actor=r)),
        stub.PauseActor(pb.PauseActorRequest(actor=r)),
        stub.RevertActor(pb.RevertActorRequest(actor=r)),
        stub.DeleteActor(pb.DeleteActorRequest(actor=r, any_state=True)),
    ):
        assert await answer(call) == (C.ABORTED, BUSY)
    labelled = pb.Actor(metadata=during.metadata, actor_template=during.actor_template)
    labelled.worker_selector.match_labels["k"] = "v"
    assert (await stub.UpdateActor(pb.UpdateActorRequest(actor=labelled))).metadata.version > (
        during.metadata.version
    )
    assert state(await get_actor(stub, "busy", "u")) == "SUSPENDED"
    assert (await _resume(stub, "busy", "u")).resumed
    assert state((await resume).actor) == "RUNNING"
    for atespace in ("t", "u"):
        await _suspend(stub, "busy", atespace)


# ---------------------------------------------------------------------------- workers


@pytest.mark.parametrize("backend_options", [{"workers": 2, "actors_per_worker": 2}])
async def test_workers_hold_actors_up_to_their_capacity(stub: Any, backend: LocalBackend) -> None:
    """real: a worker has room while its allocated actors are fewer than its capacity
    (`HasRoom`, scheduling/scheduling.go@0d9382eb); ListWorkers shows both, and
    ListWorkerActorAssignments each placement {metadata.name = actor uid, actor, actor_uid,
    worker_epoch} (controlapi/worker.go@06e9dc87); with no room anywhere ResumeActor is
    RESOURCE_EXHAUSTED `no free workers available` (walkthrough read_file id 68660195273;
    functionaltest/worker_contention_test.go@0e4768ab). (June: FAILED_PRECONDITION, one actor
    per worker.) A missing worker is NOT_FOUND `Worker <name> not found`."""
    workers = await _workers(stub)
    assert len(workers) == 2
    for worker in workers:
        assert (worker.status.capacity.actors, worker.status.allocated.actors) == (2, 0)
        assert worker.status.state == pb.WORKER_STATE_ACTIVE
        assert worker.status.observed_epoch == worker.epoch >= 1
    names = [f"a{i}" for i in range(5)]
    for name in names:
        await make_actor(stub, name)
    placed: dict[str, list[str]] = {}
    for name in names[:4]:
        actor = (await _resume(stub, name)).actor
        placed.setdefault(actor.status.worker_assignment.worker.name, []).append(name)
    assert await answer(_resume(stub, names[4])) == (
        C.RESOURCE_EXHAUSTED,
        "no free workers available",
    )
    for worker in await _workers(stub):
        held = sorted(placed[worker.metadata.name])
        assert worker.status.allocated.actors == len(held) == 2
        listed = await stub.ListWorkerActorAssignments(
            pb.ListWorkerActorAssignmentsRequest(worker=pb.ObjectRef(name=worker.metadata.name))
        )
        rows = sorted(listed.actor_assignments, key=lambda a: a.actor.name)
        assert [a.actor.name for a in rows] == held
        for row in rows:
            actor = await get_actor(stub, row.actor.name)
            assert row.actor.atespace == "t"
            assert row.metadata.name == row.actor_uid == actor.metadata.uid
            assert row.worker_epoch == worker.epoch
    await _suspend(stub, names[0])
    assert state((await _resume(stub, names[4])).actor) == "RUNNING"
    missing = pb.GetWorkerRequest(worker=pb.ObjectRef(name="nope"))
    assert await answer(stub.GetWorker(missing)) == (C.NOT_FOUND, "Worker nope not found")
    for name in names[1:]:
        await _suspend(stub, name)


async def test_drain_worker_stops_placements_and_leaves_bound_actors(stub: Any) -> None:
    """real: DrainWorker sets WORKER_STATE_DRAINING and is idempotent (no version bump the
    second time); actors bound to it stay, new placements skip it (`Applies` needs ACTIVE)
    (controlapi/worker.go@06e9dc87, scheduling/scheduling.go@0d9382eb)."""
    await make_actor(stub, "a")
    await make_actor(stub, "b")
    a = (await _resume(stub, "a")).actor
    mine = a.status.worker_assignment.worker.name
    (other,) = [w for w in await _workers(stub) if w.metadata.name != mine]
    drained: pb.Worker = await stub.DrainWorker(
        pb.DrainWorkerRequest(worker=pb.ObjectRef(name=other.metadata.name))
    )
    assert drained.status.state == pb.WORKER_STATE_DRAINING
    assert drained.metadata.version == other.metadata.version + 1
    again: pb.Worker = await stub.DrainWorker(
        pb.DrainWorkerRequest(worker=pb.ObjectRef(name=other.metadata.name))
    )
    assert again.metadata.version == drained.metadata.version
    assert await answer(_resume(stub, "b")) == (C.RESOURCE_EXHAUSTED, NO_ROOM)
    await stub.DrainWorker(pb.DrainWorkerRequest(worker=pb.ObjectRef(name=mine)))
    assert state(await get_actor(stub, "a")) == "RUNNING"
    await _suspend(stub, "a")
    assert await answer(_resume(stub, "a")) == (C.RESOURCE_EXHAUSTED, NO_ROOM)


async def test_a_rising_worker_epoch_crashes_the_actors_it_held(stub: Any) -> None:
    """real: UpdateWorker may change only labels and epoch, under uid+version preconditions
    (controlapi/worker.go@06e9dc87); an epoch that rises means its ateom restarted: every actor
    it held from an earlier epoch, not SUSPENDED, is CRASHED with `ateom restarted while hosting
    the actor` (no prefix for a RUNNING one), and observed_epoch follows (kagent:controlapi/
    crash.go@2559ec02, ReconcileAssignments read_file id 70457524383, the exact text asserted
    in read_file id 70093466563)."""
    await make_actor(stub, "a")
    await make_actor(stub, "idle")
    running = (await _resume(stub, "a")).actor
    name = running.status.worker_assignment.worker.name
    worker: pb.Worker = await stub.GetWorker(pb.GetWorkerRequest(worker=pb.ObjectRef(name=name)))

    def update(**changes: Any) -> Any:
        sent = pb.Worker()
        sent.CopyFrom(worker)
        sent.ClearField("status")
        for key, value in changes.items():
            if key in ("uid", "version"):
                setattr(sent.metadata, key, value)
            else:
                setattr(sent, key, value)
        return stub.UpdateWorker(pb.UpdateWorkerRequest(worker=sent))

    assert await answer(update(uid="")) == (
        C.INVALID_ARGUMENT,
        f"while updating worker {name}: persistence: precondition required: uid",
    )
    stale = update(version=worker.metadata.version + 3, epoch=worker.epoch + 1)
    assert await answer(stale) == (C.ABORTED, "concurrent update conflict, please retry")
    assert (await answer(update(epoch=worker.epoch - 1)))[0] == C.INVALID_ARGUMENT
    risen: pb.Worker = await update(epoch=worker.epoch + 1)
    assert risen.epoch == risen.status.observed_epoch == worker.epoch + 1
    crashed = await wait_state(stub, "a", "CRASHED")
    assert crashed.status.crash.message == "ateom restarted while hosting the actor"
    assert crashed.status.crash.crash_time.ToNanoseconds() > 0
    assert not crashed.status.HasField("worker_assignment")
    assert state(await get_actor(stub, "idle")) == "SUSPENDED"
    after = await stub.GetWorker(pb.GetWorkerRequest(worker=pb.ObjectRef(name=name)))
    assert after.status.allocated.actors == 0
    await stub.DeleteActor(pb.DeleteActorRequest(actor=ref("a")))  # CRASHED: no any_state


# ---------------------------------------------------------------------------- crashes


async def test_a_wakeup_probe_that_never_answers_crashes_the_actor(
    stub: Any, backend: LocalBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """real: atelet polls the wakeup probe up to its timeout_seconds; a probe that never answers
    200 fails Restore, and ateapi CRASHES the actor with `resume failed: atelet Restore: <...>`,
    releasing its worker (kagent:controlapi/workflow_resume.go + crash.go@2559ec02, proto
    ContainerWakeupProbe: "A probe that does not answer 200 within timeout_seconds crashes the
    actor"). Here: a 1 s probe, the start allowance scaled to 0.5 s; the caller gets INTERNAL
    `actor <ref> crashed: atelet Restore: ...` (design.md)."""
    # the golden actor (ready at once) boots under the real allowance; the actor's restore not
    await register_template(backend, "for-never", late_workload(600), probe_timeout_s=1)
    await make_actor(stub, "never", template="for-never")
    monkeypatch.setattr(resume_module, "START_ALLOWANCE_S", 0.5)
    code, message = await answer(_resume(stub, "never"))
    assert code == C.INTERNAL
    assert message.startswith("actor t/never crashed: atelet Restore: "), message
    crashed = await get_actor(stub, "never")
    assert state(crashed) == "CRASHED"
    assert crashed.status.crash.message.startswith("resume failed: atelet Restore: ")
    assert not crashed.status.HasField("worker_assignment")
    assert all(w.status.allocated.actors == 0 for w in await _workers(stub))
    assert snapshots(crashed.status) == [(1, "TAG", ["DURABLE:COMPLETED"])]  # kept


@pytest.mark.parametrize("seen_by", ["watchdog", "router"])
async def test_a_sandbox_that_dies_while_running_crashes_the_actor(
    stub: Any, backend: LocalBackend, seen_by: str
) -> None:
    """real: an actor whose sandbox goes away under it is CRASHED, never silently RUNNING at a
    dead address (kagent:controlapi/crash.go@2559ec02; the worker-pod case, `crashBoundActor`,
    read_file id 70085660369). Here the backend's watchdog or the router (`sandbox_gone`, when
    it cannot reach the agent) sees the sandbox exit. (June: the actor stayed RUNNING.)"""
    assert backend.plane is not None
    await make_actor(stub, "dead")
    await _resume(stub, "dead")
    record = backend.plane.lookup("t", "dead")
    assert record is not None
    await kill_sandbox(backend, record.handle)
    if seen_by == "router":
        assert backend.runtime is not None
        await poll(
            lambda: backend.runtime.is_alive(record.handle),  # type: ignore[union-attr]
            lambda alive: not alive,
            "the sandbox's exit",
        )
        assert await backend.plane.sandbox_gone(record.key, record.handle)
    else:
        backend.plane.recovery.watch_interval_s = 0.05
    crashed = await wait_state(stub, "dead", "CRASHED")
    assert crashed.status.crash.message == "the actor's sandbox exited while it was running"
    assert all(w.status.allocated.actors == 0 for w in await _workers(stub))


async def test_a_crashed_actor_refuses_resume_suspend_and_pause(stub: Any) -> None:
    """real: CRASHED fails every state gate with FAILED_PRECONDITION: `AssignWorker prerequisite
    not met for Actor: <ref> (got: ACTOR_STATE_CRASHED, want ACTOR_STATE_SUSPENDED or
    ACTOR_STATE_PAUSED)` (resume), `MarkSuspending ... want ACTOR_STATE_RUNNING or
    ACTOR_STATE_PAUSED)`, `MarkPausing ... want ACTOR_STATE_RUNNING)` (kagent:controlapi/
    workflow_resume.go, workflow_suspend.go, workflow_pause.go@2559ec02); RevertActor takes it
    back to SUSPENDED with the crash cleared (workflow_revert.go@2559ec02)."""
    await make_actor(stub, "c")
    running = (await _resume(stub, "c")).actor
    worker = await stub.GetWorker(
        pb.GetWorkerRequest(worker=running.status.worker_assignment.worker)
    )
    sent = pb.Worker()
    sent.CopyFrom(worker)
    sent.epoch += 1
    await stub.UpdateWorker(pb.UpdateWorkerRequest(worker=sent))  # crashes what it held
    await wait_state(stub, "c", "CRASHED")
    r = ref("c")
    got = "(got: ACTOR_STATE_CRASHED"
    # one at a time: a gRPC call starts when it is made, and they would meet on the lease
    for call, expected in (
        (
            lambda: stub.ResumeActor(pb.ResumeActorRequest(actor=r)),
            f"AssignWorker prerequisite not met for Actor: t/c {got}, want "
            "ACTOR_STATE_SUSPENDED or ACTOR_STATE_PAUSED)",
        ),
        (
            lambda: stub.SuspendActor(pb.SuspendActorRequest(actor=r)),
            f"MarkSuspending prerequisite not met for Actor: t/c {got}, want "
            "ACTOR_STATE_RUNNING or ACTOR_STATE_PAUSED)",
        ),
        (
            lambda: stub.PauseActor(pb.PauseActorRequest(actor=r)),
            f"MarkPausing prerequisite not met for Actor: t/c {got}, want ACTOR_STATE_RUNNING)",
        ),
    ):
        assert await answer(call()) == (C.FAILED_PRECONDITION, expected)
    reverted = await _revert(stub, "c")
    assert state(reverted) == "SUSPENDED"
    assert not reverted.status.HasField("crash")
    assert state((await _resume(stub, "c")).actor) == "RUNNING"
    await _suspend(stub, "c")


async def test_a_restart_that_cannot_adopt_a_sandbox_crashes_its_actor(
    tmp_path: Path, runtime_name: str
) -> None:
    """real: a worker whose ateom restarted crashes the actors it held (`ateom restarted while
    hosting the actor`) and its epoch rises; a worker pod that goes away crashes them with
    `worker pod went away while hosting the actor` (kagent:controlapi/crash.go@2559ec02, rows
    11-12 of upstream-actors.md §12). Here: a backend restarted over running sandboxes adopts
    the live ones and crashes the one whose sandbox died meanwhile; `local down` (stop) crashes
    what still ran. Nothing falls back to an older snapshot silently."""
    state_dir = tmp_path / "state"
    options: dict[str, Any] = {
        "runtime": runtime_name,
        "workers": 3,
        "actors_per_worker": 1,
        "default_rootfs": "host",
    }
    first = LocalBackend(state_dir, **options)
    await first.start()
    try:
        await settle_golden(first)
        async with grpc.aio.insecure_channel(first.api_address) as channel:
            stub = pb_grpc.ControlStub(channel)  # type: ignore[no-untyped-call]
            for name in ("lost", "kept", "idle"):
                await make_actor(stub, name)
            for name in ("lost", "kept"):
                await _resume(stub, name)
            before = {w.metadata.name: w.epoch for w in await _workers(stub)}
            lost = await get_actor(stub, "lost")
            kept = await get_actor(stub, "kept")
        assert first.plane is not None
        handle = first.plane.state.actors["t/lost"].handle
        await first.detach()
    except BaseException:
        await first.stop()
        raise
    await kill_sandbox(first, handle)

    second = LocalBackend(state_dir, **options)
    async with second, grpc.aio.insecure_channel(second.api_address) as channel:
        stub = pb_grpc.ControlStub(channel)  # type: ignore[no-untyped-call]
        crashed = await get_actor(stub, "lost")
        assert state(crashed) == "CRASHED"
        assert crashed.status.crash.message == "ateom restarted while hosting the actor"
        adopted = await get_actor(stub, "kept")
        assert state(adopted) == "RUNNING"
        assert adopted.status.worker_assignment == kept.status.worker_assignment
        assert state(await get_actor(stub, "idle")) == "SUSPENDED"
        epochs = {w.metadata.name: (w.epoch, w.status.observed_epoch) for w in await _workers(stub)}
        risen = lost.status.worker_assignment.worker.name
        assert epochs[risen] == (before[risen] + 1, before[risen] + 1)
        assert all(epochs[n][0] == before[n] for n in before if n != risen)
        assert state(await _revert(stub, "lost")) == "SUSPENDED"
    assert await state_leftovers(state_dir) == []

    third = LocalBackend(state_dir, **options)
    async with third, grpc.aio.insecure_channel(third.api_address) as channel:
        stub = pb_grpc.ControlStub(channel)  # type: ignore[no-untyped-call]
        gone = await get_actor(stub, "kept")
        assert state(gone) == "CRASHED"
        assert gone.status.crash.message == "worker pod went away while hosting the actor"
    assert await state_leftovers(state_dir) == []


# ---------------------------------------------------------------------------- revert


async def test_revert_goes_back_to_the_last_durable_snapshot(
    stub: Any, backend: LocalBackend, http: aiohttp.ClientSession
) -> None:
    """real: RevertActor takes a RUNNING, PAUSED or CRASHED actor to SUSPENDED at its newest
    DURABLE COMPLETED snapshot, dropping LOCAL and unfinished ones and keeping
    last_assigned_generation (gens 2 durable, 3 local -> only 2 left, the next suspend is 4);
    anything else, SUSPENDED included, is FAILED_PRECONDITION `Actor <ref> is not in a revertable
    state (got: ACTOR_STATE_SUSPENDED, want one of [ACTOR_STATE_RUNNING ACTOR_STATE_PAUSED
    ACTOR_STATE_CRASHED])` (kagent:controlapi/workflow_revert.go@2559ec02, workflow_revert_test
    read_file id 70742329380)."""
    await make_actor(stub, "r")
    await _resume(stub, "r")
    await run_in(http, backend, "r", "echo one > /tmp/gs-one")
    suspended = await _suspend(stub, "r")
    assert snapshots(suspended.status) == [(2, "ACTOR", ["DURABLE:COMPLETED"])]
    await _resume(stub, "r")
    await run_in(http, backend, "r", "echo two > /tmp/gs-two")
    paused = await _pause(stub, "r")
    assert snapshots(paused.status) == [
        (2, "ACTOR", ["DURABLE:COMPLETED"]),
        (3, "ACTOR", ["LOCAL:COMPLETED"]),
    ]
    reverted = await _revert(stub, "r")
    assert state(reverted) == "SUSPENDED"
    assert snapshots(reverted.status) == [(2, "ACTOR", ["DURABLE:COMPLETED"])]
    assert reverted.status.last_assigned_generation == 3
    assert not reverted.status.assigned_node
    assert await answer(stub.RevertActor(pb.RevertActorRequest(actor=ref("r")))) == (
        C.FAILED_PRECONDITION,
        "Actor t/r is not in a revertable state (got: ACTOR_STATE_SUSPENDED, want one of "
        "[ACTOR_STATE_RUNNING ACTOR_STATE_PAUSED ACTOR_STATE_CRASHED])",
    )
    await _resume(stub, "r")
    seen = await run_in(http, backend, "r", "cat /tmp/gs-one; ls /tmp/gs-two 2>/dev/null; true")
    assert seen["stdout"] == "one\n"
    assert state(await _revert(stub, "r")) == "SUSPENDED"  # from RUNNING
    await _resume(stub, "r")
    again = await _suspend(stub, "r")
    assert snapshots(again.status) == [(4, "ACTOR", ["DURABLE:COMPLETED"])]


# ---------------------------------------------------------------------------- generations


async def test_pause_and_suspend_write_generations(stub: Any) -> None:
    """real: each Pause and each Suspend of a RUNNING actor takes a new generation
    (last_assigned_generation + 1): pause a LOCAL one (assigned_node kept, worker released),
    suspend a DURABLE one that replaces every older snapshot, a borrowed tag's included; a
    suspend of a PAUSED actor uploads its LOCAL snapshot into the same generation. A PAUSED
    actor's pause and a SUSPENDED actor's suspend are no-ops; a SUSPENDED actor cannot pause:
    `MarkPausing prerequisite not met for Actor: <ref> (got: ACTOR_STATE_SUSPENDED, want
    ACTOR_STATE_RUNNING)` (kagent:controlapi/workflow_pause.go, workflow_suspend.go,
    snapshot_helpers.go@2559ec02). (June: pause of a SUSPENDED actor and suspend of a PAUSED one
    were INTERNAL.)"""
    created = await make_actor(stub, "g")
    assert created.status.last_assigned_generation == 1
    assert await answer(_pause(stub, "g")) == (
        C.FAILED_PRECONDITION,
        "MarkPausing prerequisite not met for Actor: t/g (got: ACTOR_STATE_SUSPENDED, want "
        "ACTOR_STATE_RUNNING)",
    )
    same = await _suspend(stub, "g")
    assert same.metadata.version == created.metadata.version
    await _resume(stub, "g")
    paused = await _pause(stub, "g")
    assert state(paused) == "PAUSED"
    assert snapshots(paused.status) == [
        (1, "TAG", ["DURABLE:COMPLETED"]),
        (2, "ACTOR", ["LOCAL:COMPLETED"]),
    ]
    assert paused.status.last_assigned_generation == 2
    assert paused.status.assigned_node
    assert not paused.status.HasField("worker_assignment")
    assert (await _pause(stub, "g")).metadata.version == paused.metadata.version
    uploaded = await _suspend(stub, "g")
    assert state(uploaded) == "SUSPENDED"
    assert snapshots(uploaded.status) == [(2, "ACTOR", ["DURABLE:COMPLETED"])]
    assert uploaded.status.last_assigned_generation == 2
    assert not uploaded.status.assigned_node
    await _resume(stub, "g")
    again = await _suspend(stub, "g")
    assert snapshots(again.status) == [(3, "ACTOR", ["DURABLE:COMPLETED"])]
    assert again.status.last_assigned_generation == 3
    versions = [created, paused, uploaded, again]
    assert [a.metadata.version for a in versions] == sorted({a.metadata.version for a in versions})


def test_docstrings_cite_upstream_files() -> None:
    """Every test above names the upstream file (path@commit or a read_file id) it pins."""
    import sys

    module = sys.modules[__name__]
    for name, item in vars(module).items():
        if name.startswith("test_") and name != "test_docstrings_cite_upstream_files":
            doc = item.__doc__ or ""
            assert re.search(r"@[0-9a-f]{8}|read_file id \d+", doc), name
