"""Before the first call: which ateapi the server speaks, decided from the server itself.

Upstream changed its API twice without a version number on the wire. In Aug-Sep 2026 it replaced
the June API (package and service names kept, every message changed); since then its releases
differ where tags, snapshots and template snapshot settings live (`gym_substrate.ateapi.eras`:
v0.3 for v0.2.0/v0.3.0, v0.4 for v0.4.x, current for main at 2179589f). ateapi registers gRPC
reflection in every vintage, so we ask the server for its own descriptors:

* June-era (a `SessionIdentity` service, or a `Control` without RevertActor/CreateTag): refused
  with one error naming the last gym-substrate commit that speaks it.
* Otherwise its era is read field by field (`eras.detect_era`); a descriptor set that fits no
  era is refused naming the fields, and a configured `connection.api_era` that contradicts the
  server is refused naming both.
* A server that serves no reflection (a proxy in front of ateapi, say): `ListTags` answering
  anything but UNIMPLEMENTED proves it is not June's; then the configured era decides, else the
  era is read from the wire of one stored template (`SnapshotConfig` field 1: a varint on v0.3,
  absent on v0.4, a string on current). With neither, the error says to set
  `connection.api_era`: a guess could write templates or read tags wrongly.
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc
import grpc.aio
from google.protobuf.message import DecodeError

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.ateapi import ateapi_pb2_grpc as pb_grpc
from gym_substrate.ateapi.eras import CURRENT, ERA_RELEASES, V03, V04, EraError, detect_era
from gym_substrate.ateapi.reflect import CONTROL, reflect
from gym_substrate.nemo.errors import UnsupportedServerError, translate_grpc_error

__all__ = ["JUNE_API_COMMIT", "SUPPORTED", "check_server", "era_from_template_wire"]

# The last commit of this project that speaks the June 2026 API (main before issue 20).
JUNE_API_COMMIT = "5d48b0e"
SUPPORTED = "Agent Substrate v0.2.0 and later (the API of upstream's ateapi.proto at 2179589f)"
_RELEASES = "; ".join(f"{era}: {releases}" for era, releases in ERA_RELEASES.items())

_JUNE_ONLY_SERVICE = "ateapi.SessionIdentity"
# Methods every current Control has and no June one had.
_CURRENT_METHODS = ("RevertActor", "CreateTag")
# Codes that say "ask again later", not "this is the answer": the caller's retry loop sees them.
_TRANSIENT = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)

Metadata = Sequence[tuple[str, str]] | None


def _refusal(api: str, why: str) -> UnsupportedServerError:
    return UnsupportedServerError(
        f"ateapi at {api} speaks the June 2026 API ({why}); this gym-substrate supports "
        f"{SUPPORTED}. Upgrade Substrate, or use gym-substrate at commit {JUNE_API_COMMIT}, "
        "the last one that speaks the June API (see docs/compatibility.md)"
    )


def _code(exc: grpc.RpcError) -> grpc.StatusCode | None:
    return exc.code() if callable(getattr(exc, "code", None)) else None  # type: ignore[attr-defined,no-any-return]


async def _probe(
    channel: grpc.aio.Channel, atespace: str, metadata: Metadata, timeout_s: float, label: str
) -> bool:
    """True when the server has `ListTags`, i.e. is not June's."""
    stub = pb_grpc.ControlStub(channel)  # type: ignore[no-untyped-call]
    try:
        await stub.ListTags(
            pb.ListTagsRequest(atespace=atespace, page_size=1),
            timeout=timeout_s,
            metadata=metadata,
        )
    except grpc.RpcError as exc:
        if _code(exc) == grpc.StatusCode.UNIMPLEMENTED:
            return False
        if _code(exc) in _TRANSIENT:
            raise translate_grpc_error(exc, label) from exc
    return True


def _fields(data: bytes) -> dict[int, tuple[int, bytes | int]]:
    """The top-level fields of a protobuf message: number -> (wire type, last value)."""
    found: dict[int, tuple[int, bytes | int]] = {}
    at = 0

    def varint() -> int:
        nonlocal at
        value = shift = 0
        while True:
            byte = data[at]
            at += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return value

    while at < len(data):
        key = varint()
        number, wire = key >> 3, key & 7
        if wire == 0:
            found[number] = (wire, varint())
        elif wire == 2:
            size = varint()
            found[number] = (wire, data[at : at + size])
            at += size
        elif wire in (1, 5):
            at += 8 if wire == 1 else 4
            found[number] = (wire, 0)
        else:
            raise ValueError(f"wire type {wire} of field {number}")
    return found


