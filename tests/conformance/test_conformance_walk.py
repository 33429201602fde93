"""A client built only from upstream's ateapi walks a local backend through an actor's life.

The client is independent of our generated code: message classes come from
`upstream/ateapi_upstream.proto` (agent-substrate/substrate `pkg/proto/ateapipb/ateapi.proto` at
commit 2179589ffdc1d10c8a676042ac8355682863553d), compiled at test time into a descriptor pool of
its own, and every call goes over a `grpc.aio` channel's `unary_unary` with those classes'
serializers (upstream_ateapi.ControlClient). The sandbox is reached through the router with the
header `ate-target-actor: <atespace>/<name>`, speaking the sandbox agent's HTTP contract
(agent/contract.md) with plain aiohttp.

Behaviour pinned here, with where upstream defines it (the local fidelity
suite's docstrings cite the Go files and commits; the proto is the contract):
- CreateActorTemplate stores a template in an existing atespace; the server builds its golden
  snapshot and records `status.golden_snapshot_status.golden_tag` = `ate-golden/<template uid>`,
  or a terminal `error_message` (proto `GoldenSnapshotStatus`, `DeleteActorTemplate` comment;
  controlapi/template_reconciler.go, upstream-resources.md §1).
- CreateActor answers a SUSPENDED actor with a server uid and version >= 1 (proto `Actor`,
  `ResourceMetadata`; controlapi/actor.go, upstream-actors.md §2).
- ResumeActor answers `resumed=True` and RUNNING, then `resumed=False` while it runs (proto
  `ResumeActorResponse`; workflow_resume.go, upstream-actors.md §5).
- SuspendActor of a RUNNING actor leaves it SUSPENDED holding a DURABLE COMPLETED snapshot
  (workflow_suspend.go, upstream-actors.md §6).
- CreateTag of a SUSPENDED actor copies that snapshot; the tag is usable once its DURABLE
  storage is COMPLETED, and records the template uid (proto `Tag`, `TagStatus`; workflow_tag.go,
  upstream-resources.md §2.1). CreateActor with `source_tag` starts from it (§2.5): a file
  written before the suspend is there after the fork resumes.
- RevertActor takes a RUNNING actor back to SUSPENDED (workflow_revert.go, upstream-actors.md §8).
- DeleteActor with any_state answers the deleted Actor; it is gone afterwards (workflow_delete.go,
  upstream-actors.md §4).
- ListActors pages with page_size and next_page_token until the token is empty (proto
  `ListActorsRequest`/`Response`; controlapi/pagination.go, upstream-actors.md §15).
- A request carrying fields the server does not know is refused with INVALID_ARGUMENT naming
  `unknown field with protobuf tag <N>`, before any handler runs
  (`RejectUnknownFieldsUnaryInterceptor`, upstream-actors.md §11): a client still speaking the
  June API (CreateActorRequest{1: ActorRef, 2: template namespace, 3: template name}) is
  refused and creates nothing.

Each release era (issue 30): the backend started with `api_era` v0.3 and v0.4 (process runtime
only, to keep CI's time) is walked by the same client speaking that era on the wire
(`EraWalkClient`: upstream's messages converted by `EraCodec(era).stub`), after reflection names
the era (`eras.detect_era`); the walk's checks read the one current model back.

Needs a running local backend: on the process runtime (the default `local/sandbox` template
runs on the Debian rootfs, hence the `rootfs` marker) and under gVisor (`runsc`).
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import grpc
import pytest
from google.protobuf import unknown_fields
from google.protobuf.message import Message
from upstream_ateapi import ControlClient, Upstream

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.ateapi.codec import EraCodec
from gym_substrate.ateapi.eras import CURRENT, V03, V04, detect_era
from gym_substrate.ateapi.reflect import reflect
from gym_substrate.local import LocalBackend

pytestmark = [pytest.mark.slow, pytest.mark.rootfs, pytest.mark.timeout(900)]

# (runtime, era): every runtime on the current era, the release eras on the process runtime
WALKS = [
    ("process", CURRENT),
    pytest.param("gvisor", CURRENT, marks=pytest.mark.runsc),
    ("process", V03),
    ("process", V04),
]

DEFAULT_TEMPLATE = ("local", "sandbox")  # design.md: the local backend's default template
GOLDEN_ATESPACE = "ate-golden"
TARGET_HEADER = "ate-target-actor"

GOLDEN_DEADLINE_S = 300.0
TAG_DEADLINE_S = 120.0
EXEC_DEADLINE_S = 60.0
POLL_INTERVAL_S = 0.25

T = TypeVar("T")


async def poll(
    fetch: Callable[[], Awaitable[T]], done: Callable[[T], bool], what: str, deadline_s: float
) -> T:
    """``fetch()`` until ``done`` holds; fail naming ``what`` and the last value at the deadline."""
    end = time.monotonic() + deadline_s
    while True:
        value = await fetch()
        if done(value):
            return value
        if time.monotonic() > end:
            pytest.fail(f"{what}: not reached within {deadline_s:.0f} s; last: {value}")
        await asyncio.sleep(POLL_INTERVAL_S)


async def rpc_code(call: Awaitable[Any]) -> grpc.StatusCode:
    try:
        await call
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


# ---------------------------------------------------------------------------------- names


def june_decodable_name(prefix: str) -> str:
    """A fresh DNS label whose bytes also parse as a protobuf message of unknown varint fields:
    "p" (0x70: field 14, varint) followed by a byte below 0x80, over and over.

    Under the new schema a June CreateActorRequest's ActorRef lands in `actor` (an Actor), whose
    field 1 is `metadata` (a message), so the June atespace string is parsed as a message. Most
    strings do not parse ("t" is an end-group tag), and a Go server refuses those while
    unmarshalling (INTERNAL), before any check of unknown fields. The atespace of this walk is
    chosen so the June bytes decode, and what is tested is the refusal of unknown fields.
    """
    return prefix + "".join("p" + digit for digit in secrets.token_hex(4))


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _length_delimited(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def june_create_actor_request(atespace: str, name: str, template: tuple[str, str]) -> bytes:
    """The bytes a June client sends: CreateActorRequest{actor_ref = 1: ActorRef{atespace = 1,
    name = 2}, actor_template_namespace = 2, actor_template_name = 3}."""
    actor_ref = _length_delimited(1, atespace.encode()) + _length_delimited(2, name.encode())
    return (
        _length_delimited(1, actor_ref)
        + _length_delimited(2, template[0].encode())
        + _length_delimited(3, template[1].encode())
    )


# ---------------------------------------------------------------------------------- client


class Walk:
    """The conformance client: upstream's messages, our backend."""

    def __init__(self, upstream: Upstream, api: ControlClient) -> None:
        self.up = upstream
        self.api = api

    def ref(self, atespace: str, name: str) -> Message:
        return self.up.new("ObjectRef", atespace=atespace, name=name)

    def state(self, actor: Any) -> str:
        return self.up.enum_name("ActorState", actor.status.state)

    def assert_state(self, actor: Any, expected: str, step: str) -> None:
        got = self.state(actor)
        assert got == f"ACTOR_STATE_{expected}", (
            f"{step}: {actor.metadata.atespace}/{actor.metadata.name} is {got}, want "
            f"ACTOR_STATE_{expected}"
        )

    async def get_template(self, atespace: str, name: str) -> Any:
        request = self.up.new("GetActorTemplateRequest", actor_template=self.ref(atespace, name))
        return await self.api.call("GetActorTemplate", request)

    async def create_actor(self, atespace: str, name: str, template: Message, **more: Any) -> Any:
        actor = self.up.new("Actor", actor_template=template, **more)
        actor.metadata.atespace, actor.metadata.name = atespace, name
        return await self.api.call("CreateActor", self.up.new("CreateActorRequest", actor=actor))

    async def resume(self, atespace: str, name: str) -> Any:
        request = self.up.new("ResumeActorRequest", actor=self.ref(atespace, name))
        return await self.api.call("ResumeActor", request)

    async def get_actor(self, atespace: str, name: str) -> Any:
        request = self.up.new("GetActorRequest", actor=self.ref(atespace, name))
        return await self.api.call("GetActor", request)

    async def list_all_actors(self, atespace: str) -> list[str]:
        """Every page of ListActors{atespace, page_size=1}; the names in the order served."""
        names: list[str] = []
        token = ""
        for _ in range(100):  # a page may be empty with a token, so bound the walk, not pages
            request = self.up.new(
                "ListActorsRequest", atespace=atespace, page_size=1, page_token=token
            )
            page = await self.api.call("ListActors", request)
            for actor in page.actors:
                assert actor.metadata.atespace == atespace, (
                    f"ListActors({atespace}) returned {actor.metadata.atespace}/"
                    f"{actor.metadata.name}"
                )
            names.extend(actor.metadata.name for actor in page.actors)
            token = page.next_page_token
            if not token:
                return names
        pytest.fail(f"ListActors({atespace}, page_size=1) still had a token after 100 pages")


