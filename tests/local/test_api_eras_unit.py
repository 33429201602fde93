"""The local API serving each release era on the wire, over one model (issue 30, part 4).

A real control plane on the scripted runtime (control_fakes.py) behind `create_api_server(...,
era=...)`; every client here speaks the era itself (`EraCodec(era)`'s classes, or raw bytes).
Pinned, with where each era's server does it:
- reflection describes the era's own ateapi, so `eras.detect_era` on it names the era (ateapi
  registers reflection in every vintage: walkthrough id 68660195273, server `New()` 71651480767);
- a v0.4 client's on_pause (field 1) is refused INVALID_ARGUMENT as an unknown field, checked on
  the era's message before any conversion (RejectUnknownFieldsUnaryInterceptor, id 57882522002,
  in the chain since before v0.3.0);
- v0.3's SnapshotConfig defaults (FULL, FULL, COLD_BOOT; defaults.go id 70399729044) and
  `ValidateCustom_SnapshotConfig` (on_pause DATA needs on_commit DATA, "must be a subset of
  on_pause": ids 70091475952, 70080375207); v0.4's DATA on_commit needs a mounted durable dir
  (apivalidation/actor_template.go@05ff652f, id 70376624845);
- v0.3's CreateTag answers the finished tag, `status.snapshot` set (workflow_tag.go@009b19c5,
  id 69753113848, sets it last and returns it);
- bytes that do not parse are INTERNAL `grpc: error unmarshalling request: ...` in every era, as
  grpc-go answers before any interceptor runs (vendor/google.golang.org/grpc/server.go,
  processUnaryRPC), where ours said UNKNOWN "Unexpected DecodeError".
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
from control_fakes import FakeRuntime, host_template, start_plane, stop_plane

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.ateapi.codec import EraCodec
from gym_substrate.ateapi.eras import CURRENT, ERAS, V03, V04, detect_era
from gym_substrate.ateapi.reflect import reflect
from gym_substrate.local.apiserver import create_api_server
from gym_substrate.local.control.plane import ControlPlane
from gym_substrate.local.control.records import SUSPENDED

C = grpc.StatusCode
_DATA, _FULL = 2, 1


class _NoIdentity:
    def mint_jwt(self, request: Any) -> Any:
        raise NotImplementedError

    def mint_certificate(self, request: Any) -> Any:
        raise NotImplementedError


@dataclass
class Served:
    era: str
    plane: ControlPlane
    channel: grpc.aio.Channel
    codec: EraCodec

    @property
    def stub(self) -> Any:
        return self.codec.stub(self.channel)

    async def raw(self, method: str, message: Any) -> Any:
        """Send the era's own message; answer the era's own response message."""
        output = pb.DESCRIPTOR.services_by_name["Control"].methods_by_name[method].output_type
        call = self.channel.unary_unary(
            f"/ateapi.Control/{method}",
            request_serializer=lambda m: m if isinstance(m, bytes) else m.SerializeToString(),
            response_deserializer=self.codec.era_class(output.full_name).FromString,
        )
        return await call(message)

    def template_request(self, name: str) -> Any:
        """A CreateActorTemplateRequest in the era's classes (the default template, renamed)."""
        template = host_template(self.plane.state_dir, self.plane.images)
        template.metadata.name = name
        request = pb.CreateActorTemplateRequest(actor_template=template)
        era_class = self.codec.era_class("ateapi.CreateActorTemplateRequest")
        return era_class.FromString(self.codec.encode(request))


async def _serve(tmp_path: Path, era: str) -> AsyncIterator[Served]:
    plane = await start_plane(tmp_path / "state", FakeRuntime())
    server = create_api_server(plane, verifier=None, identity=_NoIdentity(), era=era)  # type: ignore[arg-type]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield Served(era, plane, channel, EraCodec(era))
    finally:
        await channel.close()
        await server.stop(None)
        await stop_plane(plane)


@pytest.fixture(params=ERAS)
async def served(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Served]:
    async for item in _serve(tmp_path, request.param):
        yield item


@pytest.fixture
async def v03(tmp_path: Path) -> AsyncIterator[Served]:
    async for item in _serve(tmp_path, V03):
        yield item


@pytest.fixture
async def v04(tmp_path: Path) -> AsyncIterator[Served]:
    async for item in _serve(tmp_path, V04):
        yield item


async def _code(call: Any) -> tuple[grpc.StatusCode, str]:
    try:
        await call
    except grpc.aio.AioRpcError as exc:
        return exc.code(), exc.details() or ""
    return C.OK, ""


async def test_reflection_describes_the_era_served(served: Served) -> None:
    found = await reflect(served.channel, None, 10)
    assert "ateapi.Control" in found.services
    assert detect_era(found.files) == served.era


async def test_bytes_that_do_not_parse_are_internal_as_grpc_go_answers(served: Served) -> None:
    code, details = await _code(served.raw("GetActor", b"\x0a\x05ab"))  # field 1, cut short
    assert code == C.INTERNAL
    assert details.startswith("grpc: error unmarshalling request: ")


