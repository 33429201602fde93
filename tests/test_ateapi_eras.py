"""The ateapi release eras as tables, told apart from a server's own descriptors, and converted.

Evidence (search-index `read_file` ids; docs/compatibility.md has the table per release):
* v0.3 (v0.2.0/v0.3.0): a whole `ateapi.proto` of the v0.3 layout (id 70632467804; its
  ActorStatus 1-5 match the linear walkthrough of main on 2026-09-26, id 68660195273, word for
  word): `SnapshotConfig {on_pause=1, on_commit=2 (SnapshotContentScope UNSPECIFIED 0, FULL 1,
  DATA 2), on_resume=3 (OnResumeConfig {from_data=1 ResumeSource}), storage_location=4}`,
  `TagStatus {snapshot=1 ExternalSnapshot {snapshot_uri=1, content_scope=2,
  actor_template_uid=3}, actor_template_uid=2, storage_location=3}`, `ActorStatus` snapshots in
  3/4/5/8, `WorkerAssignment.worker_pod_ip=5` a string. The tag is set last by
  agent-substrate/substrate cmd/ateapi/internal/controlapi/workflow_tag.go@009b19c5 (id
  69753113848): a v0.3 tag is usable once `status.snapshot` is set.
* v0.4 (v0.4.0): the upgrade runbook (id 70908369137: on_pause removed in #2309, on_resume in
  #2105, `worker_pod_ips` repeated) and apivalidation/actor_template.go@05ff652f (id
  70376624845, on_commit only). storage_location keeps number 4: inferred (no v0.4.0 proto was
  found; the fork between v0.3.0 and v0.4.0, id 71367677312, renumbers nothing).
* current: upstream's ateapi.proto at 2179589f (id 70579357611), which our stubs follow.
"""

from __future__ import annotations

import pytest
from google.protobuf import descriptor_pb2

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.ateapi.codec import EraCodec
from gym_substrate.ateapi.eras import (
    CURRENT,
    ERAS,
    V03,
    V04,
    EraError,
    detect_era,
    era_file,
    parse_era,
)
from gym_substrate.nemo.control_client import tag_ready, tag_uri

_FDP = descriptor_pb2.FieldDescriptorProto


def _fields(era: str, message: str) -> dict[str, int]:
    (found,) = [m for m in era_file(era).message_type if m.name == message]
    return {f.name: f.number for f in found.field}


@pytest.mark.parametrize("era", ERAS)
def test_each_eras_descriptors_are_told_as_that_era(era: str) -> None:
    assert detect_era([era_file(era)]) == era
    EraCodec(era)  # the era's file builds a pool of its own (every type it names resolves)


def test_the_tables_are_the_releases_layouts() -> None:
    assert _fields(V03, "SnapshotConfig") == {
        "on_pause": 1,
        "on_commit": 2,
        "on_resume": 3,
        "storage_location": 4,
    }
    assert _fields(V04, "SnapshotConfig") == {"on_commit": 2, "storage_location": 4}
    assert _fields(CURRENT, "SnapshotConfig") == {"storage_location": 1, "preferred_fidelity": 2}
    assert _fields(V03, "TagStatus") == {
        "snapshot": 1,
        "actor_template_uid": 2,
        "storage_location": 3,
    }
    assert set(_fields(V04, "ActorStatus").values()) == {1, 2, 3, 4, 5, 7, 8, 9}
    assert _fields(CURRENT, "ActorStatus")["snapshots"] == 11


def test_a_newer_server_with_extra_fields_is_still_its_era() -> None:
    """upstream defaults.go@1638dcf4 (id 70244187320) sets a SnapshotConfig field that neither
    2179589f nor 0e4768ab has: a server that adds fields is still the era it extends."""
    proto = era_file(CURRENT)
    (config,) = [m for m in proto.message_type if m.name == "SnapshotConfig"]
    config.field.add(name="golden_snapshot_config", number=3, type=_FDP.TYPE_BOOL)
    assert detect_era([proto]) == CURRENT


def test_a_server_of_no_known_era_is_named_field_by_field() -> None:
    proto = era_file(CURRENT)
    (tag_status,) = [m for m in proto.message_type if m.name == "TagStatus"]
    tag_status.field[0].type_name = ".ateapi.ActorCrash"
    with pytest.raises(EraError, match=r"matches no era.*TagStatus\.snapshot = 1 is \.ateapi"):
        detect_era([proto])
    with pytest.raises(EraError, match="no message of package ateapi"):
        detect_era([descriptor_pb2.FileDescriptorProto(package="grpc.health.v1")])


def test_eras_are_named_by_release_or_era_and_nothing_else() -> None:
    assert [parse_era(t) for t in ("v0.3.0", "0.2.0", "v0.4.1", "main", "current")] == [
        V03,
        V03,
        V04,
        CURRENT,
        CURRENT,
    ]
    with pytest.raises(EraError, match=r"unknown ateapi era 'v0\.5'.*v0\.3, v0\.4, current"):
        parse_era("v0.5")