def durable(storage: Any, up: Upstream) -> bool:
    return storage.durability == up.enum(
        "SnapshotDurability", "SNAPSHOT_DURABILITY_DURABLE"
    ) and storage.status == up.enum("SnapshotStorageStatus", "SNAPSHOT_STORAGE_STATUS_COMPLETED")


def file_location(template: Any) -> str:
    """A shell path for a file that must survive suspend, tag and fork: under a durable_dir
    volume's mount when the template has one (VOLUMES fidelity keeps only those), else $HOME."""
    durable_dirs = {volume.name for volume in template.volumes if volume.HasField("durable_dir")}
    for mount in template.containers[0].volume_mounts:
        if mount.name in durable_dirs:
            return f"{mount.mount_path}/conformance-walk.txt"
    return '"$HOME"/conformance-walk.txt'


async def run_in_sandbox(
    http: aiohttp.ClientSession, router_url: str, target: str, job_id: str, command: str
) -> dict[str, Any]:
    """POST an exec job through the router and poll it until it finishes (agent/contract.md)."""
    headers = {TARGET_HEADER: target}
    body = {"id": job_id, "command": command}
    async with http.post(f"{router_url}/v1/exec?wait=8", json=body, headers=headers) as response:
        text = await response.text()
        assert response.status in (200, 202), (
            f"POST /v1/exec via the router for {target}: {response.status} {text}"
        )
        job: dict[str, Any] = await response.json(content_type=None)

    async def fetch() -> dict[str, Any]:
        url = f"{router_url}/v1/exec/{job_id}?wait=8"
        async with http.get(url, headers=headers) as polled:
            assert polled.status == 200, f"GET /v1/exec/{job_id} for {target}: {polled.status}"
            found: dict[str, Any] = await polled.json(content_type=None)
            return found

    if job["state"] == "running":
        job = await poll(fetch, lambda j: j["state"] != "running", f"job {job_id}", EXEC_DEADLINE_S)
    assert (job["state"], job["exit_code"]) == ("exited", 0), f"job {job_id} in {target}: {job}"
    return job


