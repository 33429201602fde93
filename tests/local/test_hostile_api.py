"""ateapi under hostile input (issue 14, "The API"): every answer is the contract's code.

Each test sends the input the fuzzing run found, re-based on today's API: a 20 KB name, names
ending in a newline, page tokens this server never issued, messages over the size limit,
thousands of unknown fields. The messages follow Kubernetes' field errors (resources.ToAPIError,
read_file id 70618905453): a value is repeated quoted and capped, so every answer fits gRPC's
metadata and keeps its code.
"""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from local_helpers import actor_message, answer, ensure_atespace, make_actor, ref

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.local import LocalBackend
from gym_substrate.local.backend import MAX_MESSAGE_BYTES
from gym_substrate.local.errors import go_quote, quote

C = grpc.StatusCode


def _create(stub: Any, name: str = "a1", **labels: str) -> Any:
    actor = actor_message(name, labels=labels or None)
    return stub.CreateActor(pb.CreateActorRequest(actor=actor))


def _atespace(name: str) -> pb.CreateAtespaceRequest:
    return pb.CreateAtespaceRequest(atespace=pb.Atespace(metadata=pb.ResourceMetadata(name=name)))


def test_quote_caps_what_it_repeats() -> None:
    assert quote("fz") == "'fz'"
    long = "a" * 20_000
    assert quote(long) == f"{'a' * 64!r}... (20000 characters)"
    assert quote("x\n") == "'x\\n'"
    assert go_quote("x\n") == '"x\\n"'
    assert go_quote(long) == '"' + "a" * 64 + '"... (20000 characters)'


async def test_long_names_are_invalid_argument_not_resource_exhausted(stub: Any) -> None:
    """A 20 KB name gets ateapi's code, never RESOURCE_EXHAUSTED: each field error repeats the
    value Go-quoted and capped at 64 characters plus the length, so the status fits metadata.
    Every name is a k8s short name (ateapi.proto@2179589f `+k8s:format=k8s-short-name`), so
    GetActor refuses it too (June: NOT_FOUND)."""
    long = "a" * 20_000
    await ensure_atespace(stub, "t")
    template = actor_message("a1")
    template.actor_template.name = long
    calls = [
        stub.CreateAtespace(_atespace(long)),
        stub.GetAtespace(pb.GetAtespaceRequest(atespace=pb.ObjectRef(name=long))),
        stub.GetActor(pb.GetActorRequest(actor=ref(long))),
        _create(stub, long),
        stub.CreateActor(pb.CreateActorRequest(actor=template)),
        stub.ListActors(pb.ListActorsRequest(atespace=long)),
        _create(stub, **{long: "v"}),
        _create(stub, k=long),
    ]
    for call in calls:
        code, message = await answer(call)
        assert code == C.INVALID_ARGUMENT, message
        assert "(20000 characters)" in message
        assert len(message) < 2000


async def test_names_ending_in_a_newline_are_refused(stub: Any) -> None:
    """`$` matches before a trailing newline; every check anchors at the true end."""
    assert (await answer(stub.CreateAtespace(_atespace("fz\n"))))[0] == C.INVALID_ARGUMENT
    await ensure_atespace(stub, "t")
    assert (await answer(_create(stub, "a\n")))[0] == C.INVALID_ARGUMENT
    for labels in ({"k\n": "v"}, {"k": "v\n"}, {"ex.com\n/k": "v"}):
        assert (await answer(_create(stub, **labels)))[0] == C.INVALID_ARGUMENT, labels
    listed = await stub.ListActors(pb.ListActorsRequest(atespace="t"))
    assert list(listed.actors) == []
    spaces = await stub.ListAtespaces(pb.ListAtespacesRequest())
    assert [a.metadata.name for a in spaces.atespaces] == ["ate-golden", "local", "t"]