def era_from_template_wire(listed: bytes) -> str | None:
    """The era a `ListActorTemplatesResponse`'s first template is written in (None: none)."""
    first = _fields(listed).get(1)  # actor_templates
    if first is None or not isinstance(first[1], bytes):
        return None
    config = _fields(first[1]).get(5)  # snapshot_config
    if config is None or not isinstance(config[1], bytes):
        return None
    fields = _fields(config[1])
    if fields.get(1, (None,))[0] == 2:  # storage_location (a string)
        return CURRENT
    if fields.get(1, (None,))[0] == 0 or 3 in fields:  # on_pause / on_resume
        return V03
    if 4 in fields:  # storage_location, on_commit alone beside it
        return V04
    return None


async def _wire_era(
    channel: grpc.aio.Channel, metadata: Metadata, timeout_s: float, label: str
) -> str | None:
    call = channel.unary_unary(
        f"/{CONTROL}/ListActorTemplates",
        request_serializer=pb.ListActorTemplatesRequest.SerializeToString,
        response_deserializer=lambda data: data,
    )
    try:
        listed = await call(
            pb.ListActorTemplatesRequest(page_size=1), timeout=timeout_s, metadata=metadata
        )
    except grpc.RpcError as exc:
        if _code(exc) in _TRANSIENT:
            raise translate_grpc_error(exc, label) from exc
        return None
    try:
        return era_from_template_wire(listed)
    except (ValueError, IndexError):
        return None


def _agree(api: str, configured: str, declared: str) -> str:
    if configured not in ("auto", declared):
        raise UnsupportedServerError(
            f"connection.api_era is {configured}, but ateapi at {api} declares the {declared} "
            f"era in its own descriptors ({ERA_RELEASES[declared]}): set connection.api_era "
            f"to {declared} or to auto"
        )
    return declared


async def check_server(
    channel: grpc.aio.Channel,
    *,
    api: str,
    atespace: str,
    metadata: Metadata,
    timeout_s: float,
    configured: str = "auto",
    method: str = "ServerReflectionInfo",
) -> str:
    """The server's era; `UnsupportedServerError` when it cannot be served, `ControlPlaneError`
    when it could not be asked (reported under ``method``, the call the user made)."""
    try:
        reflected = await reflect(channel, metadata, timeout_s)
    except grpc.RpcError as exc:
        if _code(exc) in _TRANSIENT:
            raise translate_grpc_error(exc, method) from exc
        reflected = None  # UNIMPLEMENTED (no reflection), or reflection refused us
    except DecodeError as exc:
        raise UnsupportedServerError(
            f"ateapi at {api} answered reflection with descriptors that cannot be read ({exc}), "
            "so its era is unknown and nothing was sent. Fix: check that connection.api is "
            "ateapi's address, and report the server's version"
        ) from None
    if reflected is not None:
        if _JUNE_ONLY_SERVICE in reflected.services:
            raise _refusal(api, f"it serves {_JUNE_ONLY_SERVICE}")
        methods = reflected.control_methods()
        if methods is not None:
            missing = [m for m in _CURRENT_METHODS if m not in methods]
            if missing:
                raise _refusal(api, f"its {CONTROL} has no {' or '.join(missing)}")
            try:
                return _agree(api, configured, detect_era(reflected.files))
            except EraError as exc:
                raise UnsupportedServerError(
                    f"ateapi at {api}: {exc}. gym-substrate speaks {_RELEASES} "
                    "(docs/compatibility.md)"
                ) from None
    if not await _probe(channel, atespace, metadata, timeout_s, method):
        raise _refusal(api, "ListTags is UNIMPLEMENTED")
    if configured != "auto":
        return configured
    era = await _wire_era(channel, metadata, timeout_s, method)
    if era is None:
        raise UnsupportedServerError(
            f"ateapi at {api} serves no gRPC reflection and has no template to read its era "
            f"from: set connection.api_era to one of {_RELEASES} (docs/compatibility.md)"
        )
    return era
