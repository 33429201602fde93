"""The provider refuses a June-era ateapi once per connection, with one error saying what to do.

Real: ateapi registers gRPC server reflection (`reflection.Register` in the current
cmd/ateapi/internal/server `New()`, read_file id 71651480767, and in every older main.go read,
18d1c266's included). June's API (this project at 5d48b0e) had
`ateapi.SessionIdentity` and a `Control` without RevertActor or CreateTag; the current one has
no SessionIdentity. The June server here is a real grpc.aio server whose reflection describes a
FileDescriptorProto built below by hand (no June .proto is kept in the repository).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterable
from typing import Any

import grpc
import grpc.aio
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection, reflection_pb2_grpc

from gym_substrate import (
    SubstrateProvider,
    TransientControlPlaneError,
    UnsupportedServerError,
)
from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.ateapi import ateapi_pb2_grpc as pb_grpc
from gym_substrate.nemo.config import ConnectionConfig
from gym_substrate.nemo.control_client import ControlClient, create_channel
from gym_substrate.nemo.types import SandboxSpec

# ateapi.Control and SessionIdentity as they were in June (5d48b0e's ateapi.proto).
JUNE_CONTROL = (
    *("GetActor", "CreateActor", "UpdateActor", "SuspendActor", "PauseActor", "ResumeActor"),
    *("DeleteActor", "ListWorkers", "ListActors", "CreateAtespace", "GetAtespace"),
    *("ListAtespaces", "DeleteAtespace", "DebugClear"),
)
JUNE_IDENTITY = ("MintJWT", "MintCert")

REFUSAL = (
    "ateapi at {api} speaks the June 2026 API ({why}); this gym-substrate supports Agent "
    "Substrate v0.2.0 and later (the API of upstream's ateapi.proto at 2179589f). Upgrade "
    "Substrate, or use gym-substrate at commit 5d48b0e, the last one that speaks the June API "
    "(see docs/compatibility.md)"
)


def _june_pool(*, identity: bool, control: Iterable[str] = JUNE_CONTROL) -> Any:
    """A descriptor pool holding a hand-built June `ateapi` file."""
    proto = descriptor_pb2.FileDescriptorProto(name="ateapi.proto", package="ateapi")
    proto.syntax = "proto3"
    proto.message_type.add(name="Message")
    services = [("Control", control)] + ([("SessionIdentity", JUNE_IDENTITY)] if identity else [])
    for service, methods in services:
        added = proto.service.add(name=service)
        for method in methods:
            added.method.add(
                name=method, input_type=".ateapi.Message", output_type=".ateapi.Message"
            )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return pool


class _CountingReflection(reflection.aio.ReflectionServicer):  # type: ignore[misc]
    """Reflection that counts streams, optionally failing the first ones with UNAVAILABLE."""

    def __init__(self, names: Iterable[str], pool: Any = None, unavailable: int = 0) -> None:
        super().__init__(tuple(names), pool=pool)
        self.streams = 0
        self.unavailable = unavailable

    async def ServerReflectionInfo(  # noqa: N802 - the gRPC method name
        self, request_iterator: Any, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        self.streams += 1
        if self.unavailable:
            self.unavailable -= 1
            # read the requests first: aborting mid-stream makes grpc's client say INTERNAL
            _ = [request async for request in request_iterator]
            await context.abort(grpc.StatusCode.UNAVAILABLE, "ateapi is restarting")
        async for reply in super().ServerReflectionInfo(request_iterator, context):
            yield reply


class _Control(pb_grpc.ControlServicer):  # type: ignore[misc]
    """A current Control with just what these tests call."""

    def __init__(self, list_tags: grpc.StatusCode | None = None) -> None:
        self.list_tags = list_tags
        self.calls: list[str] = []

    async def GetActor(self, request: Any, context: Any) -> pb.Actor:  # noqa: N802
        self.calls.append("GetActor")
        actor = pb.Actor(metadata=pb.ResourceMetadata(atespace="gym", name=request.actor.name))
        actor.status.state = pb.ACTOR_STATE_SUSPENDED
        return actor

    async def ListActorTemplates(self, request: Any, context: Any) -> Any:  # noqa: N802
        self.calls.append("ListActorTemplates")
        template = pb.ActorTemplate(metadata=pb.ResourceMetadata(atespace="local", name="t"))
        template.snapshot_config.storage_location = "file:///snapshots"
        return pb.ListActorTemplatesResponse(actor_templates=[template])

    async def ListTags(self, request: Any, context: Any) -> pb.ListTagsResponse:  # noqa: N802
        self.calls.append("ListTags")
        if self.list_tags is not None:
            await context.abort(self.list_tags, "Atespace gym not found")
        return pb.ListTagsResponse()


class _Server:
    def __init__(self) -> None:
        self.server = grpc.aio.server()
        self.address = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        self.channels: list[grpc.aio.Channel] = []

    def client(self) -> ControlClient:
        """A client on a channel of its own (a connection), closed with the server."""
        self.channels.append(create_channel(self.conn()))
        return ControlClient(self.channels[-1], self.conn())

    def mapping(self) -> dict[str, Any]:
        """The provider's `connection:` block for this server."""
        return {
            "api": self.address,
            "router": "http://127.0.0.1:1",
            "tls": {"plaintext": True},
            "request_timeout_s": 5,
        }

    def conn(self) -> ConnectionConfig:
        return ConnectionConfig(**self.mapping())


