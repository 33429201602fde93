"""Random and edge-case requests for every ateapi RPC, built from the proto's descriptors.

Requests are generated from the message descriptors, not written per RPC, so an RPC added to
the proto is fuzzed without a change here. Values come from pools that mix names that exist
(so calls reach the state machine: resume, pause, suspend, revert, tag, fork and delete of real
actors) with the inputs that broke servers before: 20 KB names, a trailing newline, NUL,
non-ASCII, page tokens never issued, negative and huge integers, enum numbers the proto does
not define. Which pool a string comes from depends on where it sits: a template reference
names `local/sandbox`, a tag reference the tag the setup made, an actor reference an actor.
Answers are judged by the contract in `_tally.api_finding`.
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
from gym_substrate.lab.tools.fuzz._tally import Tally, api_finding
from gym_substrate.lab.tools.fuzz.rpc import (
    CALL_DEADLINE_S,
    ensure_actors,
    ensure_tag,
    wait_golden,
)
from gym_substrate.local.servicer import POLICY_RPCS

__all__ = ["ACTORS", "ATESPACES", "TAGS", "fuzz_api"]

ATESPACES = ("fz", "fz2")
ACTORS = ("a0", "a1", "a2", "a3")
TAGS = ("t0", "t1")
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
    "a/b",
    "ate-golden",
    "default",
    "!!!!",
    "====",
    "zzzz",
    "%00",
    "\ufffd",
)
_INTS = (0, 1, -1, 2, 7, 100, 2**31 - 1, -(2**31), 2**62, -(2**63))
# a request has a dozen strings: with more edge values hardly any would pass validation
_EDGE_SHARE = 0.15
_UNSET_SHARE = 0.1
# server-owned parts a client has no business setting: mostly left out, so the rest is judged
_MOSTLY_UNSET = {"status": 0.8, "create_time": 0.8, "update_time": 0.8}
# the message fields whose ObjectRef names a template, a tag, an atespace
_TEMPLATE_REFS = ("actor_template",)
_TAG_REFS = ("tag", "source_tag", "golden_tag")
_ATESPACE_REFS = ("atespace",)


def _string(rng: random.Random, field: str, path: tuple[str, ...]) -> str:
    """A value for string ``field`` of the message reached through ``path`` (field names)."""
    if rng.random() < _EDGE_SHARE:
        return rng.choice(_EDGE_STRINGS)
    parent = path[-1] if path else ""
    if field == "page_token":
        return rng.choice(("", "", "1", "2"))
    if parent in _TEMPLATE_REFS or (parent == "metadata" and "actor_template" in path):
        if field == "atespace":
            return "local"
        if field == "name":
            return rng.choice(("sandbox", "sandbox", "nope"))
    if field == "atespace":
        return rng.choice(ATESPACES)
    if field == "name":
        if parent in _TAG_REFS or (parent == "metadata" and "tag" in path):
            return rng.choice(TAGS)
        if parent in _ATESPACE_REFS or (parent == "metadata" and "atespace" in path):
            return rng.choice(ATESPACES)
        return rng.choice(ACTORS)
    if field == "uid":
        return rng.choice(("", "", "00000000-0000-4000-8000-000000000000"))
    return rng.choice(ACTORS)


def _value(rng: random.Random, fd: Any, path: tuple[str, ...]) -> Any:
    kind = fd.type
    if kind == fd.TYPE_STRING:
        return _string(rng, fd.name, path)
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


def _fill(rng: random.Random, msg: _message.Message, path: tuple[str, ...] = ()) -> None:
    depth = len(path)
    for fd in msg.DESCRIPTOR.fields:
        if rng.random() < _MOSTLY_UNSET.get(fd.name, _UNSET_SHARE):
            continue  # left unset: the server must cope with every field missing
        if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            target = getattr(msg, fd.name)
            value_fd = fd.message_type.fields_by_name["value"]
            for _ in range(rng.choice((0, 1, 1, 3))):
                good = rng.random() >= _EDGE_SHARE
                key = rng.choice(("app", "k", "example.com/k") if good else _EDGE_STRINGS)
                if value_fd.message_type is None:
                    target[key] = _value(rng, value_fd, (*path, fd.name))
            continue
        if fd.is_repeated:
            items = getattr(msg, fd.name)
            for _ in range(rng.choice((0, 1, 2))):
                if fd.message_type is not None:
                    if depth < 4:
                        _fill(rng, items.add(), (*path, fd.name))
                else:
                    items.append(_value(rng, fd, path))
            continue
        if fd.message_type is not None:
            if depth < 4:
                _fill(rng, getattr(msg, fd.name), (*path, fd.name))
            continue
        setattr(msg, fd.name, _value(rng, fd, path))


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


# fewer of the calls that empty the server: most of a run would fuzz a server without its
# template, and each template created starts a golden build (a sandbox)
_WEIGHTS = {"DeleteActorTemplate": 0.05, "CreateActorTemplate": 0.3, "DeleteAtespace": 0.3}


def _weight(path: str) -> float:
    method = path.rsplit("/", 1)[1]
    if method in POLICY_RPCS:
        return 0.1  # one answer whatever the input (UNIMPLEMENTED with the reason)
    return _WEIGHTS.get(method, 1.0)


def _classify(tally: Tally, path: str, request: Any, exc: grpc.aio.AioRpcError | None) -> None:
    method = path.rsplit("/", 1)[1]
    case = f"{method}({_short(request)})"
    if exc is None:
        tally.add("OK", case=case)
        return
    code = exc.code()
    name = code.name if code is not None else "NONE"
    finding = api_finding(method, name, exc.details() or "", unimplemented=POLICY_RPCS)
    if name == "DEADLINE_EXCEEDED" and finding is not None:
        finding = f"no answer within {CALL_DEADLINE_S:g} s"
    tally.add(name, case=case, finding=finding)


def _short(request: Any) -> str:
    text = " ".join(str(request).split())
    return text if len(text) <= 200 else f"{text[:200]}..."


async def _setup(channel: grpc.aio.Channel) -> None:
    """Atespaces, a few actors and a tag that exist, so calls reach real transitions (the
    actors start from the golden snapshot, which the tag copies)."""
    await wait_golden(channel)
    await ensure_actors(channel, ATESPACES[0], ACTORS[:2])
    await ensure_tag(channel, ATESPACES[0], TAGS[0], ACTORS[1])
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
