"""Random and edge-case requests for every ateapi RPC, built from the proto's descriptors.

Requests are generated from the message descriptors, not written per RPC, so an RPC added to
the proto is fuzzed without a change here. Values come from pools that mix names that exist
(so calls reach the state machine: resume, pause, suspend and delete of real actors) with the
inputs that broke servers before: 20 KB names, a trailing newline, NUL, non-ASCII, page tokens
never issued, negative and huge integers, enum numbers the proto does not define.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf import message as _message
from google.protobuf import message_factory

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.tools.fuzz._rpc import CALL_DEADLINE_S, ensure_actors
from gym_substrate.tools.fuzz._tally import Tally

__all__ = ["REAL_INTERNALS", "fuzz_api"]

# INTERNAL answers the real server also gives for these inputs (a bad page token from its Redis
# pager, a workflow step that fails on a state it cannot handle); any other INTERNAL is ours.
REAL_INTERNALS = ("invalid page token", "workflow failed at step")

# What the server itself answers when a workflow outlives its deadline (workflow.go), unlike
# the client's own "Deadline Exceeded".
_SERVER_DEADLINE = "context deadline exceeded"

ATESPACES = ("fz", "fz2")
ACTORS = ("a0", "a1", "a2", "a3")
_EDGE_STRINGS = (
    "",
    " ",
    "A",
    "a" * 63,
    "a" * 64,
    "a" * 20_000,
    "fz\n",
    "a\x00b",
    "\u0661\u0662",
    "../etc",
    "-a",
    "a-",
    "a.b",
    "ate-golden",
    "default",
    "!!!!",
    "====",
    "zzzz",
    "%00",
    "\ufffd",
)
_INTS = (0, 1, -1, 2, 7, 100, 2**31 - 1, -(2**31), 2**62, -(2**63))


def _string(rng: random.Random, field: str) -> str:
    roll = rng.random()
    if roll < 0.55:
        if "template_namespace" in field:
            return "local"
        if "template_name" in field:
            return rng.choice(("sandbox", "sandbox", "nope"))
        if "atespace" in field or field == "name":
            return rng.choice(ATESPACES + ACTORS)
        if field == "page_token":
            return rng.choice(("", "", "1", "2"))
        return rng.choice(ACTORS)
    return rng.choice(_EDGE_STRINGS)


def _value(rng: random.Random, fd: Any, depth: int) -> Any:
    kind = fd.type
    if kind == fd.TYPE_STRING:
        return _string(rng, fd.name)
    if kind == fd.TYPE_BYTES:
        return rng.randbytes(rng.choice((0, 1, 64)))
    if kind == fd.TYPE_BOOL:
        return rng.random() < 0.5
    if kind == fd.TYPE_ENUM:
        numbers = [v.number for v in fd.enum_type.values]
        return rng.choice([*numbers, 999])
    if kind in (fd.TYPE_DOUBLE, fd.TYPE_FLOAT):
        return rng.choice((0.0, -1.0, 1e300, float("nan")))
    if kind in (fd.TYPE_UINT32, fd.TYPE_FIXED32):
        return rng.choice((0, 1, 2**32 - 1))
    if kind in (fd.TYPE_UINT64, fd.TYPE_FIXED64):
        return rng.choice((0, 1, 2**64 - 1))
    if kind in (fd.TYPE_INT32, fd.TYPE_SINT32, fd.TYPE_SFIXED32):
        return max(-(2**31), min(2**31 - 1, rng.choice(_INTS)))
    return rng.choice(_INTS)


def _fill(rng: random.Random, msg: _message.Message, depth: int = 0) -> None:
    for fd in msg.DESCRIPTOR.fields:
        if rng.random() < 0.15:
            continue  # left unset: the server must cope with every field missing
        if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            target = getattr(msg, fd.name)
            value_fd = fd.message_type.fields_by_name["value"]
            for _ in range(rng.choice((0, 1, 1, 3))):
                key = rng.choice(("app", "k", "example.com/k", *_EDGE_STRINGS))
                if value_fd.message_type is None:
                    target[key] = _value(rng, value_fd, depth)
            continue
        if fd.is_repeated:
            items = getattr(msg, fd.name)
            for _ in range(rng.choice((0, 1, 2))):
                if fd.message_type is not None:
                    if depth < 3:
                        _fill(rng, items.add(), depth + 1)
                else:
                    items.append(_value(rng, fd, depth))
            continue
        if fd.message_type is not None:
            if depth < 3:
                _fill(rng, getattr(msg, fd.name), depth + 1)
            continue
        setattr(msg, fd.name, _value(rng, fd, depth))


def _methods() -> list[tuple[str, Any, Any]]:
    """(path, request class, response class) of every unary RPC in the proto."""
    methods = []
    for service in pb.DESCRIPTOR.services_by_name.values():
        for method in service.methods:
            methods.append(
                (
                    f"/{service.full_name}/{method.name}",
                    message_factory.GetMessageClass(method.input_type),
                    message_factory.GetMessageClass(method.output_type),
                )
            )
    return methods


def _weight(path: str) -> float:
    # DebugClear wipes everything, so most of a run would fuzz an empty server.
    return 0.05 if path.endswith("/DebugClear") else 1.0


def _classify(tally: Tally, path: str, request: Any, exc: grpc.aio.AioRpcError | None) -> None:
    method = path.rsplit("/", 1)[1]
    case = f"{method}({_short(request)})"
    if exc is None:
        tally.add("OK", case=case)
        return
    code = exc.code()
    details = exc.details() or ""
    name = code.name if code is not None else "NONE"
    finding: str | None = None
    if code == grpc.StatusCode.UNKNOWN:
        finding = f"unhandled exception: {details}"
    elif code == grpc.StatusCode.INTERNAL and not any(s in details for s in REAL_INTERNALS):
        finding = f"INTERNAL the real server does not give: {details}"
    elif code == grpc.StatusCode.DEADLINE_EXCEEDED and details != _SERVER_DEADLINE:
        finding = f"no answer within {CALL_DEADLINE_S:g} s"
    elif code == grpc.StatusCode.UNIMPLEMENTED:
        finding = f"an RPC of the proto the server does not serve: {details}"
    elif code in (
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.DATA_LOSS,
    ):
        finding = f"{name}: {details}"
    tally.add(name, case=case, finding=finding)


def _short(request: Any) -> str:
    text = " ".join(str(request).split())
    return text if len(text) <= 200 else f"{text[:200]}..."


async def _setup(channel: grpc.aio.Channel) -> None:
    """Atespaces and a few actors that exist, so calls reach real transitions."""
    await ensure_actors(channel, ATESPACES[0], ACTORS[:2])
    for space in ATESPACES[1:]:
        await ensure_actors(channel, space, ())


async def fuzz_api(
    channel: grpc.aio.Channel,
    *,
    requests: int,
    seed: int,
    concurrency: int = 8,
    progress: Callable[[int], None] | None = None,
) -> Tally:
    """Send `requests` generated calls over `channel`; every answer is counted in the tally."""
    if requests < 1:
        raise ValueError(f"requests must be >= 1, got {requests}")
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    rng = random.Random(seed)
    tally = Tally(server="ateapi", seed=seed)
    methods = _methods()
    weights = [_weight(path) for path, _, _ in methods]
    await _setup(channel)
    stubs = {
        path: channel.unary_unary(
            path,
            request_serializer=req.SerializeToString,
            response_deserializer=resp.FromString,
        )
        for path, req, resp in methods
    }
    plan = []
    for _ in range(requests):
        path, request_class, _ = rng.choices(methods, weights)[0]
        request = request_class()
        _fill(rng, request)
        plan.append((path, request))
    gate = asyncio.Semaphore(concurrency)

    async def one(path: str, request: Any) -> None:
        async with gate:
            try:
                await stubs[path](request, timeout=CALL_DEADLINE_S)
            except grpc.aio.AioRpcError as exc:
                _classify(tally, path, request, exc)
            else:
                _classify(tally, path, request, None)
            if progress is not None:
                progress(1)

    await asyncio.gather(*(one(path, request) for path, request in plan))
    return tally
