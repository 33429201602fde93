"""Refuse a June-era ateapi before the first call, with one error that says what to run instead.

Upstream replaced its gRPC API in Aug-Sep 2026 without a version number on the wire: the
package (`ateapi`) and service (`ateapi.Control`) kept their names while every message changed,
so a client built from the current proto talking to a June server gets errors that explain
nothing (fields decoded as the wrong type, UNIMPLEMENTED for half the calls). The only reliable
tell is which methods and services the server has. ateapi registers gRPC server reflection
(cmd/ateapi/main.go), so we ask it: a `Control` without `RevertActor`/`CreateTag`, or a
`SessionIdentity` service (gone since), is June-era. A server that does not serve reflection
gets one cheap probe instead: `ListTags(page_size=1)` answers UNIMPLEMENTED only on a June
server; any other answer (even NOT_FOUND or PERMISSION_DENIED) proves the method exists.
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc
import grpc.aio
from google.protobuf import descriptor_pb2
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.ateapi import ateapi_pb2_grpc as pb_grpc
from gym_substrate.nemo.errors import UnsupportedServerError, translate_grpc_error

__all__ = ["JUNE_API_COMMIT", "SUPPORTED", "check_server"]

# The last commit of this project that speaks the June 2026 API (main before issue 20).
JUNE_API_COMMIT = "5d48b0e"
SUPPORTED = "Agent Substrate v0.2.0 and later (the API of upstream's ateapi.proto at 2179589f)"

_CONTROL = "ateapi.Control"
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


async def _reflect(
    channel: grpc.aio.Channel, metadata: Metadata, timeout_s: float, label: str
) -> tuple[set[str], set[str] | None] | None:
    """(services, methods of ateapi.Control or None), or None when reflection is not served."""
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)  # type: ignore[no-untyped-call]
    requests = [
        reflection_pb2.ServerReflectionRequest(list_services=""),
        reflection_pb2.ServerReflectionRequest(file_containing_symbol=_CONTROL),
    ]
    services: set[str] = set()
    methods: set[str] | None = None
    try:
        call = stub.ServerReflectionInfo(iter(requests), timeout=timeout_s, metadata=metadata)
        async for reply in call:
            if reply.HasField("list_services_response"):
                services = {s.name for s in reply.list_services_response.service}
            elif reply.HasField("file_descriptor_response"):
                methods = _control_methods(reply.file_descriptor_response.file_descriptor_proto)
    except grpc.RpcError as exc:
        code = exc.code() if callable(getattr(exc, "code", None)) else None  # type: ignore[misc]
        if code in _TRANSIENT:
            raise translate_grpc_error(exc, label) from exc
        return None  # UNIMPLEMENTED (no reflection), or reflection refused us: probe instead
    return services, methods


def _control_methods(files: Sequence[bytes]) -> set[str] | None:
    for raw in files:
        proto = descriptor_pb2.FileDescriptorProto.FromString(raw)
        if proto.package != "ateapi":
            continue
        for service in proto.service:
            if service.name == "Control":
                return {m.name for m in service.method}
    return None


async def _probe(
    channel: grpc.aio.Channel, atespace: str, metadata: Metadata, timeout_s: float, label: str
) -> bool:
    """True when the server has `ListTags`, i.e. speaks the current API."""
    stub = pb_grpc.ControlStub(channel)  # type: ignore[no-untyped-call]
    try:
        await stub.ListTags(
            pb.ListTagsRequest(atespace=atespace, page_size=1),
            timeout=timeout_s,
            metadata=metadata,
        )
    except grpc.RpcError as exc:
        code = exc.code() if callable(getattr(exc, "code", None)) else None  # type: ignore[misc]
        if code == grpc.StatusCode.UNIMPLEMENTED:
            return False
        if code in _TRANSIENT:
            raise translate_grpc_error(exc, label) from exc
    return True


async def check_server(
    channel: grpc.aio.Channel,
    *,
    api: str,
    atespace: str,
    metadata: Metadata,
    timeout_s: float,
    method: str = "ServerReflectionInfo",
) -> None:
    """`UnsupportedServerError` for a June-era server; `ControlPlaneError` if it cannot be told.

    Reflection first; the ListTags probe when reflection is not served or does not describe
    ateapi.Control (a proxy in front of ateapi, say). A server that cannot be reached is
    reported under ``method``, the call the user made, as that call would have been.
    """
    reflected = await _reflect(channel, metadata, timeout_s, method)
    if reflected is not None:
        services, methods = reflected
        if _JUNE_ONLY_SERVICE in services:
            raise _refusal(api, f"it serves {_JUNE_ONLY_SERVICE}")
        if methods is not None:
            missing = [m for m in _CURRENT_METHODS if m not in methods]
            if missing:
                raise _refusal(api, f"its {_CONTROL} has no {' or '.join(missing)}")
            return
    if not await _probe(channel, atespace, metadata, timeout_s, method):
        raise _refusal(api, "ListTags is UNIMPLEMENTED")