class EraWalkClient(ControlClient):
    """The walk's client in a release era's wire: an upstream (current) message is sent as
    the era's bytes and the era's answer read back as upstream's, by `EraCodec(era).stub`."""

    def __init__(self, channel: grpc.aio.Channel, upstream: Upstream, era: str) -> None:
        super().__init__(channel, upstream)
        self.era_stub = EraCodec(era).stub(channel)

    async def call(self, method: str, request: Message, deadline_s: float = 120.0) -> Any:
        current = getattr(pb, request.DESCRIPTOR.name).FromString(request.SerializeToString())
        answer = await getattr(self.era_stub, method)(current, timeout=deadline_s)
        output = self._service.FindMethodByName(method).output_type
        return self._upstream.cls(output.name).FromString(answer.SerializeToString())


# ---------------------------------------------------------------------------------- the walk


@pytest.mark.parametrize(("runtime", "era"), WALKS)
async def test_walk_an_actor_through_its_life(
    tmp_path: Path, upstream: Upstream, runtime: str, era: str
) -> None:
    async with (
        LocalBackend(tmp_path / "state", runtime=runtime, workers=1, api_era=era) as backend,
        grpc.aio.insecure_channel(backend.api_address) as channel,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http,
    ):
        assert detect_era((await reflect(channel, None, 30)).files) == era
        api = ControlClient(channel, upstream)
        if era != CURRENT:
            api = EraWalkClient(channel, upstream, era)
        await _walk(Walk(upstream, api), backend.router_url, http)


