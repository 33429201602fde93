"""Current-era answers the local backend got wrong (issue 30, part 6), on the scripted runtime.

Each test reads upstream's Go source of the current vintage (the `Snapshot`/`SnapshotStorage`
messages, `apierror`): search `read_file` ids, and repo@commit where the reader showed them.
- SuspendActor of a PAUSED actor with no completed local snapshot crashes it and returns a plain
  Go error, which `ateinterceptors.ServerUnaryInterceptor` turns into INTERNAL `internal server
  error: <err>` (agent-substrate/substrate internal/ateinterceptors/ateinterceptors.go@2e3e300a,
  id 70464300292; ensureMarkedSuspending in workflow_suspend.go, id 70362821796). Ours said
  UNKNOWN.
- PauseActor's ensureMarkedPausing: PAUSING goes on, anything not RUNNING is refused
  `MarkPausing prerequisite not met`, and only then a golden actor is refused (workflow_pause.go,
  id 70284215644). Ours put the golden rule first.
- CreateActor resolves the explicit tag or the template's golden tag with resolveTagSource; a
  tag that is not there is FAILED_PRECONDITION `Tag not found` (controlapi/actor.go, id
  70149405852; the golden default at the same place in the walkthrough, id 68660195273). Ours
  booted cold when the named golden tag was gone. A template with no golden tag yet (its build
  still running, the golden builder's own actor) still boots cold: `tagRef == nil`.
"""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from control_fakes import FakeRuntime, create_actor, start_plane, stop_plane

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.local.control.records import GOLDEN_ATESPACE, PAUSED, SUSPENDED
from gym_substrate.local.errors import AteapiError

C = grpc.StatusCode


async def test_suspending_a_paused_actor_without_its_local_snapshot_is_internal(
    tmp_path: Path,
) -> None:
    plane = await start_plane(tmp_path, FakeRuntime())
    try:
        record = create_actor(plane, "a")
        plane.state.save(record, state=PAUSED, snapshots=())
        with pytest.raises(AteapiError) as caught:
            await plane.parking.suspend(
                pb.SuspendActorRequest(actor=pb.ObjectRef(atespace="t", name="a"))
            )
        assert (caught.value.code, caught.value.message) == (
            C.INTERNAL,
            "internal server error: actor is CRASHED because it was in PAUSED state with no "
            "completed local snapshot",
        )
        assert plane.state.actor("t/a").state == "CRASHED"
    finally:
        await stop_plane(plane)


async def test_pause_checks_running_before_the_golden_rule(tmp_path: Path) -> None:
    plane = await start_plane(tmp_path, FakeRuntime())
    try:
        template = plane.state.templates["local/sandbox"]
        plane.atespaces.ensure(GOLDEN_ATESPACE)
        plane.actors.insert(GOLDEN_ATESPACE, "g", template, source=None)
        ref = pb.ObjectRef(atespace=GOLDEN_ATESPACE, name="g")
        with pytest.raises(AteapiError) as caught:
            await plane.parking.pause(pb.PauseActorRequest(actor=ref))
        assert caught.value.code == C.FAILED_PRECONDITION
        assert caught.value.message == (
            f"MarkPausing prerequisite not met for Actor: {GOLDEN_ATESPACE}/g (got: "
            "ACTOR_STATE_SUSPENDED, want ACTOR_STATE_RUNNING)"
        )
        await plane.resume.run(f"{GOLDEN_ATESPACE}/g")
        with pytest.raises(AteapiError, match="golden actors, which cannot be paused"):
            await plane.parking.pause(pb.PauseActorRequest(actor=ref))
    finally:
        await stop_plane(plane)


async def test_a_golden_tag_that_is_gone_is_tag_not_found(tmp_path: Path) -> None:
    plane = await start_plane(tmp_path, FakeRuntime())
    try:
        template = plane.state.templates["local/sandbox"]
        assert template.golden_tag
        await plane.tags.remove(plane.state.tags[template.golden_tag])
        with pytest.raises(AteapiError) as caught:
            create_actor(plane, "a")
        assert (caught.value.code, caught.value.message) == (
            C.FAILED_PRECONDITION,
            "Tag not found",
        )
        # no golden tag recorded yet (a build still running): the actor boots cold
        plane.state.save(template, golden_tag="")
        record = create_actor(plane, "b")
        assert record.state == SUSPENDED
        assert record.snapshots == ()
    finally:
        await stop_plane(plane)
