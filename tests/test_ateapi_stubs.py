"""The committed ateapi stubs match ateapi.proto, and the API keeps upstream's shape."""

from __future__ import annotations

from gym_substrate.ateapi import _generate
from gym_substrate.ateapi import ateapi_pb2 as pb


def test_committed_stubs_are_fresh() -> None:
    assert _generate.stale_files() == []


def test_control_service_has_the_fourteen_upstream_rpcs() -> None:
    service = pb.DESCRIPTOR.services_by_name["Control"]
    assert service.full_name == "ateapi.Control"
    assert sorted(m.name for m in service.methods) == sorted(
        [
            "GetActor",
            "CreateActor",
            "UpdateActor",
            "SuspendActor",
            "PauseActor",
            "ResumeActor",
            "DeleteActor",
            "ListWorkers",
            "ListActors",
            "CreateAtespace",
            "GetAtespace",
            "ListAtespaces",
            "DeleteAtespace",
            "DebugClear",
        ]
    )


def test_actor_field_numbers_match_upstream() -> None:
    fields = {f.name: f.number for f in pb.Actor.DESCRIPTOR.fields}
    assert fields == {
        "actor_id": 1,
        "version": 2,
        "actor_template_namespace": 3,
        "actor_template_name": 4,
        "status": 5,
        "ateom_pod_namespace": 6,
        "ateom_pod_name": 7,
        "ateom_pod_ip": 8,
        "in_progress_snapshot": 10,
        "ateom_pod_uid": 11,
        "latest_snapshot_info": 12,
        "worker_selector": 13,
        "worker_pool_name": 14,
        "atespace": 15,
    }
    assert pb.Actor.Status.Value("STATUS_PAUSED") == 6
    assert pb.ResumeActorRequest.DESCRIPTOR.fields_by_name["boot"].number == 2
