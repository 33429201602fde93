"""The table-driven servicer: one row per proto RPC, requests in, the parts' errors out unchanged.

A scripted plane stands in for the control plane's parts, so what the servicer itself does is
seen alone: every RPC of `ateapi.Control` has a row, unknown fields are refused before any part
runs, an AteapiError reaches the client as it is and anything else is INTERNAL `internal server
error: ...`, each answer carries the elapsed trailer and is counted under its code
(internal/ateinterceptors/ateinterceptors.go@2e3e300a, rejectunknown_test.go@2e3e300a).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.ateapi import ateapi_pb2_grpc as pb_grpc
from gym_substrate.local import servicer
from gym_substrate.local.errors import AteapiError
from gym_substrate.local.metrics import Metrics

C = grpc.StatusCode
CONTROL = pb.DESCRIPTOR.services_by_name["Control"]


class Part:
    """One part of the plane (`actors`, `resume`, ...): each method answers from the script."""

    def __init__(self, name: str, plane: ScriptedPlane) -> None:
        self._name = name
        self._plane = plane

    def __getattr__(self, method: str) -> Callable[..., Any]:
        key = f"{self._name}.{method}"

        def call(*args: Any) -> Any:
            self._plane.calls.append((key, args))
            if key not in self._plane.script:
                raise NotImplementedError(key)
            return self._plane.script[key](*args)

        return call


class ScriptedPlane:
    def __init__(self, script: dict[str, Callable[..., Any]]) -> None:
        self.metrics = Metrics()
        self.script = script
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def __getattr__(self, name: str) -> Part:
        return Part(name, self)


@pytest.fixture
async def served() -> AsyncIterator[tuple[ScriptedPlane, Any, grpc.aio.Channel]]:
    def missing(request: Any) -> None:
        raise AteapiError(
            C.NOT_FOUND, f"Actor {request.actor.atespace}/{request.actor.name} not found"
        )

    def broken(request: Any) -> None:
        raise ValueError("boom")

    plane = ScriptedPlane(
        {
            "resume.rpc": lambda request: ("record", True),
            "views.actor": lambda record: pb.Actor(
                metadata=pb.ResourceMetadata(atespace="t", name="a", version=3),
                status=pb.ActorStatus(state=pb.ACTOR_STATE_RUNNING),
            ),
            "actors.get": missing,
            "atespaces.list": broken,
        }
    )
    server = grpc.aio.server()
    servicer.add_ateapi_services(server, plane, Part("identity", plane))  # type: ignore[arg-type]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield plane, pb_grpc.ControlStub(channel), channel  # type: ignore[no-untyped-call]
    finally:
        await channel.close()
        await server.stop(None)


def test_the_table_covers_the_proto() -> None:
    plane = ScriptedPlane({})
    table = servicer.control_table(plane, Part("identity", plane))  # type: ignore[arg-type]
    assert set(table) == set(CONTROL.methods_by_name)
    assert set(servicer.POLICY_RPCS) < set(table)


async def test_requests_reach_the_parts_and_records_become_messages(
    served: tuple[ScriptedPlane, Any, grpc.aio.Channel],
) -> None:
    plane, stub, _ = served
    request = pb.ResumeActorRequest(actor=pb.ObjectRef(atespace="t", name="a"))
    call = stub.ResumeActor(request)
    answer = await call
    assert (answer.actor.metadata.name, answer.actor.metadata.version, answer.resumed) == (
        "a",
        3,
        True,
    )
    assert plane.calls == [("resume.rpc", (request,)), ("views.actor", ("record",))]
    assert "x-server-elapsed-us" in dict(await call.trailing_metadata())


async def test_part_errors_pass_through_unchanged(
    served: tuple[ScriptedPlane, Any, grpc.aio.Channel],
) -> None:
    plane, stub, _ = served
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.GetActor(pb.GetActorRequest(actor=pb.ObjectRef(atespace="x", name="a")))
    assert (info.value.code(), info.value.details()) == (C.NOT_FOUND, "Actor x/a not found")
    call = stub.ListAtespaces(pb.ListAtespacesRequest())
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    assert (info.value.code(), info.value.details()) == (C.INTERNAL, "internal server error: boom")
    assert "x-server-elapsed-us" in dict(await call.trailing_metadata())
    rendered = plane.metrics.render().decode()
    for method, code in (("GetActor", "NOT_FOUND"), ("ListAtespaces", "INTERNAL")):
        assert f'rpc_method="ateapi.Control/{method}",rpc_response_status_code="{code}"' in (
            rendered
        )


async def test_unknown_fields_are_refused_before_any_part_runs(
    served: tuple[ScriptedPlane, Any, grpc.aio.Channel],
) -> None:
    plane, _, channel = served
    raw = channel.unary_unary(
        "/ateapi.Control/ResumeActor",
        request_serializer=lambda payload: payload,
        response_deserializer=lambda payload: payload,
    )
    payload = pb.ResumeActorRequest(actor=pb.ObjectRef(atespace="t", name="a")).SerializeToString()
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await raw(payload + b"\xf8\x06\x01")  # field 111, varint 1
    assert (info.value.code(), info.value.details()) == (
        C.INVALID_ARGUMENT,
        "request: Invalid value: unknown field with protobuf tag 111",
    )
    assert plane.calls == []


async def test_policy_rpcs_answer_unimplemented_with_the_reason(
    served: tuple[ScriptedPlane, Any, grpc.aio.Channel],
) -> None:
    plane, _, channel = served
    for name, reason in servicer.POLICY_RPCS.items():
        call = channel.unary_unary(
            f"/ateapi.Control/{name}",
            request_serializer=lambda payload: payload,
            response_deserializer=lambda payload: payload,
        )
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call(b"")
        assert (info.value.code(), info.value.details()) == (C.UNIMPLEMENTED, reason)
        assert "does not enforce" in reason
    assert plane.calls == []


async def test_a_table_that_misses_an_rpc_fails_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    real = servicer.control_table

    def partial(plane: Any, identity: Any) -> dict[str, Any]:
        table = real(plane, identity)
        del table["RevertActor"]
        return table

    monkeypatch.setattr(servicer, "control_table", partial)
    plane = ScriptedPlane({})
    with pytest.raises(RuntimeError, match=r"missing \['RevertActor'\]"):
        servicer.add_ateapi_services(grpc.aio.server(), plane, Part("identity", plane))  # type: ignore[arg-type]
