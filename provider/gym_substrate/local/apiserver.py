"""The local API's gRPC server, put together as cmd/ateapi/main.go puts ateapi's together.

real (cmd/ateapi/internal/server `New()`, read_file id 71651480767; main.go@18d1c266 is the
same): one server with the auth interceptor first on unary and
streaming calls (`--auth-mode`, `auth.py`), then `reflection.Register` (v1 and v1alpha) and
`ateapi.Control` (upstream also serves atelet's `ateapi.WorkerService`, which nothing here
calls); no `grpc.health.v1.Health` (readiness is HTTP `/readyz` on the metrics port, here the
admin listener's). A method it does not serve is
answered as grpc-go answers it (UNIMPLEMENTED `unknown service <s>` / `unknown method <m> for
service <s>`, vendor/google.golang.org/grpc/server.go), before any interceptor, so even in jwt
mode a call without a token learns only that the method does not exist.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection, reflection_pb2

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.ateapi.codec import EraCodec
from gym_substrate.ateapi.eras import CURRENT, parse_era
from gym_substrate.local.auth import BearerAuthInterceptor, TokenVerifier
from gym_substrate.local.control.identity import Identity
from gym_substrate.local.control.plane import ControlPlane
from gym_substrate.local.servicer import add_ateapi_services

__all__ = ["REFLECTION_SERVICES", "SERVED_SERVICES", "create_api_server", "served_methods"]

REFLECTION_V1 = "grpc.reflection.v1.ServerReflection"
REFLECTION_SERVICES = (REFLECTION_V1, reflection.SERVICE_NAME)
# what reflection lists: every registered service, sorted (grpc-go's ListServices)
SERVED_SERVICES = tuple(
    sorted([*(s.full_name for s in pb.DESCRIPTOR.services_by_name.values()), *REFLECTION_SERVICES])
)


def served_methods() -> frozenset[str]:
    """Every `/service/method` path the server answers (the ones the interceptor guards)."""
    paths = {
        f"/{service.full_name}/{method.name}"
        for service in pb.DESCRIPTOR.services_by_name.values()
        for method in service.methods
    }
    paths.update(f"/{name}/ServerReflectionInfo" for name in REFLECTION_SERVICES)
    return frozenset(paths)


class _UnknownMethods(grpc.GenericRpcHandler):  # type: ignore[type-arg]
    """Last in line: grpc-go's UNIMPLEMENTED for a path nothing else serves."""

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> Any:
        service, _, method = handler_call_details.method.lstrip("/").rpartition("/")
        if service in SERVED_SERVICES:
            message = f"unknown method {method} for service {service}"
        else:
            message = f"unknown service {service or method}"

        async def unimplemented(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, message)

        return grpc.stream_stream_rpc_method_handler(unimplemented)


def _era_pool(era: str) -> descriptor_pool.DescriptorPool | None:
    """What reflection describes: the era's ateapi (`EraCodec(era).pool`, so a client reading
    it, `eras.detect_era`, names the era) plus reflection's own file; None (the default pool)
    for the current era."""
    if parse_era(era) == CURRENT:
        return None
    pool = EraCodec(era).pool
    own = descriptor_pb2.FileDescriptorProto()
    reflection_pb2.DESCRIPTOR.CopyToProto(own)
    pool.Add(own)
    return pool


def _add_reflection(server: grpc.aio.Server, era: str) -> None:
    """v1alpha from grpcio-reflection, and v1 (the same messages under the newer name, which
    grpcurl and grpc-go clients try first) from the same servicer."""
    pool = _era_pool(era)
    reflection.enable_server_reflection(SERVED_SERVICES, server, pool=pool)
    aio = reflection.aio  # type: ignore[attr-defined]
    servicer = aio.ReflectionServicer(SERVED_SERVICES, pool=pool)
    handler = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(REFLECTION_V1, {"ServerReflectionInfo": handler}),)
    )


def create_api_server(
    plane: ControlPlane,
    *,
    verifier: TokenVerifier | None,
    identity: Identity,
    options: Sequence[tuple[str, Any]] = (),
    era: str = CURRENT,
) -> grpc.aio.Server:
    """The server, not yet listening; ``verifier`` set means jwt mode (every call checked);
    ``era`` is the API era it speaks on the wire and describes by reflection."""
    interceptors = [] if verifier is None else [BearerAuthInterceptor(verifier, served_methods())]
    server = grpc.aio.server(interceptors=interceptors, options=list(options))
    _add_reflection(server, era)
    add_ateapi_services(server, plane, identity, era)
    server.add_generic_rpc_handlers((_UnknownMethods(),))
    return server