async def _walk(walk: Walk, router_url: str, http: aiohttp.ClientSession) -> None:
    up = walk.up
    space = june_decodable_name("pc")
    template_name, first, fork, tag_name = "conf-template", "conf-first", "conf-fork", "conf-tag"
    extras = ["conf-extra-a", "conf-extra-b"]

    # --- a copy of the default template, in an atespace of our own
    source = await walk.get_template(*DEFAULT_TEMPLATE)
    assert source.containers, f"{DEFAULT_TEMPLATE} has no containers: {source}"
    atespace = up.new("Atespace")
    atespace.metadata.name = space
    created_space = await walk.api.call(
        "CreateAtespace", up.new("CreateAtespaceRequest", atespace=atespace)
    )
    assert created_space.metadata.name == space
    assert created_space.metadata.uid, "CreateAtespace: no server uid"

    copy = up.new("ActorTemplate")
    copy.metadata.atespace, copy.metadata.name = space, template_name
    copy.containers.extend(source.containers)
    copy.volumes.extend(source.volumes)
    copy.snapshot_config.CopyFrom(source.snapshot_config)
    copy.sandbox_config.CopyFrom(source.sandbox_config)
    created = await walk.api.call(
        "CreateActorTemplate", up.new("CreateActorTemplateRequest", actor_template=copy)
    )
    assert (created.metadata.atespace, created.metadata.name) == (space, template_name)
    template_uid = created.metadata.uid
    assert template_uid, "CreateActorTemplate: no server uid"
    assert created.metadata.version >= 1

    def golden_settled(template: Any) -> bool:
        golden = template.status.golden_snapshot_status
        return bool(golden.golden_tag.name or golden.error_message)

    template = await poll(
        lambda: walk.get_template(space, template_name),
        golden_settled,
        f"golden snapshot of {space}/{template_name}",
        GOLDEN_DEADLINE_S,
    )
    golden = template.status.golden_snapshot_status
    assert not golden.error_message, f"golden build failed: {golden.error_message}"
    assert (golden.golden_tag.atespace, golden.golden_tag.name) == (GOLDEN_ATESPACE, template_uid)
    template_ref = walk.ref(space, template_name)

    # --- a new actor starts SUSPENDED; resume runs it once
    actor = await walk.create_actor(space, first, template_ref)
    assert (actor.metadata.atespace, actor.metadata.name) == (space, first)
    assert actor.metadata.uid, "CreateActor: no server uid"
    assert actor.metadata.version >= 1
    walk.assert_state(actor, "SUSPENDED", "CreateActor")
    assert (actor.actor_template.atespace, actor.actor_template.name) == (space, template_name)
    for extra in extras:  # more actors, for the listing below
        walk.assert_state(await walk.create_actor(space, extra, template_ref), "SUSPENDED", extra)

    resumed = await walk.resume(space, first)
    assert resumed.resumed is True, "first ResumeActor of a SUSPENDED actor: resumed is False"
    walk.assert_state(resumed.actor, "RUNNING", "ResumeActor")
    again = await walk.resume(space, first)
    assert again.resumed is False, "ResumeActor of a RUNNING actor: resumed is True"
    walk.assert_state(again.actor, "RUNNING", "second ResumeActor")

    # --- a file written through the router
    marker = secrets.token_hex(16)
    path = file_location(template)
    await run_in_sandbox(
        http, router_url, f"{space}/{first}", "conf-write", f"printf %s {marker} > {path}"
    )

    # --- suspend to a durable snapshot, tag it
    suspended = await walk.api.call(
        "SuspendActor", up.new("SuspendActorRequest", actor=walk.ref(space, first))
    )
    walk.assert_state(suspended.actor, "SUSPENDED", "SuspendActor")
    assert any(
        durable(storage, up)
        for snapshot in suspended.actor.status.snapshots
        for storage in snapshot.storage
    ), f"SuspendActor: no DURABLE COMPLETED snapshot in {suspended.actor.status}"

    tag = up.new(
        "Tag",
        scope=up.enum("TagScope", "TAG_SCOPE_ATESPACE"),
        source_actor=walk.ref(space, first),
    )
    tag.metadata.atespace, tag.metadata.name = space, tag_name
    created_tag = await walk.api.call("CreateTag", up.new("CreateTagRequest", tag=tag))
    assert (created_tag.metadata.atespace, created_tag.metadata.name) == (space, tag_name)
    tag_ref = walk.ref(space, tag_name)
    ready = await poll(
        lambda: walk.api.call("GetTag", up.new("GetTagRequest", tag=tag_ref)),
        lambda t: any(durable(storage, up) for storage in t.status.snapshot.storage),
        f"tag {space}/{tag_name} COMPLETED",
        TAG_DEADLINE_S,
    )
    assert ready.status.actor_template_uid == template_uid
    assert (ready.source_actor.atespace, ready.source_actor.name) == (space, first)

    # --- a fork from the tag has the file
    forked = await walk.create_actor(space, fork, template_ref, source_tag=tag_ref)
    walk.assert_state(forked, "SUSPENDED", "CreateActor from source_tag")
    assert (forked.source_tag.atespace, forked.source_tag.name) == (space, tag_name)
    walk.assert_state((await walk.resume(space, fork)).actor, "RUNNING", "ResumeActor of the fork")
    job = await run_in_sandbox(http, router_url, f"{space}/{fork}", "conf-read", f"cat {path}")
    assert job["stdout"] == marker, f"the fork does not have the file written before the tag: {job}"

    # --- revert, then delete both
    reverted = await walk.api.call(
        "RevertActor", up.new("RevertActorRequest", actor=walk.ref(space, fork))
    )
    walk.assert_state(reverted.actor, "SUSPENDED", "RevertActor of a RUNNING actor")
    for name in (first, fork):
        request = up.new("DeleteActorRequest", actor=walk.ref(space, name), any_state=True)
        deleted = await walk.api.call("DeleteActor", request)
        assert (deleted.metadata.atespace, deleted.metadata.name) == (space, name), (
            f"DeleteActor({space}/{name}) answered {deleted.metadata}"
        )
        assert await rpc_code(walk.get_actor(space, name)) == grpc.StatusCode.NOT_FOUND, (
            f"{space}/{name} is still there after DeleteActor"
        )

    # --- every page of the listing, one actor a page
    listed = await walk.list_all_actors(space)
    assert sorted(listed) == sorted(extras), f"ListActors({space}) paged through {listed}"

    # --- a June-era CreateActor is refused and creates nothing
    june_name = "conf-june"
    payload = june_create_actor_request(space, june_name, (space, template_name))
    decoded = up.cls("CreateActorRequest").FromString(payload)  # the premise: the bytes decode
    unknown_tags = {field.field_number for field in unknown_fields.UnknownFieldSet(decoded)}
    assert unknown_tags == {2, 3}, f"June bytes decode with unknown top-level tags {unknown_tags}"
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await walk.api.call_raw("CreateActor", payload)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.value
    details = refused.value.details() or ""
    # one error per message, naming its first unknown tag (rejectunknown_test.go@2e3e300a)
    assert "request: Invalid value: unknown field with protobuf tag 2" in details, details
    assert await rpc_code(walk.get_actor(space, june_name)) == grpc.StatusCode.NOT_FOUND
    assert sorted(await walk.list_all_actors(space)) == sorted(extras)
