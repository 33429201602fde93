"""Helpers shared by the local backend's tests."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from gym_substrate._names import actor_host
from gym_substrate.ateapi import ateapi_pb2 as pb

# runtimes a lifecycle test runs against; gVisor needs runsc and root (the `runsc` marker)
RUNTIMES = ["process", pytest.param("gvisor", marks=pytest.mark.runsc)]


def ref(name: str, atespace: str = "t") -> pb.ActorRef:
    return pb.ActorRef(atespace=atespace, name=name)


async def make_actor(stub: Any, name: str, atespace: str = "t") -> pb.Actor:
    code = await status_code(stub.CreateAtespace(pb.CreateAtespaceRequest(name=atespace)))
    assert code in (grpc.StatusCode.OK, grpc.StatusCode.ALREADY_EXISTS)
    response = await stub.CreateActor(
        pb.CreateActorRequest(
            actor_ref=ref(name, atespace),
            actor_template_namespace="local",
            actor_template_name="sandbox",
        )
    )
    return response.actor


def host(name: str, atespace: str = "t") -> dict[str, str]:
    return {"Host": actor_host(name, atespace)}


async def status_code(call: Any) -> grpc.StatusCode:
    """The gRPC status an awaited call ended with (OK when it succeeded)."""
    try:
        await call
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK
