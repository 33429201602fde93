"""The few plain ateapi calls the fuzzers make around a run (setup and cleanup)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc

from gym_substrate.ateapi import ateapi_pb2 as pb

__all__ = ["CALL_DEADLINE_S", "call", "ensure_actors"]

# A call that outlives this has hung: the real resume deadline is about 28 s.
CALL_DEADLINE_S = 40.0


async def call(channel: grpc.aio.Channel, method: str, request: Any, response: Any) -> Any:
    """One ateapi.Control call by name, with the fuzzers' deadline."""
    stub = channel.unary_unary(
        f"/ateapi.Control/{method}",
        request_serializer=type(request).SerializeToString,
        response_deserializer=response.FromString,
    )
    return await stub(request, timeout=CALL_DEADLINE_S)


async def _unless_exists(
    channel: grpc.aio.Channel, method: str, request: Any, response: Any
) -> None:
    try:
        await call(channel, method, request, response)
    except grpc.aio.AioRpcError as exc:
        if exc.code() != grpc.StatusCode.ALREADY_EXISTS:
            raise


async def ensure_actors(channel: grpc.aio.Channel, atespace: str, names: Sequence[str]) -> None:
    """`atespace` and actors `names` from the local `sandbox` template, kept if they exist."""
    await _unless_exists(
        channel,
        "CreateAtespace",
        pb.CreateAtespaceRequest(name=atespace),
        pb.CreateAtespaceResponse,
    )
    for name in names:
        request = pb.CreateActorRequest(
            actor_ref=pb.ActorRef(atespace=atespace, name=name),
            actor_template_namespace="local",
            actor_template_name="sandbox",
        )
        await _unless_exists(channel, "CreateActor", request, pb.CreateActorResponse)
