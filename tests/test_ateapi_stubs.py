"""The committed ateapi stubs match ateapi.proto, and the API keeps upstream's current shape.

The field numbers are upstream's, read from pkg/proto/ateapipb/ateapi.proto at commit 2179589f
(agent-substrate/substrate); a number that drifts is a message a real server misreads.
tests/conformance/ checks every message against a second proto written independently from the
same tables.
"""

from __future__ import annotations

from gym_substrate.ateapi import _generate
from gym_substrate.ateapi import ateapi_pb2 as pb


def test_committed_stubs_are_fresh() -> None:
    assert _generate.stale_files() == []


def test_control_serves_every_current_rpc_and_no_june_one() -> None:
    service = pb.DESCRIPTOR.services_by_name["Control"]
    assert service.full_name == "ateapi.Control"
    names = {m.name for m in service.methods}
    assert len(names) == 42
    new = {"RevertActor", "CreateTag", "CreateActorTemplate", "ListWorkerActorAssignments"}
    assert new <= names
    assert "DebugClear" not in names
    assert "SessionIdentity" not in pb.DESCRIPTOR.services_by_name


def test_actor_is_a_resource_with_a_status() -> None:
    assert {f.name: f.number for f in pb.Actor.DESCRIPTOR.fields} == {
        "metadata": 1,
        "actor_template": 4,
        "worker_selector": 5,
        "source_tag": 6,
        "status": 7,
    }
    assert {f.name: f.number for f in pb.ActorStatus.DESCRIPTOR.fields} == {
        "state": 1,
        "worker_assignment": 2,
        "external_volumes": 7,
        "crash": 9,
        "assigned_node": 10,
        "snapshots": 11,
        "last_assigned_generation": 12,
    }
    assert pb.ActorState.Value("ACTOR_STATE_CRASHED") == 7
    assert pb.ActorState.Value("ACTOR_STATE_REVERTING") == 9


def test_requests_carry_object_refs_and_list_actors_is_renumbered() -> None:
    assert pb.ResumeActorRequest.DESCRIPTOR.fields_by_name["actor"].message_type.name == "ObjectRef"
    fields = {f.name: f.number for f in pb.ListActorsRequest.DESCRIPTOR.fields}
    assert fields == {"atespace": 1, "page_size": 2, "page_token": 3}
    assert pb.ResumeActorResponse.DESCRIPTOR.fields_by_name["resumed"].number == 2
    assert pb.DeleteActorRequest.DESCRIPTOR.fields_by_name["any_state"].number == 2
