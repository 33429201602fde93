"""The table-driven servicer: one row per proto RPC, requests in, plane errors out unchanged."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.ateapi import ateapi_pb2_grpc as pb_grpc
from gym_substrate.local.errors import ApiError
from gym_substrate.local.lifecycle import ControlPlane
from gym_substrate.local.metrics import Metrics
from gym_substrate.local.servicer import CONTROL_RPCS, add_ateapi_services
from gym_substrate.local.store import ActorRecord


def test_the_table_covers_the_proto_and_names_plane_methods() -> None:
    service = pb.DESCRIPTOR.services_by_name["Control"]
    assert set(CONTROL_RPCS) == set(service.methods_by_name)
    for name, rpc in CONTROL_RPCS.items():
        assert callable(getattr(ControlPlane, rpc.method, None)), name


class ScriptedPlane:
    """Answers each plane method from `script`; records the arguments it was called with."""

    def __init__(self, script: dict[str, Callable[..., Any]]) -> None:
        self.metrics = Metrics()
        self.script = script
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def worker_pod(self, slot: int) -> str:
        return f"gstest-worker-{slot}"

    def __getattr__(self, name: str) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            self.calls.append((name, args))
            return self.script[name](*args)

        return call


@pytest.fixture
async def served() -> AsyncIterator[tuple[ScriptedPlane, Any, Any]]:
    async def resume(atespace: str, actor_id: str, boot: bool) -> ActorRecord:
        return ActorRecord(atespace, actor_id, "local", "sandbox", "STATUS_RUNNING", version=3)

    def missing(atespace: str, actor_id: str) -> None:
        raise ApiError(grpc.StatusCode.NOT_FOUND, f"Actor {actor_id} not found in atespace x")

    def broken() -> None:
        raise ValueError("boom")

    plane = ScriptedPlane(
        {
            "resume_actor": resume,
            "get_actor": missing,
            "list_atespaces": broken,
            "create_atespace": lambda name: name,
        }
    )
    server = grpc.aio.server()
    add_ateapi_services(server, plane)  # type: ignore[arg-type]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield plane, pb_grpc.ControlStub(channel), pb_grpc.SessionIdentityStub(channel)
    finally:
        await channel.close()
        await server.stop(None)


async def test_requests_become_arguments_and_records_messages(
    served: tuple[ScriptedPlane, Any, Any],
) -> None:
    plane, stub, _ = served
    ref = pb.ActorRef(atespace="t", name="a")
    call = stub.ResumeActor(pb.ResumeActorRequest(actor_ref=ref, boot=True))
    actor = (await call).actor
    assert (actor.actor_id, actor.atespace, actor.version) == ("a", "t", 3)
    assert actor.status == pb.Actor.Status.STATUS_RUNNING
    assert plane.calls == [("resume_actor", ("t", "a", True))]
    assert "x-server-elapsed-us" in dict(await call.trailing_metadata())
    created = await stub.CreateAtespace(pb.CreateAtespaceRequest(name="t"))
    assert created.atespace.name == "t"


async def test_plane_errors_pass_through_unchanged(served: tuple[ScriptedPlane, Any, Any]) -> None:
    plane, stub, identity = served
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.GetActor(pb.GetActorRequest(actor_ref=pb.ActorRef(atespace="x", name="a")))
    assert (info.value.code(), info.value.details()) == (
        grpc.StatusCode.NOT_FOUND,
        "Actor a not found in atespace x",
    )
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.ListAtespaces(pb.ListAtespacesRequest())
    assert (info.value.code(), info.value.details()) == (
        grpc.StatusCode.INTERNAL,
        "internal server error: boom",
    )
    # real: sessionidentity.go checks the caller's token itself, before anything else
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await identity.MintJWT(pb.MintJWTRequest(app_id="a"))
    assert (info.value.code(), info.value.details()) == (
        grpc.StatusCode.UNAUTHENTICATED,
        "Need authorization header",
    )
    rendered = plane.metrics.render().decode()
    for method, code in (("GetActor", "NOT_FOUND"), ("ListAtespaces", "INTERNAL")):
        assert (
            f'rpc_method="ateapi.Control/{method}",rpc_response_status_code="{code}"'
        ) in rendered


async def test_a_table_that_misses_an_rpc_fails_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    from gym_substrate.local import servicer

    partial = {k: v for k, v in CONTROL_RPCS.items() if k != "DebugClear"}
    monkeypatch.setattr(servicer, "CONTROL_RPCS", partial)
    with pytest.raises(RuntimeError, match=r"missing \['DebugClear'\]"):
        servicer.add_ateapi_services(grpc.aio.server(), ScriptedPlane({}))  # type: ignore[arg-type]
