"""Helpers shared by the local backend's tests."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import grpc
import pytest

from gym_substrate._names import actor_host
from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.local import LocalBackend

# runtimes a lifecycle test runs against; gVisor needs runsc and root (the `runsc` marker)
RUNTIMES = ["process", pytest.param("gvisor", marks=pytest.mark.runsc)]
_LATE = Path(__file__).with_name("late_agent.py")


def late_workload(seconds: float) -> tuple[str, ...]:
    """A template command ready ``seconds`` after each start or restore (late_agent.py: why)."""
    return (
        sys.executable,
        str(_LATE),
        "--delay",
        str(seconds),
        "--host",
        "0.0.0.0",
        "--port",
        "80",
    )


def ref(name: str, atespace: str = "t") -> pb.ActorRef:
    return pb.ActorRef(atespace=atespace, name=name)


async def make_actor(
    stub: Any, name: str, atespace: str = "t", template: str = "sandbox"
) -> pb.Actor:
    code = await status_code(stub.CreateAtespace(pb.CreateAtespaceRequest(name=atespace)))
    assert code in (grpc.StatusCode.OK, grpc.StatusCode.ALREADY_EXISTS)
    response = await stub.CreateActor(
        pb.CreateActorRequest(
            actor_ref=ref(name, atespace),
            actor_template_namespace="local",
            actor_template_name=template,
        )
    )
    return response.actor


async def register_template(backend: LocalBackend, name: str, command: tuple[str, ...]) -> None:
    """Register local/<name>: the default template with ``command`` as its workload."""
    assert backend.plane is not None
    default = backend.plane.templates["local/sandbox"]
    await backend.plane.add_template(dataclasses.replace(default, name=name, command=command))


async def workload_actor(
    stub: Any, backend: LocalBackend, name: str, command: tuple[str, ...], atespace: str = "t"
) -> pb.Actor:
    """Create <atespace>/<name> from its own template, local/for-<name>, running ``command``."""
    await register_template(backend, f"for-{name}", command)
    return await make_actor(stub, name, atespace, template=f"for-{name}")


def host(name: str, atespace: str = "t") -> dict[str, str]:
    return {"Host": actor_host(name, atespace)}


async def status_code(call: Any) -> grpc.StatusCode:
    """The gRPC status an awaited call ended with (OK when it succeeded)."""
    try:
        await call
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


# ---------------------------------------------------------------------- the current API
# (added for the operator-tool tests; the June helpers above are left to their owners)
TARGET_HEADER = "ate-target-actor"
DEFAULT_TEMPLATE = pb.ObjectRef(atespace="local", name="sandbox")


def object_ref(name: str, atespace: str = "t") -> pb.ObjectRef:
    return pb.ObjectRef(atespace=atespace, name=name)


def target(name: str, atespace: str = "t") -> dict[str, str]:
    """The header that routes a request to actor `<atespace>/<name>` through the router."""
    return {TARGET_HEADER: f"{atespace}/{name}"}


def state_of(actor: pb.Actor) -> str:
    """`RUNNING`, `CRASHED`, ...: the actor's state without its `ACTOR_STATE_` prefix."""
    return str(pb.ActorState.Name(actor.status.state)).removeprefix("ACTOR_STATE_")


def new_actor_request(
    name: str,
    atespace: str = "t",
    template: pb.ObjectRef = DEFAULT_TEMPLATE,
    source_tag: pb.ObjectRef | None = None,
) -> pb.CreateActorRequest:
    actor = pb.Actor(
        metadata=pb.ResourceMetadata(atespace=atespace, name=name), actor_template=template
    )
    if source_tag is not None:
        actor.source_tag.CopyFrom(source_tag)
    return pb.CreateActorRequest(actor=actor)


def new_atespace_request(atespace: str = "t") -> pb.CreateAtespaceRequest:
    return pb.CreateAtespaceRequest(
        atespace=pb.Atespace(metadata=pb.ResourceMetadata(name=atespace))
    )


async def create_actor(
    stub: Any,
    name: str,
    atespace: str = "t",
    template: pb.ObjectRef = DEFAULT_TEMPLATE,
    source_tag: pb.ObjectRef | None = None,
) -> pb.Actor:
    """Create `<atespace>/<name>` (and its atespace, if new) over an aio stub."""
    code = await status_code(stub.CreateAtespace(new_atespace_request(atespace)))
    assert code in (grpc.StatusCode.OK, grpc.StatusCode.ALREADY_EXISTS), code
    actor: pb.Actor = await stub.CreateActor(
        new_actor_request(name, atespace, template, source_tag)
    )
    return actor


async def golden_tag(stub: Any, template: pb.ObjectRef = DEFAULT_TEMPLATE) -> str:
    """The template's golden tag (`ate-golden/<uid>`) once its build ends, over an aio stub."""
    import asyncio

    while True:
        found = await stub.GetActorTemplate(pb.GetActorTemplateRequest(actor_template=template))
        golden = found.status.golden_snapshot_status
        assert not golden.error_message, golden.error_message
        if golden.HasField("golden_tag"):
            return f"{golden.golden_tag.atespace}/{golden.golden_tag.name}"
        await asyncio.sleep(0.05)
