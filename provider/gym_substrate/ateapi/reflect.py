"""What a server says about itself: its services and ateapi's file descriptors, by reflection.

ateapi registers gRPC server reflection in every vintage we found (cmd/ateapi/main.go:
`reflection.Register(mux)`; the walkthrough of main on 2026-09-26, search id 68660195273, and the
current server's `New()`, id 71651480767), so a client can read the server's own descriptors and
decide its era from them (`eras.detect_era`). One request stream asks for the service list and
the file that defines `ateapi.Control` (with the files it imports). Both the provider's
`grpc.aio` client and the stacks' blocking one use it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import grpc
import grpc.aio
from google.protobuf import descriptor_pb2
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

__all__ = ["CONTROL", "Reflected", "reflect", "reflect_sync"]

CONTROL = "ateapi.Control"
Metadata = Sequence[tuple[str, str]] | None


@dataclass(frozen=True)
class Reflected:
    """The server's services, and the descriptors of the files behind `ateapi.Control` (empty
    when it does not describe that service)."""

    services: frozenset[str]
    files: tuple[descriptor_pb2.FileDescriptorProto, ...]

    def control_methods(self) -> set[str] | None:
        for proto in self.files:
            if proto.package != "ateapi":
                continue
            for service in proto.service:
                if service.name == "Control":
                    return {m.name for m in service.method}
        return None


def _requests() -> list[reflection_pb2.ServerReflectionRequest]:
    return [
        reflection_pb2.ServerReflectionRequest(list_services=""),
        reflection_pb2.ServerReflectionRequest(file_containing_symbol=CONTROL),
    ]


def _collect(replies: Iterable[reflection_pb2.ServerReflectionResponse]) -> Reflected:
    services: frozenset[str] = frozenset()
    files: list[descriptor_pb2.FileDescriptorProto] = []
    for reply in replies:
        if reply.HasField("list_services_response"):
            services = frozenset(s.name for s in reply.list_services_response.service)
        elif reply.HasField("file_descriptor_response"):
            for raw in reply.file_descriptor_response.file_descriptor_proto:
                files.append(descriptor_pb2.FileDescriptorProto.FromString(raw))
    return Reflected(services, tuple(files))


async def reflect(channel: grpc.aio.Channel, metadata: Metadata, timeout_s: float) -> Reflected:
    """The server's reflection answer; grpc.RpcError as the call raised it (UNIMPLEMENTED when
    the server serves no reflection)."""
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)  # type: ignore[no-untyped-call]
    call = stub.ServerReflectionInfo(iter(_requests()), timeout=timeout_s, metadata=metadata)
    return _collect([reply async for reply in call])


def reflect_sync(channel: grpc.Channel, metadata: Metadata, timeout_s: float) -> Reflected:
    """`reflect` for a blocking channel (the stacks' client)."""
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)  # type: ignore[no-untyped-call]
    return _collect(
        stub.ServerReflectionInfo(iter(_requests()), timeout=timeout_s, metadata=metadata)
    )