def _tag(status: int) -> pb.Tag:
    tag = pb.Tag(metadata=pb.ResourceMetadata(atespace="gym", name="t"))
    tag.status.actor_template_uid = "uid-1"
    snap = tag.status.snapshot
    snap.generation, snap.owner = 1, pb.SNAPSHOT_OWNER_TAG
    stored = snap.storage.add(durability=pb.SNAPSHOT_DURABILITY_DURABLE, status=status)  # type: ignore[arg-type]
    stored.fidelity = pb.SNAPSHOT_FIDELITY_MEMORY
    stored.object.snapshot_uri = "gs://b/atespaces/gym/tags/uid-2/"
    return tag


@pytest.mark.parametrize("era", [V03, V04])
def test_a_release_tag_is_ready_once_its_snapshot_is_set(era: str) -> None:
    """The issue's first symptom: a current client read a release's tag as never COMPLETED."""
    codec = EraCodec(era)
    wire = codec.encode(_tag(pb.SNAPSHOT_STORAGE_STATUS_COMPLETED))
    raw = codec.era_class("ateapi.Tag").FromString(wire)
    assert raw.status.snapshot.snapshot_uri == "gs://b/atespaces/gym/tags/uid-2/"  # type: ignore[attr-defined]
    back = codec.decode(pb.Tag, wire)
    assert tag_ready(back)
    assert tag_uri(back) == "gs://b/atespaces/gym/tags/uid-2/"
    pending = codec.decode(pb.Tag, codec.encode(_tag(pb.SNAPSHOT_STORAGE_STATUS_IN_PROGRESS)))
    assert not tag_ready(pending)
    assert not pb.Tag.FromString(wire).status.snapshot.storage  # what the old client read


@pytest.mark.parametrize("era", [V03, V04])
def test_a_template_is_written_with_the_eras_snapshot_settings(era: str) -> None:
    template = pb.ActorTemplate(metadata=pb.ResourceMetadata(atespace="gym", name="t"))
    template.snapshot_config.storage_location = "gs://bucket/snapshots"
    template.snapshot_config.preferred_fidelity = pb.SNAPSHOT_FIDELITY_MEMORY
    codec = EraCodec(era)
    raw = codec.era_class("ateapi.ActorTemplate").FromString(codec.encode(template))
    config = raw.snapshot_config  # type: ignore[attr-defined]
    assert config.storage_location == "gs://bucket/snapshots"
    assert config.on_commit == 1  # SNAPSHOT_CONTENT_SCOPE_FULL
    if era == V03:
        assert (config.on_pause, config.on_resume.from_data) == (1, 1)  # FULL, COLD_BOOT
    assert codec.decode(pb.ActorTemplate, codec.encode(template)) == template


@pytest.mark.parametrize("era", [V03, V04])
def test_an_actor_borrowing_a_tag_reads_as_borrowing_it(era: str) -> None:
    """The ExternalSnapshot era's CreateActor copies the tag's ExternalSnapshot into the
    actor's status (controlapi/actor.go@18d1c266, id 70770430215: a tree between v0.3.0 and
    v0.4.0, cited here for that era only; 2179589f's own actor.go, id 70296854730, stamps a
    generation 1 owned by TAG instead): read back, it is a TAG-owned generation with the tag's
    URI, which the borrowed-snapshot guard looks for."""
    actor = pb.Actor(metadata=pb.ResourceMetadata(atespace="gym", name="a"))
    actor.status.state = pb.ACTOR_STATE_PAUSED
    actor.status.worker_assignment.worker_pod_ips.append("10.1.2.3")
    borrowed = _tag(pb.SNAPSHOT_STORAGE_STATUS_COMPLETED).status.snapshot
    actor.status.snapshots.append(borrowed)
    local = actor.status.snapshots.add(generation=2, owner=pb.SNAPSHOT_OWNER_ACTOR)
    stored = local.storage.add(durability=pb.SNAPSHOT_DURABILITY_LOCAL)
    stored.status = pb.SNAPSHOT_STORAGE_STATUS_COMPLETED
    stored.local.snapshot_name = "pause-2"
    codec = EraCodec(era)
    back = codec.decode(pb.Actor, codec.encode(actor))
    assert back.status.state == pb.ACTOR_STATE_PAUSED
    assert list(back.status.worker_assignment.worker_pod_ips) == ["10.1.2.3"]
    owners = [(s.owner, s.storage[0].durability) for s in back.status.snapshots]
    assert owners == [
        (pb.SNAPSHOT_OWNER_TAG, pb.SNAPSHOT_DURABILITY_DURABLE),
        (pb.SNAPSHOT_OWNER_ACTOR, pb.SNAPSHOT_DURABILITY_LOCAL),
    ]
    assert back.status.snapshots[0].storage[0].object.snapshot_uri.endswith("/tags/uid-2/")
    assert back.status.snapshots[1].storage[0].local.snapshot_name == "pause-2"
