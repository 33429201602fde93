"""The provider reads the server's era from the server, speaks it, or refuses it in one error.

A fake ateapi here answers in an era's own wire: its reflection serves that era's descriptors
(`eras.era_file`, written from upstream's protos: v0.3 from a whole v0.3 ateapi.proto, search id
70632467804; v0.4 from the v0.3->v0.4 runbook, id 70908369137; current from 2179589f, id
70579357611) and its handlers encode the era's messages. The issue's failure was a client built
for one commit reading a release's tags as never COMPLETED; here a v0.3 and a v0.4 tag read as
ready with their URI, a configured era that contradicts the server is refused naming both, a
server of no known era is refused naming its fields, and without reflection the configured era
or a stored template's wire decides (docs/compatibility.md).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import grpc.aio
import pytest
from grpc_reflection.v1alpha import reflection, reflection_pb2_grpc

from gym_substrate import UnsupportedServerError
from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.ateapi.codec import EraCodec
from gym_substrate.ateapi.eras import CURRENT, V03, V04, era_file
from gym_substrate.nemo.config import ConnectionConfig
from gym_substrate.nemo.control_client import ControlClient, create_channel, tag_ready, tag_uri
from gym_substrate.nemo.errors import ConfigError

URI = "gs://bucket/atespaces/gym/tags/6b1e/"


def _tag(name: str) -> pb.Tag:
    tag = pb.Tag(metadata=pb.ResourceMetadata(atespace="gym", name=name))
    tag.status.actor_template_uid = "uid-1"
    snapshot = tag.status.snapshot
    snapshot.generation, snapshot.owner = 1, pb.SNAPSHOT_OWNER_TAG
    stored = snapshot.storage.add(durability=pb.SNAPSHOT_DURABILITY_DURABLE)
    stored.status = pb.SNAPSHOT_STORAGE_STATUS_COMPLETED
    stored.fidelity = pb.SNAPSHOT_FIDELITY_MEMORY
    stored.object.snapshot_uri = URI
    return tag


class EraServer:
    """A gRPC server that speaks ``era`` on the wire (GetTag and ListActorTemplates)."""

    def __init__(self, era: str, *, reflect: bool = True, files: Any = None) -> None:
        self.codec = EraCodec(era, files)
        self.server = grpc.aio.server()
        self.address = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        self.calls: list[str] = []
        self.channels: list[grpc.aio.Channel] = []
        handlers = {
            name: grpc.unary_unary_rpc_method_handler(
                behaviour, request_deserializer=lambda data: data, response_serializer=lambda m: m
            )
            for name, behaviour in (
                ("GetTag", self._get_tag),
                ("ListTags", self._list_tags),
                ("ListActorTemplates", self._list_templates),
            )
        }
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("ateapi.Control", handlers),)
        )
        if reflect:
            names = ("ateapi.Control", reflection.SERVICE_NAME)
            servicer = reflection.aio.ReflectionServicer(names, pool=self.codec.pool)
            reflection_pb2_grpc.add_ServerReflectionServicer_to_server(servicer, self.server)

    async def _get_tag(self, request: bytes, context: Any) -> bytes:
        self.calls.append("GetTag")
        name = self.codec.decode(pb.GetTagRequest, request).tag.name
        return self.codec.encode(_tag(name))

    async def _list_tags(self, request: bytes, context: Any) -> bytes:
        self.calls.append("ListTags")
        return self.codec.encode(pb.ListTagsResponse())

    async def _list_templates(self, request: bytes, context: Any) -> bytes:
        self.calls.append("ListActorTemplates")
        template = pb.ActorTemplate(metadata=pb.ResourceMetadata(atespace="local", name="t"))
        template.snapshot_config.storage_location = "gs://bucket/snapshots"
        template.snapshot_config.preferred_fidelity = pb.SNAPSHOT_FIDELITY_MEMORY
        return self.codec.encode(pb.ListActorTemplatesResponse(actor_templates=[template]))

    def client(self, api_era: str = "auto") -> ControlClient:
        conn = ConnectionConfig(
            api=self.address,
            router="http://127.0.0.1:1",
            tls={"plaintext": True},  # type: ignore[arg-type]
            request_timeout_s=5,
            api_era=api_era,
        )
        self.channels.append(create_channel(conn))
        return ControlClient(self.channels[-1], conn)


@pytest.fixture
async def servers() -> AsyncIterator[list[EraServer]]:
    made: list[EraServer] = []
    yield made
    for s in made:
        for channel in s.channels:
            await channel.close()
        await s.server.stop(None)


async def _start(servers: list[EraServer], era: str, **kw: Any) -> EraServer:
    s = EraServer(era, **kw)
    servers.append(s)
    await s.server.start()
    return s


@pytest.mark.parametrize("era", [V03, V04, CURRENT])
async def test_a_tag_of_each_era_reads_as_ready_with_its_uri(
    servers: list[EraServer], era: str
) -> None:
    server = await _start(servers, era)
    client = server.client()
    tag = await client.get_tag("gym", "t")
    assert client.era == era
    assert tag_ready(tag)
    assert tag_uri(tag) == URI
    assert server.calls == ["GetTag"]  # reflection decided: no probe


async def test_a_configured_era_that_contradicts_the_server_is_refused(
    servers: list[EraServer],
) -> None:
    server = await _start(servers, V03)
    client = server.client(api_era="current")
    with pytest.raises(UnsupportedServerError) as raised:
        await client.get_tag("gym", "t")
    assert str(raised.value) == (
        f"connection.api_era is current, but ateapi at {server.address} declares the v0.3 era "
        "in its own descriptors (Substrate v0.2.0 and v0.3.0): set connection.api_era to v0.3 "
        "or to auto"
    )
    assert server.calls == []  # nothing was sent in the wrong era


async def test_a_server_of_no_known_era_is_refused_naming_its_fields(
    servers: list[EraServer],
) -> None:
    proto = era_file(CURRENT)
    (status,) = [m for m in proto.message_type if m.name == "TagStatus"]
    status.field[0].type_name = ".ateapi.ActorCrash"  # a snapshot of a shape nobody released
    server = await _start(servers, CURRENT, files=[proto])
    with pytest.raises(UnsupportedServerError) as raised:
        await server.client().get_tag("gym", "t")
    message = str(raised.value)
    assert message.startswith(f"ateapi at {server.address}: its ateapi matches no era")
    assert "TagStatus.snapshot = 1 is .ateapi.ActorCrash" in message
    assert "v0.3: Substrate v0.2.0 and v0.3.0" in message
    assert server.calls == []


@pytest.mark.parametrize("era", [V03, V04, CURRENT])
async def test_without_reflection_a_stored_templates_wire_tells_the_era(
    servers: list[EraServer], era: str
) -> None:
    server = await _start(servers, era, reflect=False)
    client = server.client()
    assert tag_ready(await client.get_tag("gym", "t"))
    assert client.era == era
    assert server.calls == ["ListTags", "ListActorTemplates", "GetTag"]


async def test_without_reflection_the_configured_era_decides(servers: list[EraServer]) -> None:
    server = await _start(servers, V04, reflect=False)
    client = server.client(api_era="v0.4.1")
    assert tag_ready(await client.get_tag("gym", "t"))
    assert (client.era, server.calls) == (V04, ["ListTags", "GetTag"])


def test_an_unknown_era_in_the_config_names_the_key_and_the_eras() -> None:
    with pytest.raises(ConfigError, match=r"connection\.api_era.*'v9'.*v0\.3, v0\.4, current"):
        ConnectionConfig(api="127.0.0.1:1", router="http://127.0.0.1:1", api_era="v9")


async def test_descriptors_that_cannot_be_read_are_refused_before_any_call(
    servers: list[EraServer],
) -> None:
    """A server whose reflection answers with bytes that are no FileDescriptorProto: the era
    cannot be known, so the provider refuses in one error instead of a raw DecodeError."""
    from grpc_reflection.v1alpha import reflection_pb2

    server = EraServer(CURRENT, reflect=False)
    servers.append(server)

    async def garbled(requests: Any, context: Any) -> AsyncIterator[Any]:
        async for _ in requests:
            reply = reflection_pb2.ServerReflectionResponse()
            reply.file_descriptor_response.file_descriptor_proto.append(b"\x0a\xff\xff\xff")
            yield reply

    handler = grpc.stream_stream_rpc_method_handler(
        garbled,
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
    )
    service = grpc.method_handlers_generic_handler(
        "grpc.reflection.v1alpha.ServerReflection", {"ServerReflectionInfo": handler}
    )
    server.server.add_generic_rpc_handlers((service,))
    await server.server.start()
    with pytest.raises(UnsupportedServerError) as raised:
        await server.client().get_tag("gym", "t")
    message = str(raised.value)
    assert message.startswith(
        f"ateapi at {server.address} answered reflection with descriptors that cannot be read"
    )
    assert "check that connection.api is ateapi's address" in message
    assert server.calls == []
