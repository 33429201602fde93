"""The few plain ateapi calls the fuzzers make around a run (setup and cleanup)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import grpc

from gym_substrate.ateapi import ateapi_pb2 as pb

__all__ = [
    "CALL_DEADLINE_S",
    "DEFAULT_TEMPLATE",
    "call",
    "ensure_actors",
    "ensure_tag",
    "wait_golden",
]

# A call that outlives this has hung: a resume waits at most its probe's 30 s.
CALL_DEADLINE_S = 40.0
DEFAULT_TEMPLATE = pb.ObjectRef(atespace="local", name="sandbox")


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


async def wait_golden(channel: grpc.aio.Channel, timeout_s: float = 120.0) -> None:
    """Until `local/sandbox` has its golden tag (its actors then start from a snapshot, and a
    fresh actor can be tagged)."""
    deadline = time.monotonic() + timeout_s
    while True:
        template = await call(
            channel,
            "GetActorTemplate",
            pb.GetActorTemplateRequest(actor_template=DEFAULT_TEMPLATE),
            pb.ActorTemplate,
        )
        golden = template.status.golden_snapshot_status
        if golden.HasField("golden_tag"):
            return
        if golden.error_message or time.monotonic() > deadline:
            raise RuntimeError(
                f"local/sandbox has no golden tag: {golden.error_message or 'timed out'}"
            )
        await asyncio.sleep(0.1)


async def ensure_actors(channel: grpc.aio.Channel, atespace: str, names: Sequence[str]) -> None:
    """`atespace` and actors `names` from the local `sandbox` template, kept if they exist."""
    space = pb.Atespace(metadata=pb.ResourceMetadata(name=atespace))
    await _unless_exists(
        channel, "CreateAtespace", pb.CreateAtespaceRequest(atespace=space), pb.Atespace
    )
    for name in names:
        actor = pb.Actor(
            metadata=pb.ResourceMetadata(atespace=atespace, name=name),
            actor_template=DEFAULT_TEMPLATE,
        )
        await _unless_exists(channel, "CreateActor", pb.CreateActorRequest(actor=actor), pb.Actor)


async def ensure_tag(channel: grpc.aio.Channel, atespace: str, name: str, actor: str) -> None:
    """Tag `atespace/name` of SUSPENDED actor `actor` (its borrowed golden snapshot)."""
    tag = pb.Tag(
        metadata=pb.ResourceMetadata(atespace=atespace, name=name),
        scope=pb.TAG_SCOPE_ATESPACE,
        source_actor=pb.ObjectRef(atespace=atespace, name=actor),
    )
    await _unless_exists(channel, "CreateTag", pb.CreateTagRequest(tag=tag), pb.Tag)