async def test_a_tag_is_made_read_and_forked_in_each_era(served: Served) -> None:
    """One model inside: an actor made, resumed, suspended and tagged through the era's wire;
    the tag answers ready (v0.3: `status.snapshot` set on CreateTag's own answer)."""
    stub = served.stub
    ref = pb.ObjectRef(atespace="t", name="a")
    await stub.CreateAtespace(
        pb.CreateAtespaceRequest(atespace=pb.Atespace(metadata=pb.ResourceMetadata(name="t")))
    )
    actor = pb.Actor(
        metadata=pb.ResourceMetadata(atespace="t", name="a"),
        actor_template=pb.ObjectRef(atespace="local", name="sandbox"),
    )
    await stub.CreateActor(pb.CreateActorRequest(actor=actor))
    await stub.ResumeActor(pb.ResumeActorRequest(actor=ref))
    suspended = await stub.SuspendActor(pb.SuspendActorRequest(actor=ref))
    assert suspended.actor.status.state == pb.ACTOR_STATE_SUSPENDED
    tag = pb.Tag(
        metadata=pb.ResourceMetadata(atespace="t", name="t0"),
        scope=pb.TAG_SCOPE_ATESPACE,
        source_actor=ref,
    )
    request = pb.CreateTagRequest(tag=tag)
    if served.era == CURRENT:
        created = await stub.CreateTag(request)
        stored = created.status.snapshot.storage[0]
        assert stored.status == pb.SNAPSHOT_STORAGE_STATUS_COMPLETED
    else:
        created = await served.raw("CreateTag", served.codec.encode(request))
        assert created.status.snapshot.snapshot_uri  # ready in CreateTag's own answer
        assert created.status.actor_template_uid
    fork = pb.Actor(
        metadata=pb.ResourceMetadata(atespace="t", name="f"),
        actor_template=pb.ObjectRef(atespace="local", name="sandbox"),
        source_tag=pb.ObjectRef(atespace="t", name="t0"),
    )
    made = await stub.CreateActor(pb.CreateActorRequest(actor=fork))
    assert made.status.state == pb.ACTOR_STATE_SUSPENDED
    assert served.plane.state.actor("t/f").state == SUSPENDED


async def test_v04_refuses_on_pause_as_an_unknown_field(v04: Served) -> None:
    request = v04.template_request("v04-pause")
    # SnapshotConfig is field 5 of ActorTemplate (field 1 of the request); add on_pause = DATA
    config = request.actor_template.snapshot_config.SerializeToString() + b"\x08\x02"
    request.actor_template.ClearField("snapshot_config")
    template = request.actor_template.SerializeToString() + b"\x2a" + bytes([len(config)]) + config
    data = b"\x0a" + _varint(len(template)) + template
    code, details = await _code(v04.raw("CreateActorTemplate", data))
    assert (code, details) == (
        C.INVALID_ARGUMENT,
        "actor_template.snapshot_config: Invalid value: unknown field with protobuf tag 1",
    )
    assert "local/v04-pause" not in v04.plane.state.templates


async def test_v04_data_on_commit_needs_a_mounted_durable_dir(v04: Served) -> None:
    request = v04.template_request("v04-data")
    request.actor_template.snapshot_config.on_commit = _DATA
    code, details = await _code(v04.raw("CreateActorTemplate", request))
    assert code == C.INVALID_ARGUMENT
    assert details.startswith("actor_template.snapshot_config.on_commit: Invalid value: ")
    request.actor_template.snapshot_config.on_commit = _FULL
    created = await v04.raw("CreateActorTemplate", request)
    assert created.snapshot_config.on_commit == _FULL
    assert created.snapshot_config.storage_location


async def test_v03_snapshot_config_rules_and_defaults(v03: Served) -> None:
    request = v03.template_request("v03-subset")
    config = request.actor_template.snapshot_config
    config.on_pause, config.on_commit = _DATA, _FULL
    code, details = await _code(v03.raw("CreateActorTemplate", request))
    assert (code, details) == (
        C.INVALID_ARGUMENT,
        'actor_template.snapshot_config.on_commit: Invalid value: "SNAPSHOT_CONTENT_SCOPE_FULL": '
        "must be a subset of on_pause",
    )
    config.on_pause, config.on_commit = 3, 0
    config.on_resume.from_data = 7
    code, details = await _code(v03.raw("CreateActorTemplate", request))
    assert code == C.INVALID_ARGUMENT
    assert "snapshot_config.on_pause: Invalid value: 3: must be between 1 and 2" in details
    assert "snapshot_config.on_resume.from_data: Invalid value: 7" in details
    request = v03.template_request("v03-defaults")
    for field in ("on_pause", "on_commit", "on_resume"):
        request.actor_template.snapshot_config.ClearField(field)
    created = await v03.raw("CreateActorTemplate", request)
    defaults = created.snapshot_config
    assert (defaults.on_pause, defaults.on_commit, defaults.on_resume.from_data) == (1, 1, 1)


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _options(**given: Any) -> Any:
    """`check_options` as `LocalBackend` calls it with its defaults (no backend starts)."""
    from gym_substrate.local.backend_options import check_options

    defaults: dict[str, Any] = {
        "runtime": "process", "workers": 1, "actors_per_worker": 1, "api_port": 0,
        "router_port": 0, "admin_port": 0, "router_timeout_s": 300.0, "parked_request_max": 1,
        "parked_request_budget_s": 5.0, "suspend_on_stop": False, "tls": False,
        "auth": "mtls", "default_rootfs": "host", "rootfs_dir": None, "pause_tier": None,
        "frozen_memory": None, "warm_pool": None, "allow_host_rootfs": False,
        "actor_disk": None,
    }  # fmt: skip
    return check_options(**{**defaults, **given})


def test_the_era_option_is_checked_and_read_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gym_substrate.local.backend_options import API_ERA_ENV

    monkeypatch.delenv(API_ERA_ENV, raising=False)
    assert _options().api_era == CURRENT
    assert _options(api_era="v0.3.0").api_era == V03
    with pytest.raises(
        ValueError, match=r"api_era: unknown ateapi era 'v9'.*v0\.3, v0\.4, current"
    ):
        _options(api_era="v9")
    monkeypatch.setenv(API_ERA_ENV, "v0.4")
    assert _options().api_era == V04
    monkeypatch.setenv(API_ERA_ENV, "old")
    with pytest.raises(ValueError, match=API_ERA_ENV):
        _options()