@pytest.mark.parametrize("token", ["!!!!", "====", "zzzz", "%%%not-a-token", "dC9h\n", "e30="])
async def test_page_tokens_this_server_never_issued_are_invalid_argument(
    stub: Any, token: str
) -> None:
    """real: a token that does not decode to this list's `{"v":1,"kind",...}` is INVALID_ARGUMENT
    `invalid page_token` (`mapListError`, controlapi/pagination.go@18d1c266). (June: INTERNAL
    "invalid page token: ...", as ateredis.go answered.)"""
    await make_actor(stub, "p0")
    assert await answer(stub.ListActors(pb.ListActorsRequest(page_token=token))) == (
        C.INVALID_ARGUMENT,
        "invalid page_token",
    )


async def test_a_page_token_over_256_bytes_is_too_long(stub: Any) -> None:
    """real: `page_token` has `+k8s:maxLength=256` (ateapi.proto@2179589f): a longer one is a
    field error, not a decode attempt."""
    code, message = await answer(stub.ListActors(pb.ListActorsRequest(page_token="A" * 300)))
    assert code == C.INVALID_ARGUMENT
    assert message.startswith("page_token: Too long"), message


async def test_issued_page_tokens_still_page(stub: Any) -> None:
    for index in range(3):
        await make_actor(stub, f"p{index}")
    first = await stub.ListActors(pb.ListActorsRequest(page_size=2, atespace="t"))
    assert first.next_page_token
    rest = await stub.ListActors(
        pb.ListActorsRequest(page_size=2, page_token=first.next_page_token, atespace="t")
    )
    assert [a.metadata.name for a in [*first.actors, *rest.actors]] == ["p0", "p1", "p2"]
    assert rest.next_page_token == ""


async def test_over_limit_message_is_resource_exhausted_and_server_keeps_serving(
    stub: Any,
) -> None:
    """grpc-go's default receive cap (4 MiB), which ateapi keeps: RESOURCE_EXHAUSTED, then on."""
    assert MAX_MESSAGE_BYTES == 4 * 1024 * 1024
    assert (await answer(stub.CreateAtespace(_atespace("a" * (5 << 20)))))[0] == (
        C.RESOURCE_EXHAUSTED
    )
    # 3 MB is under the limit: a plain INVALID_ARGUMENT with a short message
    code, message = await answer(stub.CreateAtespace(_atespace("a" * (3 << 20))))
    assert code == C.INVALID_ARGUMENT
    assert len(message) < 1000
    created = await stub.CreateAtespace(_atespace("after"))
    assert created.metadata.name == "after"


async def test_thousands_of_unknown_fields_get_one_short_answer(
    stub: Any, backend: LocalBackend
) -> None:
    """Unknown fields give one error per message that holds them (internal/ateinterceptors/
    rejectunknown_test.go@2e3e300a): 50,000 on one message are one line; a request whose every
    one of thousands of nested messages holds one still answers INVALID_ARGUMENT, not a status
    too large for the client's metadata."""
    unknown = b"\xf8\x06\x01"  # field 111, varint 1
    one_message = pb.ListActorsRequest().SerializeToString() + unknown * 50_000
    async with grpc.aio.insecure_channel(backend.api_address) as channel:
        raw = channel.unary_unary(
            "/ateapi.Control/ListActors",
            request_serializer=lambda payload: payload,
            response_deserializer=lambda payload: payload,
        )
        assert await answer(raw(one_message)) == (
            C.INVALID_ARGUMENT,
            "request: Invalid value: unknown field with protobuf tag 111",
        )
        env = pb.EnvVar.FromString(pb.EnvVar(name="A").SerializeToString() + unknown)
        template = pb.ActorTemplate(metadata=pb.ResourceMetadata(atespace="local", name="x"))
        template.containers.add(name="c").env.extend([env] * 5000)
        code, message = await answer(
            stub.CreateActorTemplate(pb.CreateActorTemplateRequest(actor_template=template))
        )
        assert code == C.INVALID_ARGUMENT
        assert message.startswith(
            "[actor_template.containers[0].env[0]: Invalid value: unknown field with protobuf "
            "tag 111, "
        )
        assert len(message) < 16 * 1024
