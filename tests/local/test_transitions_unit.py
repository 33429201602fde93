"""No actor stays RESUMING, PAUSING, SUSPENDING, REVERTING or DELETING once its operation ended.

Issue 29: a resume whose runtime raised an error of an unexpected class (an `ip` failure)
left its actor RESUMING on its worker slot for good; four such actors held every slot and the
backend served nothing more. Here a failure is injected at each step of a resume, a pause, a
suspend, a revert and a delete, with error classes nobody lists, and every time the actor ends
in a settled state, its slot is free (or held only by a RUNNING actor), no sandbox of it runs
unless it is RUNNING, and the caller got an error. Upstream crashes an actor whose resume or
checkpoint fails (`resume failed: atelet Restore: ...`, controlapi/crash.go and
workflow_resume.go at 2179589f, read_file id 70296854730 for actor.go); the watchdog repairs an
actor left in a transition with no operation behind it, on the plane's injected clock.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from control_fakes import Clock, FakeRuntime, create_actor, start_plane, stop_plane

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.core.states import TRANSITIONAL_STATES
from gym_substrate.local.control import parking as parking_module
from gym_substrate.local.control.plane import ControlPlane
from gym_substrate.local.control.records import CRASHED, PAUSED, RESUMING, RUNNING, SUSPENDED
from gym_substrate.local.control.resume import Resume
from gym_substrate.local.control.transitions import ORPHAN_GRACE_S
from gym_substrate.local.errors import AteapiError

REF = pb.ObjectRef(atespace="t", name="a")


class Unexpected(Exception):
    """An error class no workflow names (as `CommandError` from `ip` was)."""


def _settled(plane: ControlPlane, runtime: FakeRuntime, key: str = "t/a") -> str:
    record = plane.state.actors[key]
    assert record.state not in TRANSITIONAL_STATES, record
    holders = {s: k for w in plane.pool.all() for s, k in plane.pool.holders(w).items()}
    running = record.state == RUNNING
    assert (key in holders.values()) == running, (record.state, holders)
    assert (key in runtime.alive.values()) == running, (record.state, runtime.alive)
    return record.state


async def _inject(monkeypatch: pytest.MonkeyPatch, target: Any, name: str) -> None:
    async def fail(*args: Any, **kwargs: Any) -> Any:
        raise Unexpected(f"injected in {name}")

    monkeypatch.setattr(target, name, fail)


def _raising(name: str) -> Callable[..., Any]:
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise Unexpected(f"injected in {name}")

    return fail


RESUME_STEPS = ["runtime.start", "spec", "source", "record RUNNING"]


@pytest.mark.parametrize("step", RESUME_STEPS)
async def test_a_resume_that_fails_at_any_step_crashes_and_frees_the_slot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    runtime = FakeRuntime()
    plane = await start_plane(tmp_path, runtime)
    create_actor(plane, "a")
    if step == "runtime.start":
        await _inject(monkeypatch, runtime, "start")
    elif step == "spec":
        monkeypatch.setattr(plane.shared, "spec", _raising("spec"))
    elif step == "source":
        monkeypatch.setattr(Resume, "_source", _raising("source"))
    else:
        real_save = plane.state.save

        def save(record: Any, **changes: Any) -> Any:
            if changes.get("state") == RUNNING:
                raise Unexpected("injected in record RUNNING")
            return real_save(record, **changes)

        monkeypatch.setattr(plane.state, "save", save)
    with pytest.raises(AteapiError) as raised:
        await plane.resume.run("t/a")
    assert "injected" in raised.value.message
    assert _settled(plane, runtime) == CRASHED
    assert "resume failed" in plane.state.actors["t/a"].crash_message
    monkeypatch.undo()
    await plane.revert.rpc(pb.RevertActorRequest(actor=REF))  # and it can go on
    await plane.resume.run("t/a")
    assert _settled(plane, runtime) == RUNNING
    await stop_plane(plane)


PARK_STEPS = ["checkpoint", "checkpoint (sandbox survives)", "commit", "finish"]


@pytest.mark.parametrize("operation", ["pause", "suspend"])
@pytest.mark.parametrize("step", PARK_STEPS)
async def test_a_park_that_fails_at_any_step_settles_the_actor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str, operation: str
) -> None:
    runtime = FakeRuntime()
    plane = await start_plane(tmp_path, runtime)
    create_actor(plane, "a")
    await plane.resume.run("t/a")
    if step.startswith("checkpoint"):
        runtime.survive_failure = "survives" in step
        runtime.fail_checkpoint = Unexpected("injected in checkpoint")  # type: ignore[assignment]
    elif step == "commit":
        monkeypatch.setattr(parking_module, "commit_snapshot", _raising("commit"))
    else:
        monkeypatch.setattr(plane.parking, "finish", _raising("finish"))
    park = (
        plane.parking.pause(pb.PauseActorRequest(actor=REF))
        if operation == "pause"
        else plane.parking.suspend(pb.SuspendActorRequest(actor=REF))
    )
    with pytest.raises(AteapiError):
        await park
    expected = RUNNING if step == "checkpoint (sandbox survives)" else CRASHED
    assert _settled(plane, runtime) == expected
    await stop_plane(plane)


async def test_a_suspend_of_a_paused_actor_whose_upload_fails_settles_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime = FakeRuntime()
    plane = await start_plane(tmp_path, runtime)
    create_actor(plane, "a")
    await plane.resume.run("t/a")
    await plane.parking.pause(pb.PauseActorRequest(actor=REF))
    await _inject(monkeypatch, runtime, "upload")
    with pytest.raises(AteapiError):
        await plane.parking.suspend(pb.SuspendActorRequest(actor=REF))
    assert _settled(plane, runtime) in (PAUSED, CRASHED)
    await stop_plane(plane)


@pytest.mark.parametrize("operation", ["revert", "delete"])
async def test_a_revert_or_delete_that_fails_midway_crashes_the_actor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, operation: str
) -> None:
    runtime = FakeRuntime()
    plane = await start_plane(tmp_path, runtime)
    create_actor(plane, "a")
    await plane.resume.run("t/a")
    real_release, calls = plane.pool.release, []

    def release_once(*args: Any) -> None:  # the workflow's own release fails, the crash's not
        calls.append(args)
        if len(calls) == 1:
            raise Unexpected("injected in pool.release")
        real_release(*args)

    monkeypatch.setattr(plane.pool, "release", release_once)
    call = (
        plane.revert.rpc(pb.RevertActorRequest(actor=REF))
        if operation == "revert"
        else plane.actors.delete(pb.DeleteActorRequest(actor=REF, any_state=True))
    )
    with pytest.raises(AteapiError, match="injected"):
        await call
    monkeypatch.undo()
    record = plane.state.actors["t/a"]
    assert record.state == CRASHED, record
    assert f"{operation} failed" in record.crash_message
    await plane.actors.delete(pb.DeleteActorRequest(actor=REF))  # a crashed actor goes
    assert "t/a" not in plane.state.actors
    await stop_plane(plane)


async def test_the_watchdog_repairs_a_transition_with_no_operation_behind_it(
    tmp_path: Path,
) -> None:
    """A resume whose caller went away leaves RESUMING for the next ResumeActor (upstream);
    nobody coming back within the grace period, the watchdog crashes it, counts it, and its
    slot is free. An actor whose operation still holds its lease is never touched."""
    clock = Clock()
    runtime = FakeRuntime()
    plane = await start_plane(tmp_path, runtime, clock=clock)
    record = create_actor(plane, "a")
    create_actor(plane, "b")
    placement = plane.pool.place("t/a", [])
    plane.state.save(record, state=RESUMING, worker=placement.worker.meta.name, slot=placement.slot)
    await plane.recovery.watch_once()
    assert plane.state.actors["t/a"].state == RESUMING  # within the grace period
    async with plane.locks.lock("t/b"):
        plane.state.save(plane.state.actors["t/b"], state=RESUMING)
        clock.now += ORPHAN_GRACE_S + 1
        await plane.recovery.watch_once()
        assert plane.state.actors["t/b"].state == RESUMING  # its operation still runs
    assert _settled(plane, runtime) == CRASHED
    assert "no operation behind it" in plane.state.actors["t/a"].crash_message
    counted = plane.metrics.orphaned_transitions.labels("RESUMING")._value.get()
    assert counted == 1
    plane.state.save(plane.state.actors["t/b"], state=SUSPENDED)
    await stop_plane(plane)