@pytest.fixture
async def server() -> AsyncIterator[_Server]:
    s = _Server()
    yield s
    for channel in s.channels:
        await channel.close()
    await s.server.stop(None)


def _with_reflection(s: _Server, names: Iterable[str], pool: Any = None, **kw: Any) -> Any:
    servicer = _CountingReflection([*names, reflection.SERVICE_NAME], pool=pool, **kw)
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(servicer, s.server)
    return servicer


@pytest.mark.parametrize(
    ("identity", "control", "why"),
    [
        (True, JUNE_CONTROL, "it serves ateapi.SessionIdentity"),
        (False, JUNE_CONTROL, "its ateapi.Control has no RevertActor or CreateTag"),
        (False, (*JUNE_CONTROL, "CreateTag"), "its ateapi.Control has no RevertActor"),
    ],
)
async def test_a_june_server_is_refused_by_create_with_one_clear_error(
    server: _Server, identity: bool, control: tuple[str, ...], why: str
) -> None:
    names = ["ateapi.Control"] + (["ateapi.SessionIdentity"] if identity else [])
    _with_reflection(server, names, pool=_june_pool(identity=identity, control=control))
    await server.server.start()
    message = REFUSAL.format(api=server.address, why=why)
    async with SubstrateProvider(connection=server.mapping()) as p:
        with pytest.raises(UnsupportedServerError, match=f"^{re.escape(message)}$"):
            await p.create(SandboxSpec())


async def test_a_june_server_without_reflection_is_found_by_the_listtags_probe(
    server: _Server,
) -> None:
    """No services at all: reflection and ListTags are both UNIMPLEMENTED, as on June's
    ateapi had it not served reflection."""
    await server.server.start()
    client = server.client()
    message = REFUSAL.format(api=server.address, why="ListTags is UNIMPLEMENTED")
    with pytest.raises(UnsupportedServerError, match=f"^{re.escape(message)}$"):
        await client.get_actor("gym", "a")


async def test_a_current_server_passes_and_is_checked_once_per_connection(
    server: _Server,
) -> None:
    control = _Control()
    pb_grpc.add_ControlServicer_to_server(control, server.server)
    reflecting = _with_reflection(server, ["ateapi.Control"])
    await server.server.start()
    client = server.client()
    for name in ("a", "b", "c"):
        assert (await client.get_actor("gym", name)).metadata.name == name
    assert reflecting.streams == 1
    assert control.calls == ["GetActor"] * 3  # reflection sufficed: no probe
    await server.client().get_actor("gym", "d")  # another connection checks for itself
    assert reflecting.streams == 2


@pytest.mark.parametrize("answer", [None, grpc.StatusCode.NOT_FOUND])
async def test_a_current_server_without_reflection_passes_the_probe(
    server: _Server, answer: grpc.StatusCode | None
) -> None:
    """Any answer but UNIMPLEMENTED proves ListTags exists (here: a page, or NOT_FOUND); the
    era is then read from a stored template's wire (test_api_eras.py has the other eras)."""
    control = _Control(list_tags=answer)
    pb_grpc.add_ControlServicer_to_server(control, server.server)
    await server.server.start()
    client = server.client()
    await client.get_actor("gym", "a")
    await client.get_actor("gym", "b")
    assert control.calls == ["ListTags", "ListActorTemplates", "GetActor", "GetActor"]
    assert client.era == "current"


async def test_a_check_that_could_not_ask_is_retried_later_not_a_refusal(
    server: _Server,
) -> None:
    control = _Control()
    pb_grpc.add_ControlServicer_to_server(control, server.server)
    reflecting = _with_reflection(server, ["ateapi.Control"], unavailable=1)
    await server.server.start()
    client = server.client()
    # reported under the call the user made, as that call failing would be
    with pytest.raises(TransientControlPlaneError, match="GetActor: UNAVAILABLE"):
        await client.get_actor("gym", "a")
    assert control.calls == []
    await client.get_actor("gym", "a")
    assert (reflecting.streams, control.calls) == (2, ["GetActor"])


async def test_a_refusal_is_final_for_the_connection(server: _Server) -> None:
    reflecting = _with_reflection(
        server, ["ateapi.Control", "ateapi.SessionIdentity"], pool=_june_pool(identity=True)
    )
    await server.server.start()
    client = server.client()
    for _ in range(2):
        with pytest.raises(UnsupportedServerError, match="ateapi.SessionIdentity"):
            await client.list_actors("gym")
    assert reflecting.streams == 1
