"""ateapi under hostile input (issue 14, "The API"): every answer is the contract's code.

Each test sends the input the fuzzing run found: a 20 KB name, names ending in a newline, page
tokens this server never issued, messages over the size limit.
"""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from local_helpers import make_actor, ref

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.local.backend import MAX_MESSAGE_BYTES
from gym_substrate.local.errors import quote

C = grpc.StatusCode


async def _error(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value


def _create(
    stub: Any, name: str = "a1", *, template: str = "sandbox", labels: dict[str, str] | None = None
) -> Any:
    return stub.CreateActor(
        pb.CreateActorRequest(
            actor_ref=ref(name),
            actor_template_namespace="local",
            actor_template_name=template,
            worker_selector=pb.Selector(match_labels=labels or {}),
        )
    )


def test_quote_caps_what_it_repeats() -> None:
    assert quote("fz") == "'fz'"
    long = "a" * 20_000
    assert quote(long) == f"{'a' * 64!r}... (20000 characters)"
    assert quote("x\n") == "'x\\n'"


async def test_long_names_are_invalid_argument_not_resource_exhausted(stub: Any) -> None:
    """A 20 KB name gets ateapi's code, never RESOURCE_EXHAUSTED: the label checks repeat no
    input (internal/resources/actor.go), a message that repeats one quotes 64 characters and
    the length, so it fits metadata. GetActor checks only emptiness: NOT_FOUND (get_actor.go)."""
    long = "a" * 20_000
    await stub.CreateAtespace(pb.CreateAtespaceRequest(name="t"))
    calls = [
        (stub.CreateAtespace(pb.CreateAtespaceRequest(name=long)), C.INVALID_ARGUMENT, False),
        (stub.GetAtespace(pb.GetAtespaceRequest(name=long)), C.INVALID_ARGUMENT, False),
        (stub.GetActor(pb.GetActorRequest(actor_ref=ref(long))), C.NOT_FOUND, True),
        (_create(stub, long, template="x"), C.INVALID_ARGUMENT, False),
        (stub.ListActors(pb.ListActorsRequest(atespace=long)), C.INVALID_ARGUMENT, False),
        (_create(stub, labels={long: "v"}), C.INVALID_ARGUMENT, True),
        (_create(stub, labels={"k": long}), C.INVALID_ARGUMENT, True),
    ]
    for call, code, repeats in calls:
        error = await _error(call)
        assert error.code() == code, error
        assert ("(20000 characters)" in (error.details() or "")) is repeats, error
        assert len(error.details() or "") < 1000
    # a template name is quoted the same way in its FAILED_PRECONDITION
    error = await _error(_create(stub, template=long))
    assert error.code() == C.FAILED_PRECONDITION
    assert len(error.details() or "") < 400


async def test_names_ending_in_a_newline_are_refused(stub: Any) -> None:
    """`$` matches before a trailing newline; every check anchors at the true end."""
    error = await _error(stub.CreateAtespace(pb.CreateAtespaceRequest(name="fz\n")))
    assert error.code() == C.INVALID_ARGUMENT
    await stub.CreateAtespace(pb.CreateAtespaceRequest(name="t"))
    error = await _error(_create(stub, "a\n"))
    assert error.code() == C.INVALID_ARGUMENT
    for labels in ({"k\n": "v"}, {"k": "v\n"}, {"ex.com\n/k": "v"}):
        error = await _error(_create(stub, labels=labels))
        assert error.code() == C.INVALID_ARGUMENT, labels
    listed = await stub.ListActors(pb.ListActorsRequest(atespace="t"))
    assert list(listed.actors) == []
    assert [a.name for a in (await stub.ListAtespaces(pb.ListAtespacesRequest())).atespaces] == [
        "ate-golden",
        "t",
    ]


@pytest.mark.parametrize("token", ["!!!!", "====", "zzzz", "%%%not-a-token", "dC9h\n"])
async def test_bad_page_tokens_are_internal_like_ateredis(stub: Any, token: str) -> None:
    """Real: ateredis.go listPage fails "invalid page token: ..." and the RPC is INTERNAL."""
    await make_actor(stub, "p0")
    error = await _error(stub.ListActors(pb.ListActorsRequest(page_token=token)))
    assert error.code() == C.INTERNAL
    assert "invalid page token" in (error.details() or "")


async def test_issued_page_tokens_still_page(stub: Any) -> None:
    for index in range(3):
        await make_actor(stub, f"p{index}")
    first = await stub.ListActors(pb.ListActorsRequest(page_size=2, atespace="t"))
    assert first.next_page_token
    rest = await stub.ListActors(
        pb.ListActorsRequest(page_size=2, page_token=first.next_page_token, atespace="t")
    )
    assert [a.actor_id for a in [*first.actors, *rest.actors]] == ["p0", "p1", "p2"]
    assert rest.next_page_token == ""


async def test_over_limit_message_is_resource_exhausted_and_server_keeps_serving(
    stub: Any,
) -> None:
    """grpc-go's default receive cap (4 MiB), which ateapi keeps: RESOURCE_EXHAUSTED, then on."""
    assert MAX_MESSAGE_BYTES == 4 * 1024 * 1024
    error = await _error(stub.CreateAtespace(pb.CreateAtespaceRequest(name="a" * (5 << 20))))
    assert error.code() == C.RESOURCE_EXHAUSTED
    # 3 MB is under the limit: a plain INVALID_ARGUMENT with a short message
    error = await _error(stub.CreateAtespace(pb.CreateAtespaceRequest(name="a" * (3 << 20))))
    assert error.code() == C.INVALID_ARGUMENT
    created = await stub.CreateAtespace(pb.CreateAtespaceRequest(name="after"))
    assert created.atespace.name == "after"
