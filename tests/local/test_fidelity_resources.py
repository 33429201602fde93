"""The local API's resources behave as today's ateapi's: metadata, validation, templates with
golden tags, tags, atespaces and paging.

One test per behaviour of issue 20 §2, each through the gRPC API of a started LocalBackend, on
both runtimes (process and gVisor). Each docstring says what upstream does and where: paths under
cmd/ateapi/internal/ of agent-substrate/substrate (or `kagent:` for its mirror kagent-dev/
substrate, whose files at 2559ec02/447b0ad3 use the names of the proto we speak,
ateapi.proto@2179589f). Actors, workers and
crashes are in test_fidelity_control.py.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from local_helpers import (
    RUNTIMES,
    actor_message,
    answer,
    durable_uri,
    ensure_atespace,
    get_actor,
    late_workload,
    make_actor,
    ref,
    register_template,
    run_in,
    settle_golden,
    snapshots,
    state,
    template_message,
)

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.local import LocalBackend
from gym_substrate.local.control import golden as golden_module

C = grpc.StatusCode
DNS_LABEL = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and "
    "must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex "
    "used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
MISSING_IMAGE = "local/nope@sha256:" + "0" * 64


@pytest.fixture(params=RUNTIMES)
def runtime_name(request: pytest.FixtureRequest) -> str:
    """Every backend test here runs on both local runtimes."""
    name: str = request.param
    return name


def _seconds(stamp: Timestamp) -> float:
    return stamp.ToNanoseconds() / 1e9


def _is_uuid4(value: str) -> bool:
    try:
        return uuid.UUID(value).version == 4 and str(uuid.UUID(value)) == value
    except ValueError:
        return False


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | 0x80 if value else low)
        if not value:
            return bytes(out)


def _unknown(number: int) -> bytes:
    """A varint field this API does not declare (a newer or an older client's)."""
    return _varint(number << 3) + _varint(42)


async def _default_template(stub: Any) -> pb.ActorTemplate:
    template: pb.ActorTemplate = await stub.GetActorTemplate(
        pb.GetActorTemplateRequest(actor_template=ref("sandbox", "local"))
    )
    return template


async def _get_template(stub: Any, name: str, atespace: str = "local") -> pb.ActorTemplate:
    template: pb.ActorTemplate = await stub.GetActorTemplate(
        pb.GetActorTemplateRequest(actor_template=ref(name, atespace))
    )
    return template


async def _suspended_with_snapshot(stub: Any, name: str, atespace: str = "t") -> pb.Actor:
    """An actor that ran once and was suspended: it holds a DURABLE snapshot of its own."""
    await make_actor(stub, name, atespace)
    await stub.ResumeActor(pb.ResumeActorRequest(actor=ref(name, atespace)))
    response = await stub.SuspendActor(pb.SuspendActorRequest(actor=ref(name, atespace)))
    actor: pb.Actor = response.actor
    return actor


async def _create_tag(
    stub: Any, name: str, source: str, atespace: str = "t", scope: int = pb.TAG_SCOPE_ATESPACE
) -> pb.Tag:
    tag = pb.Tag(
        metadata=pb.ResourceMetadata(atespace=atespace, name=name),
        scope=scope,  # type: ignore[arg-type]
        source_actor=ref(source, atespace),
    )
    created: pb.Tag = await stub.CreateTag(pb.CreateTagRequest(tag=tag))
    return created


# ---------------------------------------------------------------------------- metadata


async def test_resources_carry_server_metadata(stub: Any) -> None:
    """real: Create scrubs what the server owns (uid, version, create_time, update_time) and any
    status the caller sent; the store gives a random v4 uid, version 1 and create_time =
    update_time = now; every later write bumps the version by one and update_time, keeping uid
    and create_time (kagent:store/atepg/atepg.go@042414e0 setCreateMetadata/
    setUpdateMetadata; scrubResourceMetadataForCreate read_file id 60319967285;
    functionaltest/atespace_test.go@2e3e300a, functionaltest/actor_template_test.go@0e4768ab)."""
    forged = pb.ResourceMetadata(
        name="meta",
        uid="11111111-2222-4333-8444-555555555555",
        version=7,
        create_time=Timestamp(seconds=1),
        update_time=Timestamp(seconds=2),
    )
    space: pb.Atespace = await stub.CreateAtespace(
        pb.CreateAtespaceRequest(atespace=pb.Atespace(metadata=forged))
    )
    base = await _default_template(stub)
    template = template_message(base, "tpl", late_workload(0), atespace="meta")
    template.metadata.MergeFrom(forged)
    template.metadata.atespace = "meta"
    template.metadata.name = "tpl"
    template.status.golden_snapshot_status.error_message = "forged"
    created_template: pb.ActorTemplate = await stub.CreateActorTemplate(
        pb.CreateActorTemplateRequest(actor_template=template)
    )
    actor = actor_message("a", "meta")
    actor.metadata.MergeFrom(forged)
    actor.metadata.name = "a"
    actor.status.state = pb.ACTOR_STATE_CRASHED
    actor.status.crash.message = "forged"
    created_actor: pb.Actor = await stub.CreateActor(pb.CreateActorRequest(actor=actor))
    for created in (space, created_template, created_actor):
        meta = created.metadata
        assert _is_uuid4(meta.uid), meta
        assert meta.uid != forged.uid
        assert meta.version == 1
        assert meta.create_time == meta.update_time
        assert _seconds(meta.create_time) > 1_700_000_000
    assert len({space.metadata.uid, created_template.metadata.uid, created_actor.metadata.uid}) == 3
    assert not created_template.status.golden_snapshot_status.error_message
    assert state(created_actor) == "SUSPENDED"
    assert not created_actor.status.HasField("crash")

    # every write: one version up, a later update_time, the same uid and create_time
    seen = [created_actor]
    resumed = await stub.ResumeActor(pb.ResumeActorRequest(actor=ref("a", "meta")))
    seen.append(resumed.actor)  # two writes: RESUMING, then RUNNING
    seen.append((await stub.SuspendActor(pb.SuspendActorRequest(actor=ref("a", "meta")))).actor)
    seen.append(await get_actor(stub, "a", "meta"))
    versions = [a.metadata.version for a in seen]
    assert versions[0] < versions[1] < versions[2] == versions[3], versions
    assert resumed.actor.metadata.version == 3
    for actor_seen in seen:
        assert actor_seen.metadata.uid == created_actor.metadata.uid
        assert actor_seen.metadata.create_time == created_actor.metadata.create_time
    stamps = [_seconds(a.metadata.update_time) for a in seen]
    assert stamps == sorted(stamps)
    await stub.DeleteActor(pb.DeleteActorRequest(actor=ref("a", "meta")))


# ---------------------------------------------------------------------------- the wire


async def test_unknown_request_fields_are_refused(stub: Any, backend: LocalBackend) -> None:
    """real: RejectUnknownFieldsUnaryInterceptor refuses a request holding fields the server
    does not know, before any handler: INVALID_ARGUMENT, one `<path>: Invalid value: unknown
    field with protobuf tag <N>` per message that holds some (the first tag), `request` for
    the top level (internal/ateinterceptors/rejectunknown_test.go@2e3e300a, the chain in
    cmd/ateapi/main.go read_file id 70520562568); the refusal carries the elapsed trailer."""
    async with grpc.aio.insecure_channel(backend.api_address) as channel:

        def raw(method: str, response: Any) -> Any:
            return channel.unary_unary(
                f"/ateapi.Control/{method}",
                request_serializer=lambda payload: payload,
                response_deserializer=response.FromString,
            )

        create_atespace = raw("CreateAtespace", pb.Atespace)
        plain = pb.CreateAtespaceRequest(
            atespace=pb.Atespace(metadata=pb.ResourceMetadata(name="unk"))
        ).SerializeToString()
        call = create_atespace(plain + _unknown(99))
        assert await answer(call) == (
            C.INVALID_ARGUMENT,
            "request: Invalid value: unknown field with protobuf tag 99",
        )
        assert re.fullmatch(r"\d+", dict(await call.trailing_metadata())["x-server-elapsed-us"])
        # two on one message: one error, naming the first
        assert await answer(create_atespace(plain + _unknown(98) + _unknown(99))) == (
            C.INVALID_ARGUMENT,
            "request: Invalid value: unknown field with protobuf tag 98",
        )
        metadata = pb.ResourceMetadata.FromString(
            pb.ResourceMetadata(atespace="t", name="a").SerializeToString() + _unknown(9999)
        )
        actor = actor_message("a")
        actor.metadata.CopyFrom(metadata)
        nested = pb.CreateActorRequest(actor=actor).SerializeToString()
        await ensure_atespace(stub, "t")
        create_actor = raw("CreateActor", pb.Actor)
        assert await answer(create_actor(nested)) == (
            C.INVALID_ARGUMENT,
            "actor.metadata: Invalid value: unknown field with protobuf tag 9999",
        )
        assert await answer(create_actor(nested + _unknown(7))) == (
            C.INVALID_ARGUMENT,
            "[request: Invalid value: unknown field with protobuf tag 7, actor.metadata: Invalid "
            "value: unknown field with protobuf tag 9999]",
        )
        # nothing was created, and the same requests without the unknown fields work
        assert await answer(stub.GetActor(pb.GetActorRequest(actor=ref("a")))) == (
            C.NOT_FOUND,
            "Actor t/a not found",
        )
        assert (await create_atespace(plain)).metadata.name == "unk"


async def test_validation_errors_read_as_kubernetes_field_errors(stub: Any) -> None:
    """real: every request is validated first (declarative validation from the proto's `+k8s:`
    tags plus apivalidation's rules) and refused with INVALID_ARGUMENT carrying the field
    errors' aggregate: `<path>: Required value`, `<path>: Invalid value: "<v>": <detail>`,
    several as `[e1, e2]` (resources.ToAPIError read_file id 70618905453; kagent:cmd/ateapi/
    internal/apivalidation/actor_test.go@2559ec02, apivalidation/tag.go@18d1c266,
    resources.ValidatePinnedImage read_file id 71544887124)."""
    await ensure_atespace(stub, "t")
    eleven = {f"k{i}": "v" for i in range(11)}
    bad_name = actor_message("ID1")
    no_name = pb.Actor(metadata=pb.ResourceMetadata(atespace="t"))
    crowded = actor_message("a", labels=eleven)
    odd_tag = pb.Tag(
        metadata=pb.ResourceMetadata(atespace="u", name="v"),
        scope=pb.TAG_SCOPE_ATESPACE,
        source_actor=ref("a"),
    )
    unscoped = pb.Tag(metadata=pb.ResourceMetadata(atespace="t", name="v"), source_actor=ref("a"))
    base = await _default_template(stub)
    unpinned = template_message(base, "x", ("true",))
    unpinned.containers[0].image = "ubuntu"
    cases: list[tuple[Callable[[], Awaitable[Any]], str]] = [
        (lambda: stub.CreateActor(pb.CreateActorRequest()), "actor: Required value"),
        (
            lambda: stub.CreateActor(pb.CreateActorRequest(actor=bad_name)),
            f'actor.metadata.name: Invalid value: "ID1": {DNS_LABEL}',
        ),
        (
            lambda: stub.CreateActor(pb.CreateActorRequest(actor=no_name)),
            "[actor.metadata.name: Required value, actor.actor_template: Required value]",
        ),
        (
            lambda: stub.CreateActor(pb.CreateActorRequest(actor=crowded)),
            "actor.worker_selector.match_labels: Too many: 11: must have at most 10 items",
        ),
        (lambda: stub.GetActor(pb.GetActorRequest()), "actor: Required value"),
        (
            lambda: stub.GetActor(pb.GetActorRequest(actor=pb.ObjectRef(name="a"))),
            "actor.atespace: Required value",
        ),
        (lambda: stub.CreateAtespace(pb.CreateAtespaceRequest()), "atespace: Required value"),
        (
            lambda: stub.ListActors(pb.ListActorsRequest(page_size=-1)),
            "page_size: Invalid value: -1: must be greater than or equal to 1",
        ),
        (
            lambda: stub.DeleteActor(
                pb.DeleteActorRequest(actor=ref("a"), options=pb.DeleteOptions(uid="X"))
            ),
            'options.uid: Invalid value: "X": must be a lowercase UUID in 8-4-4-4-12 format',
        ),
        (
            lambda: stub.CreateTag(pb.CreateTagRequest(tag=unscoped)),
            "tag.scope: Required value",
        ),
        (
            lambda: stub.CreateTag(pb.CreateTagRequest(tag=odd_tag)),
            'tag.metadata.atespace: Invalid value: "u": must match source_actor.atespace',
        ),
        (
            lambda: stub.CreateActorTemplate(
                pb.CreateActorTemplateRequest(actor_template=unpinned)
            ),
            'actor_template.containers[0].image: Invalid value: "ubuntu": must be pinned by '
            "digest (changing the image invalidates snapshots)",
        ),
    ]
    for call, message in cases:
        assert await answer(call()) == (C.INVALID_ARGUMENT, message)
    assert (await stub.ListActors(pb.ListActorsRequest(atespace="t"))).actors == []


async def test_names_that_are_not_short_names_are_invalid_argument(stub: Any) -> None:
    """real: `actor.name` has `+k8s:format=k8s-short-name` (ateapi.proto@2179589f), so every
    actor RPC refuses a name that is not a DNS label, INVALID_ARGUMENT `actor.name: Invalid
    value: "<name>": ...`, before looking anything up (kagent:cmd/ateapi/internal/
    apivalidation/actor_test.go@2559ec02). (June: only emptiness was checked, and the
    name was NOT_FOUND.)"""
    for name in ("Not_A_Label", "a.b", "x-", "a" * 64, "a\n"):
        for method in ("Get", "Resume", "Suspend", "Pause", "Revert", "Delete"):
            request = getattr(pb, f"{method}ActorRequest")(actor=ref(name))
            call = getattr(stub, f"{method}Actor")
            code, message = await answer(call(request))
            assert code == C.INVALID_ARGUMENT
            assert message.startswith("actor.name: Invalid value: "), message


# ---------------------------------------------------------------------------- templates


async def test_templates_are_created_got_listed_and_deleted(
    stub: Any, backend: LocalBackend
) -> None:
    """real: CreateActorTemplate applies defaults (preferred_fidelity MEMORY, a probe's
    timeout 30 s and path "/") and answers version 1 with an empty status; templates are
    immutable (no Update RPC): a second create is ALREADY_EXISTS `ActorTemplate <ref> already
    exists`; Get of a missing one NOT_FOUND `ActorTemplate <ref> not found`; Delete checks
    DeleteOptions first (ABORTED `ActorTemplate <ref> does not have uid <uid>` / `concurrent
    update conflict, please retry`), removes the golden tag and answers the template
    (functionaltest/actor_template_test.go@0e4768ab, defaults/defaults.go@1638dcf4,
    controlapi/actor_template.go read_file id 70454797860)."""
    await ensure_atespace(stub, "tpl")
    base = await _default_template(stub)
    wanted = template_message(base, "x", late_workload(0), atespace="tpl")
    wanted.snapshot_config.preferred_fidelity = pb.SNAPSHOT_FIDELITY_UNSPECIFIED
    wanted.containers[0].wakeup_probe.timeout_seconds = 0
    wanted.containers[0].wakeup_probe.http_get.path = ""
    request = pb.CreateActorTemplateRequest(actor_template=wanted)
    created: pb.ActorTemplate = await stub.CreateActorTemplate(request)
    assert (created.metadata.atespace, created.metadata.name, created.metadata.version) == (
        "tpl",
        "x",
        1,
    )
    assert created.snapshot_config.preferred_fidelity == pb.SNAPSHOT_FIDELITY_MEMORY
    probe = created.containers[0].wakeup_probe
    assert (probe.timeout_seconds, probe.http_get.path) == (30, "/")
    assert created.HasField("status")
    assert not created.status.golden_snapshot_status.golden_tag.name
    assert await answer(stub.CreateActorTemplate(request)) == (
        C.ALREADY_EXISTS,
        "ActorTemplate tpl/x already exists",
    )
    await settle_golden(backend)
    got = await _get_template(stub, "x", "tpl")
    assert got.metadata.uid == created.metadata.uid
    assert got.containers == created.containers
    golden = got.status.golden_snapshot_status.golden_tag
    assert (golden.atespace, golden.name) == ("ate-golden", created.metadata.uid)
    listed = await stub.ListActorTemplates(pb.ListActorTemplatesRequest(atespace="tpl"))
    assert [t.metadata.name for t in listed.actor_templates] == ["x"]
    everywhere = await stub.ListActorTemplates(pb.ListActorTemplatesRequest())
    assert [(t.metadata.atespace, t.metadata.name) for t in everywhere.actor_templates] == [
        ("local", "sandbox"),
        ("tpl", "x"),
    ]
    assert await answer(
        stub.GetActorTemplate(pb.GetActorTemplateRequest(actor_template=ref("nope", "tpl")))
    ) == (C.NOT_FOUND, "ActorTemplate tpl/nope not found")

    def delete(**options: Any) -> Any:
        return stub.DeleteActorTemplate(
            pb.DeleteActorTemplateRequest(
                actor_template=ref("x", "tpl"), options=pb.DeleteOptions(**options)
            )
        )

    other = str(uuid.uuid4())
    assert await answer(delete(uid=other)) == (
        C.ABORTED,
        f"ActorTemplate tpl/x does not have uid {other}",
    )
    assert await answer(delete(version=got.metadata.version + 1)) == (
        C.ABORTED,
        "concurrent update conflict, please retry",
    )
    deleted: pb.ActorTemplate = await delete(uid=got.metadata.uid)
    assert deleted.metadata.uid == created.metadata.uid
    assert await answer(
        stub.GetActorTemplate(pb.GetActorTemplateRequest(actor_template=ref("x", "tpl")))
    ) == (C.NOT_FOUND, "ActorTemplate tpl/x not found")
    assert (await answer(stub.GetTag(pb.GetTagRequest(tag=golden))))[0] == C.NOT_FOUND


async def test_a_new_template_gets_a_published_golden_tag(stub: Any, backend: LocalBackend) -> None:
    """real: the template reconciler builds each template's golden snapshot through the public
    RPCs: it creates `ate-golden` and the golden actor `ate-golden/<template uid>`, resumes it
    (a cold boot waiting for the probes), suspends it, tags it as the PUBLISHED tag of the same
    name, deletes the actor and records `status.golden_snapshot_status.golden_tag`
    (controlapi/template_reconciler.go@00cd6e96, read_file id 70530578725); an actor created
    afterwards borrows the golden tag's snapshot (functionaltest/actor_template_test.go@0e4768ab
    TestGoldenTagLifecycle)."""
    template = await register_template(backend, "goldie", late_workload(0))
    uid = template.metadata.uid
    golden = template.status.golden_snapshot_status
    assert not golden.error_message
    assert (golden.golden_tag.atespace, golden.golden_tag.name) == ("ate-golden", uid)
    assert golden.snapshot_time.ToNanoseconds() > 0
    tag: pb.Tag = await stub.GetTag(pb.GetTagRequest(tag=golden.golden_tag))
    assert tag.scope == pb.TAG_SCOPE_PUBLISHED
    assert (tag.source_actor.atespace, tag.source_actor.name) == ("ate-golden", uid)
    assert tag.status.actor_template_uid == uid
    assert snapshots(tag.status) == [(1, "TAG", ["DURABLE:COMPLETED"])]
    assert _seconds(tag.metadata.create_time) >= _seconds(golden.snapshot_time)
    assert await answer(stub.GetActor(pb.GetActorRequest(actor=ref(uid, "ate-golden")))) == (
        C.NOT_FOUND,
        f"Actor ate-golden/{uid} not found",
    )
    spaces = await stub.ListAtespaces(pb.ListAtespacesRequest())
    assert "ate-golden" in [a.metadata.name for a in spaces.atespaces]
    actor = await make_actor(stub, "heir", template="goldie")
    assert durable_uri(actor.status.snapshots[0]) == durable_uri(tag.status.snapshot)
    assert actor.status.snapshots[0].actor_template_uid == uid
    assert state((await stub.ResumeActor(pb.ResumeActorRequest(actor=ref("heir")))).actor) == (
        "RUNNING"
    )
    await stub.SuspendActor(pb.SuspendActorRequest(actor=ref("heir")))


async def test_a_template_without_probes_warms_up_before_its_golden_snapshot(
    stub: Any, backend: LocalBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """real: the golden actor runs a warm-up before it is suspended: 0 s when every container
    has a wakeup probe, else 20 s; `snapshot_time` records when it ends, and the golden tag is
    taken after it (controlapi/template_reconciler.go@00cd6e96, proto GoldenSnapshotStatus).
    The 20 s are scaled to 1 s here."""
    monkeypatch.setattr(golden_module, "WARMUP_S", 1.0)
    template = await register_template(backend, "unprobed", late_workload(0), probe=False)
    status = template.status.golden_snapshot_status
    assert not status.error_message
    assert _seconds(status.snapshot_time) >= _seconds(template.metadata.create_time) + 1.0
    tag: pb.Tag = await stub.GetTag(pb.GetTagRequest(tag=status.golden_tag))
    assert _seconds(tag.metadata.create_time) >= _seconds(status.snapshot_time)


async def test_a_template_whose_image_is_missing_ends_golden_actor_crashed(
    stub: Any, backend: LocalBackend
) -> None:
    """real: a golden actor that crashes (here: its image cannot be found on this machine, as an
    image that cannot be pulled) ends the build for good with `error_message`
    `GoldenActorCrashed: golden actor crashed before its snapshot was taken: <crash message>`
    and no golden tag (controlapi/template_reconciler.go@00cd6e96); actors of the template then
    start with no snapshot (actor.go@447b0ad3 in kagent: no golden tag, last generation 0)."""
    await ensure_atespace(stub, "tpl")
    base = await _default_template(stub)
    template = template_message(base, "broken", late_workload(0), atespace="tpl")
    template.containers[0].image = MISSING_IMAGE
    await stub.CreateActorTemplate(pb.CreateActorTemplateRequest(actor_template=template))
    await settle_golden(backend)
    status = (await _get_template(stub, "broken", "tpl")).status.golden_snapshot_status
    prefix = (
        "GoldenActorCrashed: golden actor crashed before its snapshot was taken: "
        "resume failed: atelet Run: "
    )
    assert status.error_message.startswith(prefix), status.error_message
    assert MISSING_IMAGE in status.error_message
    assert not status.golden_tag.name
    actor = await make_actor(stub, "orphan", "tpl", template="broken", template_atespace="tpl")
    assert (list(actor.status.snapshots), actor.status.last_assigned_generation) == ([], 0)


async def test_what_the_backend_cannot_honour_is_failed_precondition(stub: Any) -> None:
    """real: a valid template is stored as given (controlapi/actor_template.go read_file id
    70454797860); this backend refuses at create, FAILED_PRECONDITION naming each reason, what
    it could only ignore: a second container, resource limits, a microVM, volumes other than
    images, a snapshot store off this machine (docs/compatibility.md). Validation still comes
    first (INVALID_ARGUMENT, resources.ValidatePinnedImage read_file id 71544887124)."""
    await ensure_atespace(stub, "tpl")
    base = await _default_template(stub)
    two = template_message(base, "two", ("true",), atespace="tpl")
    two.containers.add().CopyFrom(two.containers[0])
    two.containers[1].name = "second"
    limited = template_message(base, "limited", ("true",), atespace="tpl")
    limited.resources.limits.add(name="cpu", quantity="1")
    remote = template_message(base, "remote", ("true",), atespace="tpl")
    remote.snapshot_config.storage_location = "gs://bucket/snapshots"
    microvm = template_message(base, "microvm", ("true",), atespace="tpl")
    microvm.sandbox_config.sandbox_class = pb.SANDBOX_CLASS_MICROVM
    for template, reason in (
        (two, "containers: the local backend runs one container per actor, this template has 2"),
        (limited, "resources: the local backend does not enforce limits; remove them"),
        (remote, "snapshot_config.storage_location: the local backend keeps snapshots on this"),
        (microvm, "sandbox_config.sandbox_class: no microVMs here"),
    ):
        request = pb.CreateActorTemplateRequest(actor_template=template)
        code, message = await answer(stub.CreateActorTemplate(request))
        assert code == C.FAILED_PRECONDITION
        assert reason in message, message
    listed = await stub.ListActorTemplates(pb.ListActorTemplatesRequest(atespace="tpl"))
    assert list(listed.actor_templates) == []


# ---------------------------------------------------------------------------- tags


async def test_create_tag_only_from_a_suspended_actor(stub: Any) -> None:
    """real: CreateTag takes the source actor's lease, needs it SUSPENDED (FAILED_PRECONDITION
    `Actor <ref> must be ACTOR_STATE_SUSPENDED to be tagged (got: ACTOR_STATE_RUNNING)`), copies
    its durable snapshot into the tag's own storage and answers once that storage is COMPLETED,
    recording the template uid and the source actor; a taken name is ALREADY_EXISTS `Tag <ref>
    already exists; delete it and create it again to retry`; a missing source NOT_FOUND
    (controlapi/workflow_tag.go@009b19c5, controlapi/tag.go@7aefe96e,
    functionaltest/tag_test.go@072b6962)."""
    await make_actor(stub, "src")
    running = (await stub.ResumeActor(pb.ResumeActorRequest(actor=ref("src")))).actor
    assert await answer(_create_tag(stub, "v1", "src")) == (
        C.FAILED_PRECONDITION,
        "Actor t/src must be ACTOR_STATE_SUSPENDED to be tagged (got: ACTOR_STATE_RUNNING)",
    )
    suspended = (await stub.SuspendActor(pb.SuspendActorRequest(actor=ref("src")))).actor
    tag = await _create_tag(stub, "v1", "src")
    assert snapshots(tag.status) == [(1, "TAG", ["DURABLE:COMPLETED"])]
    assert tag.status.actor_template_uid == running.status.snapshots[0].actor_template_uid
    assert (tag.source_actor.atespace, tag.source_actor.name) == ("t", "src")
    assert tag.scope == pb.TAG_SCOPE_ATESPACE
    own, copy = durable_uri(suspended.status.snapshots[0]), durable_uri(tag.status.snapshot)
    assert copy != own
    assert f"/atespaces/t/tags/{tag.metadata.uid}" in copy
    assert await answer(_create_tag(stub, "v1", "src")) == (
        C.ALREADY_EXISTS,
        "Tag t/v1 already exists; delete it and create it again to retry",
    )
    assert await answer(_create_tag(stub, "v2", "nobody")) == (
        C.NOT_FOUND,
        "Actor t/nobody not found",
    )
    assert (await stub.GetTag(pb.GetTagRequest(tag=ref("v1")))) == tag
    assert await answer(stub.GetTag(pb.GetTagRequest(tag=ref("v9")))) == (
        C.NOT_FOUND,
        "Tag t/v9 not found",
    )


async def test_an_actor_from_a_tag_sees_the_files_written_before_the_suspend(
    stub: Any, backend: LocalBackend, http: aiohttp.ClientSession
) -> None:
    """real: CreateActor with `source_tag` starts SUSPENDED borrowing the tag's snapshot
    (generation 1, owner TAG) and its first resume restores it: the fork sees what the source
    wrote before its suspend (kagent:controlapi/actor.go@447b0ad3 `resolveTagSource`;
    proto Tag: "the Actor as of this call"). A fork is Suspend, CreateTag, CreateActor(
    source_tag), Resume (no live fork RPC)."""
    await make_actor(stub, "src")
    await stub.ResumeActor(pb.ResumeActorRequest(actor=ref("src")))
    marker = uuid.uuid4().hex
    await run_in(http, backend, "src", f"echo {marker} > /tmp/gs-fork")
    await stub.SuspendActor(pb.SuspendActorRequest(actor=ref("src")))
    tag = await _create_tag(stub, "snap", "src")
    fork = await make_actor(stub, "fork", source_tag=ref("snap"))
    assert state(fork) == "SUSPENDED"
    assert (fork.source_tag.atespace, fork.source_tag.name) == ("t", "snap")
    assert snapshots(fork.status) == [(1, "TAG", ["DURABLE:COMPLETED"])]
    assert durable_uri(fork.status.snapshots[0]) == durable_uri(tag.status.snapshot)
    assert fork.status.last_assigned_generation == 1
    await stub.ResumeActor(pb.ResumeActorRequest(actor=ref("fork")))
    seen = await run_in(http, backend, "fork", "cat /tmp/gs-fork")
    assert seen["stdout"] == f"{marker}\n"
    await stub.SuspendActor(pb.SuspendActorRequest(actor=ref("fork")))


async def test_a_tag_serves_its_template_and_its_scope(stub: Any, backend: LocalBackend) -> None:
    """real: CreateActor(source_tag) checks, in order: the tag exists (FAILED_PRECONDITION `Tag
    not found`), an ATESPACE tag is used in its own atespace only (`Tag is not published outside
    its Atespace`), it is complete, and it was taken under the new actor's template (`source Tag
    must be taken from an actor with ActorTemplate uid "<tag's uid>"`) (kagent:controlapi/
    actor.go@447b0ad3, e2e read_file id 70119532403). UpdateTag changes only the scope, under
    uid+version preconditions: none is INVALID_ARGUMENT `while updating tag <ref>: persistence:
    precondition required: uid`, a stale version ABORTED `concurrent update conflict, please
    retry`, a stale uid ABORTED `Tag <ref> not found with uid <uid>` (controlapi/
    tag.go@7aefe96e, functionaltest/tag_test.go@072b6962); PUBLISHED serves every atespace."""
    await _suspended_with_snapshot(stub, "src")
    tag = await _create_tag(stub, "v1", "src")
    await ensure_atespace(stub, "u")
    await register_template(backend, "other", late_workload(0))
    assert await answer(
        stub.CreateActor(pb.CreateActorRequest(actor=actor_message("x", source_tag=ref("nope"))))
    ) == (C.FAILED_PRECONDITION, "Tag not found")
    elsewhere = actor_message("x", "u", source_tag=ref("v1"))
    assert await answer(stub.CreateActor(pb.CreateActorRequest(actor=elsewhere))) == (
        C.FAILED_PRECONDITION,
        "Tag is not published outside its Atespace",
    )
    wrong = actor_message("x", template="other", source_tag=ref("v1"))
    assert await answer(stub.CreateActor(pb.CreateActorRequest(actor=wrong))) == (
        C.FAILED_PRECONDITION,
        "source Tag must be taken from an actor with ActorTemplate uid "
        f'"{tag.status.actor_template_uid}"',
    )

    def update(**meta: Any) -> Any:
        sent = pb.Tag()
        sent.CopyFrom(tag)
        sent.ClearField("status")
        sent.scope = pb.TAG_SCOPE_PUBLISHED
        for key, value in meta.items():
            setattr(sent.metadata, key, value)
        return stub.UpdateTag(pb.UpdateTagRequest(tag=sent))

    assert await answer(update(uid="")) == (
        C.INVALID_ARGUMENT,
        "while updating tag t/v1: persistence: precondition required: uid",
    )
    assert await answer(update(version=tag.metadata.version + 1)) == (
        C.ABORTED,
        "concurrent update conflict, please retry",
    )
    other_uid = str(uuid.uuid4())
    assert await answer(update(uid=other_uid)) == (
        C.ABORTED,
        f"Tag t/v1 not found with uid {other_uid}",
    )
    published: pb.Tag = await update()
    assert published.scope == pb.TAG_SCOPE_PUBLISHED
    assert published.metadata.version == tag.metadata.version + 1
    assert published.status == tag.status
    assert state(await make_actor(stub, "x", "u", source_tag=ref("v1"))) == "SUSPENDED"


async def test_delete_tag_strands_the_actors_that_borrow_it(stub: Any) -> None:
    """real: DeleteTag checks DeleteOptions first (ABORTED `Tag <ref> does not have uid <uid>`),
    collects the tag's snapshot and answers the deleted tag; it does not refuse while actors
    created from it still borrow the snapshot: those that never suspended are stranded (proto
    DeleteTagRequest, controlapi/tag.go@7aefe96e). A stranded actor's resume cannot restore
    and CRASHES it (`resume failed: atelet Restore: ...`, kagent:controlapi/crash.go@2559ec02)."""
    await _suspended_with_snapshot(stub, "src")
    tag = await _create_tag(stub, "v1", "src")
    await make_actor(stub, "fork", source_tag=ref("v1"))
    folder = Path(durable_uri(tag.status.snapshot).removeprefix("file://localhost"))
    assert await asyncio.to_thread(folder.is_dir)
    other = str(uuid.uuid4())
    request = pb.DeleteTagRequest(tag=ref("v1"), options=pb.DeleteOptions(uid=other))
    assert await answer(stub.DeleteTag(request)) == (
        C.ABORTED,
        f"Tag t/v1 does not have uid {other}",
    )
    deleted: pb.Tag = await stub.DeleteTag(pb.DeleteTagRequest(tag=ref("v1")))
    assert deleted.metadata.uid == tag.metadata.uid
    assert not await asyncio.to_thread(folder.exists)
    assert (await answer(stub.GetTag(pb.GetTagRequest(tag=ref("v1")))))[0] == C.NOT_FOUND
    stranded = await get_actor(stub, "fork")
    assert durable_uri(stranded.status.snapshots[0]) == durable_uri(tag.status.snapshot)
    code, _ = await answer(stub.ResumeActor(pb.ResumeActorRequest(actor=ref("fork"))))
    assert code == C.INTERNAL
    crashed = await get_actor(stub, "fork")
    assert state(crashed) == "CRASHED"
    assert crashed.status.crash.message.startswith("resume failed: atelet Restore: ")


# ---------------------------------------------------------------------------- atespaces


async def test_atespaces_are_deleted_only_when_empty(stub: Any, backend: LocalBackend) -> None:
    """real: CreateAtespace refuses a taken name (ALREADY_EXISTS `Atespace <n> already
    exists`), `ate-golden` included (no name is reserved; the reconciler creates it through
    this RPC); DeleteAtespace checks DeleteOptions (ABORTED `Atespace <n> does not have uid
    <uid>`), refuses while any actor, tag or template is in it (FAILED_PRECONDITION `Atespace
    <n> is not empty`) and answers the deleted atespace; Get of a missing one is NOT_FOUND
    (controlapi/atespace.go@13a12512, controlapi/atespace_test.go@18d1c266,
    functionaltest/atespace_test.go@2e3e300a)."""
    await ensure_atespace(stub, "team-a")
    duplicate = pb.CreateAtespaceRequest(
        atespace=pb.Atespace(metadata=pb.ResourceMetadata(name="team-a"))
    )
    assert await answer(stub.CreateAtespace(duplicate)) == (
        C.ALREADY_EXISTS,
        "Atespace team-a already exists",
    )
    golden = pb.CreateAtespaceRequest(
        atespace=pb.Atespace(metadata=pb.ResourceMetadata(name="ate-golden"))
    )
    assert await answer(stub.CreateAtespace(golden)) == (
        C.ALREADY_EXISTS,
        "Atespace ate-golden already exists",
    )
    listed = await stub.ListAtespaces(pb.ListAtespacesRequest())
    assert [a.metadata.name for a in listed.atespaces] == ["ate-golden", "local", "team-a"]
    space: pb.Atespace = await stub.GetAtespace(
        pb.GetAtespaceRequest(atespace=pb.ObjectRef(name="team-a"))
    )
    assert await answer(
        stub.GetAtespace(pb.GetAtespaceRequest(atespace=pb.ObjectRef(name="nope")))
    ) == (C.NOT_FOUND, "Atespace nope not found")

    def delete(**options: Any) -> Any:
        return stub.DeleteAtespace(
            pb.DeleteAtespaceRequest(
                atespace=pb.ObjectRef(name="team-a"), options=pb.DeleteOptions(**options)
            )
        )

    not_empty = (C.FAILED_PRECONDITION, "Atespace team-a is not empty")
    await _suspended_with_snapshot(stub, "a", "team-a")
    assert await answer(delete()) == not_empty  # an actor
    await _create_tag(stub, "v1", "a", "team-a")
    await stub.DeleteActor(pb.DeleteActorRequest(actor=ref("a", "team-a")))
    assert await answer(delete()) == not_empty  # a tag
    await stub.DeleteTag(pb.DeleteTagRequest(tag=ref("v1", "team-a")))
    await register_template(backend, "x", late_workload(0), atespace="team-a")
    assert await answer(delete()) == not_empty  # a template
    await stub.DeleteActorTemplate(pb.DeleteActorTemplateRequest(actor_template=ref("x", "team-a")))
    other = str(uuid.uuid4())
    assert await answer(delete(uid=other)) == (
        C.ABORTED,
        f"Atespace team-a does not have uid {other}",
    )
    assert await answer(delete(version=space.metadata.version + 1)) == (
        C.ABORTED,
        "concurrent update conflict, please retry",
    )
    deleted: pb.Atespace = await delete(uid=space.metadata.uid)
    assert deleted.metadata == space.metadata
    assert (await answer(delete()))[0] == C.NOT_FOUND


# ---------------------------------------------------------------------------- paging


async def _walk(call: Any, request_cls: Any, field: str, **fields: Any) -> list[Any]:
    """Every page of one List at page_size 1; checks each page holds at most one row."""
    rows: list[Any] = []
    token = ""
    for _ in range(100):
        page = await call(request_cls(page_size=1, page_token=token, **fields))
        got = list(getattr(page, field))
        assert len(got) <= 1
        rows += got
        token = page.next_page_token
        if not token:
            return rows
    raise AssertionError(f"{request_cls.__name__} still had a token after 100 pages")


@pytest.mark.parametrize("backend_options", [{"workers": 2, "actors_per_worker": 2}])
async def test_every_list_pages_with_tokens(stub: Any, backend: LocalBackend) -> None:
    """real: every List pages by key: page_size 0 or over 1000 is 1000, a negative one
    INVALID_ARGUMENT `page_size: Invalid value: -1: must be greater than or equal to 1`;
    `next_page_token` is empty on the last page; a token the server did not issue for this
    list and filter is INVALID_ARGUMENT `invalid page_token` (controlapi/pagination.go@18d1c266,
    store/atepg/pagetoken.go@b52b2e27). Rows come ordered by (atespace, name), or by name in one
    atespace (functionaltest/atespace_test.go@2e3e300a). (June: a bad token was INTERNAL.)"""
    await register_template(backend, "second", late_workload(0))
    for atespace, name in (("t", "a"), ("t", "b"), ("u", "c")):
        await _suspended_with_snapshot(stub, name, atespace)
    for atespace, name, source in (("t", "v1", "a"), ("t", "v2", "b"), ("u", "v1", "c")):
        await _create_tag(stub, name, source, atespace)
    for name in ("a", "b"):
        await stub.ResumeActor(pb.ResumeActorRequest(actor=ref(name)))
    await stub.ResumeActor(pb.ResumeActorRequest(actor=ref("c", "u")))
    workers = (await stub.ListWorkers(pb.ListWorkersRequest())).workers
    (busy,) = [w for w in workers if w.status.allocated.actors == 2]
    worker = pb.ObjectRef(name=busy.metadata.name)

    lists: list[tuple[str, Any, Any, str, dict[str, Any]]] = [
        ("ListAtespaces", stub.ListAtespaces, pb.ListAtespacesRequest, "atespaces", {}),
        ("ListActors", stub.ListActors, pb.ListActorsRequest, "actors", {}),
        ("ListActors t", stub.ListActors, pb.ListActorsRequest, "actors", {"atespace": "t"}),
        (
            "ListActorTemplates",
            stub.ListActorTemplates,
            pb.ListActorTemplatesRequest,
            "actor_templates",
            {},
        ),
        ("ListTags", stub.ListTags, pb.ListTagsRequest, "tags", {}),
        ("ListTags t", stub.ListTags, pb.ListTagsRequest, "tags", {"atespace": "t"}),
        ("ListWorkers", stub.ListWorkers, pb.ListWorkersRequest, "workers", {}),
        (
            "ListWorkerActorAssignments",
            stub.ListWorkerActorAssignments,
            pb.ListWorkerActorAssignmentsRequest,
            "actor_assignments",
            {"worker": worker},
        ),
    ]
    tokens: dict[str, str] = {}
    for label, call, request_cls, field, fields in lists:
        whole = list(getattr(await call(request_cls(**fields)), field))
        assert len(whole) >= 2, label
        assert await _walk(call, request_cls, field, **fields) == whole, label
        huge = await call(request_cls(page_size=5000, **fields))
        assert (list(getattr(huge, field)), huge.next_page_token) == (whole, ""), label
        first = await call(request_cls(page_size=1, **fields))
        tokens[label] = first.next_page_token
        assert await answer(call(request_cls(page_size=-1, **fields))) == (
            C.INVALID_ARGUMENT,
            "page_size: Invalid value: -1: must be greater than or equal to 1",
        ), label
        for token in ("%%%", "!!!!", "dC9h\n"):
            assert await answer(call(request_cls(page_token=token, **fields))) == (
                C.INVALID_ARGUMENT,
                "invalid page_token",
            ), (label, token)

    def names(rows: list[Any]) -> list[tuple[str, str]]:
        return [(r.metadata.atespace, r.metadata.name) for r in rows]

    everything = await stub.ListActors(pb.ListActorsRequest())
    assert names(list(everything.actors)) == [("t", "a"), ("t", "b"), ("u", "c")]
    tags = await stub.ListTags(pb.ListTagsRequest())
    assert names(list(tags.tags))[-3:] == [("t", "v1"), ("t", "v2"), ("u", "v1")]
    # a token of another list, or of the same list under another filter, is refused
    wrong = [
        (stub.ListTags, pb.ListTagsRequest, tokens["ListActors"], {}),
        (stub.ListActors, pb.ListActorsRequest, tokens["ListActors t"], {}),
        (stub.ListActors, pb.ListActorsRequest, tokens["ListActors"], {"atespace": "t"}),
        (stub.ListWorkers, pb.ListWorkersRequest, tokens["ListAtespaces"], {}),
    ]
    for call, request_cls, token, fields in wrong:
        assert await answer(call(request_cls(page_token=token, **fields))) == (
            C.INVALID_ARGUMENT,
            "invalid page_token",
        )
    empty = await stub.ListTags(pb.ListTagsRequest(atespace="nobody"))
    assert (list(empty.tags), empty.next_page_token) == ([], "")
    for atespace, name in (("t", "a"), ("t", "b"), ("u", "c")):
        await stub.SuspendActor(pb.SuspendActorRequest(actor=ref(name, atespace)))
