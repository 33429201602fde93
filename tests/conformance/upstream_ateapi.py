"""Upstream's ateapi, compiled independently of ours, for the conformance tests.

`upstream/ateapi_upstream.proto` is our own transcription of upstream's wire tables
(agent-substrate/substrate `pkg/proto/ateapipb/ateapi.proto` at commit
2179589ffdc1d10c8a676042ac8355682863553d). It is compiled at test time with grpc_tools' protoc
into a descriptor set and loaded into a descriptor pool of its own: its full names are the same
as those of our generated module (`gym_substrate.ateapi.ateapi_pb2`, in the default pool), so
the two must never meet in one pool.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import Message

UPSTREAM_REPO = "agent-substrate/substrate"
UPSTREAM_PATH = "pkg/proto/ateapipb/ateapi.proto"
UPSTREAM_COMMIT = "2179589ffdc1d10c8a676042ac8355682863553d"

INCLUDE_ROOT = Path(__file__).resolve().parent / "upstream"
PROTO_NAME = "ateapi_upstream.proto"
PACKAGE = "ateapi"


def compile_descriptor_set(out_dir: Path) -> descriptor_pb2.FileDescriptorSet:
    """protoc the upstream transcription (with its imports) into ``out_dir``; return the set."""
    from grpc_tools import protoc  # dev dependency

    well_known = Path(protoc.__file__).resolve().parent / "_proto"
    out = out_dir / "ateapi_upstream.binpb"
    rc = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{INCLUDE_ROOT}",
            f"-I{well_known}",
            f"--descriptor_set_out={out}",
            "--include_imports",
            PROTO_NAME,
        ]
    )
    if rc != 0:
        raise RuntimeError(f"protoc failed on {INCLUDE_ROOT / PROTO_NAME} (exit code {rc})")
    return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())


def upstream_file(fds: descriptor_pb2.FileDescriptorSet) -> descriptor_pb2.FileDescriptorProto:
    """The transcription's own FileDescriptorProto out of the set (the rest are its imports)."""
    for fdp in fds.file:
        if fdp.name == PROTO_NAME:
            return fdp
    raise LookupError(f"{PROTO_NAME} is not in the descriptor set")


def separate_pool(fds: descriptor_pb2.FileDescriptorSet) -> descriptor_pool.DescriptorPool:
    """A fresh pool holding the set; dependencies come first, as --include_imports orders them."""
    pool = descriptor_pool.DescriptorPool()
    for fdp in fds.file:
        pool.Add(fdp)
    return pool


@dataclass(frozen=True)
class Upstream:
    """Dynamic message classes and enum numbers of the upstream API, from a separate pool."""

    pool: descriptor_pool.DescriptorPool

    def cls(self, name: str) -> type[Message]:
        """The message class of ``ateapi.<name>``."""
        found: type[Message] = message_factory.GetMessageClass(
            self.pool.FindMessageTypeByName(f"{PACKAGE}.{name}")
        )
        return found

    def new(self, message: str, /, **fields: Any) -> Message:
        """A new ``ateapi.<message>`` with ``fields`` set (a field may be called ``name``)."""
        return self.cls(message)(**fields)

    def enum(self, enum_name: str, value_name: str) -> int:
        """The number of ``value_name`` in ``ateapi.<enum_name>``."""
        enum = self.pool.FindEnumTypeByName(f"{PACKAGE}.{enum_name}")
        number: int = enum.values_by_name[value_name].number
        return number

    def enum_name(self, enum_name: str, number: int) -> str:
        enum = self.pool.FindEnumTypeByName(f"{PACKAGE}.{enum_name}")
        value = enum.values_by_number.get(number)
        return value.name if value is not None else str(number)


class ControlClient:
    """Calls `ateapi.Control` over a grpc.aio channel with the upstream message classes only."""

    def __init__(self, channel: grpc.aio.Channel, upstream: Upstream) -> None:
        self._channel = channel
        self._upstream = upstream
        self._service = upstream.pool.FindServiceByName(f"{PACKAGE}.Control")

    async def call(self, method: str, request: Message, deadline_s: float = 120.0) -> Any:
        descriptor = self._service.FindMethodByName(method)
        if descriptor is None:
            raise LookupError(f"upstream Control has no RPC {method}")
        request_cls = message_factory.GetMessageClass(descriptor.input_type)
        response_cls = message_factory.GetMessageClass(descriptor.output_type)
        if type(request) is not request_cls:
            raise TypeError(f"{method} takes {request_cls.__name__}, got {type(request).__name__}")
        stub = self._channel.unary_unary(
            f"/{self._service.full_name}/{method}",
            request_serializer=request_cls.SerializeToString,
            response_deserializer=response_cls.FromString,
        )
        return await stub(request, timeout=deadline_s)

    async def call_raw(self, method: str, payload: bytes, deadline_s: float = 30.0) -> bytes:
        """Send ``payload`` as the request bytes of ``method`` unchanged; the answer's bytes."""
        stub = self._channel.unary_unary(f"/{self._service.full_name}/{method}")
        answer: bytes = await stub(payload, timeout=deadline_s)
        return answer
