"""The gRPC front door: `ateapi.Control` served from one table over the proto's RPCs.

Each RPC is one row of `control_table`: the control-plane part that answers it and how its
record becomes the response. Requests arrive as bytes of the backend's API era (`--api-era`):
one that does not parse is INTERNAL as grpc-go answers it; the era's message is checked (unknown
fields, `era_rules.py`) and converted to the current one, and responses are encoded back
(`ateapi.codec`), so the table works on one model. One handler serves every row, as ateapi's
interceptor chain does: it refuses unknown request fields first
(`RejectUnknownFieldsUnaryInterceptor`), times the call (`rpc_server_call_duration_seconds`,
the `x-server-elapsed-us` trailer on every answer, errors included) and aborts with an
`AteapiError`'s code and message unchanged; any other exception is INTERNAL `internal server
error: ...`. Request and response classes come from the proto's service descriptor, so a table
that misses an RPC fails at start-up.

The policy RPCs answer UNIMPLEMENTED with the reason: the local backend does not enforce
egress or access policies, and a stored policy that did nothing would mislead.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import grpc
from google.protobuf.descriptor import MethodDescriptor
from google.protobuf.message import DecodeError, Message

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.ateapi.codec import EraCodec
from gym_substrate.ateapi.eras import CURRENT
from gym_substrate.local.control.identity import Identity
from gym_substrate.local.control.plane import ControlPlane
from gym_substrate.local.control.validation import reject_unknown_fields
from gym_substrate.local.control.worker_rpcs import WorkerRpcs
from gym_substrate.local.era_rules import check_request
from gym_substrate.local.errors import AteapiError

__all__ = ["POLICY_RPCS", "add_ateapi_services", "control_table"]

log = logging.getLogger(__name__)

Handler = Callable[[Any], Any]

_EGRESS = (
    "the local backend does not enforce egress policies: its sandboxes have no network "
    "beyond their own loopback (docs/local.md, 'What the local backend does not do')"
)
_ACCESS = (
    "the local backend does not enforce access policies: every caller that passes its auth "
    "mode may do everything (docs/local.md, 'What the local backend does not do')"
)
POLICY_RPCS: Mapping[str, str] = {
    **{f"{verb}ActorEgressPolicy": _EGRESS for verb in ("Get", "Create", "Update", "Delete")},
    **{f"{verb}GlobalAccessPolicy": _ACCESS for verb in ("Get", "Create", "Update")},
    **{f"{verb}AtespaceAccessPolicy": _ACCESS for verb in ("Get", "Create", "Update", "Delete")},
}


def _unimplemented(reason: str) -> Handler:
    def handler(request: Any) -> Any:
        raise AteapiError(grpc.StatusCode.UNIMPLEMENTED, reason)

    return handler


def _then(call: Callable[[Any], Any], shape: Callable[[Any], Any]) -> Handler:
    """``shape(await call(request))``, for a part that may be sync or async."""

    async def handler(request: Any) -> Any:
        result = call(request)
        if inspect.isawaitable(result):
            result = await result
        return shape(result)

    return handler


def control_table(plane: ControlPlane, identity: Identity) -> dict[str, Handler]:
    """Every `ateapi.Control` RPC: request message in, response message out."""
    v = plane.views
    workers = WorkerRpcs(plane)

    def actor_page(page: Any) -> pb.ListActorsResponse:
        return pb.ListActorsResponse(actors=[v.actor(r) for r in page[0]], next_page_token=page[1])

    table: dict[str, Handler] = {
        "GetActor": _then(plane.actors.get, v.actor),
        "CreateActor": _then(plane.actors.create, v.actor),
        "UpdateActor": _then(plane.actors.update, v.actor),
        "DeleteActor": _then(plane.actors.delete, v.actor),
        "ListActors": _then(plane.actors.list, actor_page),
        "ResumeActor": _then(
            plane.resume.rpc,
            lambda pair: pb.ResumeActorResponse(actor=v.actor(pair[0]), resumed=pair[1]),
        ),
        "SuspendActor": _then(
            plane.parking.suspend, lambda r: pb.SuspendActorResponse(actor=v.actor(r))
        ),
        "PauseActor": _then(plane.parking.pause, lambda r: pb.PauseActorResponse(actor=v.actor(r))),
        "RevertActor": _then(plane.revert.rpc, lambda r: pb.RevertActorResponse(actor=v.actor(r))),
        "CreateTag": _then(plane.tags.create, v.tag),
        "GetTag": _then(plane.tags.get, v.tag),
        "UpdateTag": _then(plane.tags.update, v.tag),
        "DeleteTag": _then(plane.tags.delete, v.tag),
        "ListTags": _then(
            plane.tags.list,
            lambda page: pb.ListTagsResponse(
                tags=[v.tag(r) for r in page[0]], next_page_token=page[1]
            ),
        ),
        "CreateAtespace": _then(plane.atespaces.create, v.atespace),
        "GetAtespace": _then(plane.atespaces.get, v.atespace),
        "DeleteAtespace": _then(plane.atespaces.delete, v.atespace),
        "ListAtespaces": _then(
            plane.atespaces.list,
            lambda page: pb.ListAtespacesResponse(
                atespaces=[v.atespace(r) for r in page[0]], next_page_token=page[1]
            ),
        ),
        "CreateActorTemplate": _then(plane.templates.create, v.template),
        "GetActorTemplate": _then(plane.templates.get, v.template),
        "DeleteActorTemplate": _then(plane.templates.delete, v.template),
        "ListActorTemplates": _then(
            plane.templates.list,
            lambda page: pb.ListActorTemplatesResponse(
                actor_templates=[v.template(r) for r in page[0]], next_page_token=page[1]
            ),
        ),
        "ListWorkers": _then(
            workers.list_workers,
            lambda page: pb.ListWorkersResponse(
                workers=[v.worker(w) for w in page[0]], next_page_token=page[1]
            ),
        ),
        "GetWorker": _then(workers.get, v.worker),
        "CreateWorker": _then(workers.create, v.worker),
        "UpdateWorker": _then(workers.update, v.worker),
        "DeleteWorker": _then(workers.delete, v.worker),
        "DrainWorker": _then(workers.drain, v.worker),
        "ListWorkerActorAssignments": _then(
            workers.assignments,
            lambda page: pb.ListWorkerActorAssignmentsResponse(
                actor_assignments=[_assignment(actor, worker) for actor, worker in page[0]],
                next_page_token=page[1],
            ),
        ),
        "MintActorJWT": identity.mint_jwt,
        "MintActorCertificate": identity.mint_certificate,
    }
    table.update({name: _unimplemented(reason) for name, reason in POLICY_RPCS.items()})
    return table


def _assignment(actor: Any, worker: Any) -> pb.ActorAssignment:
    return pb.ActorAssignment(
        metadata=pb.ResourceMetadata(name=actor.meta.uid),
        actor=pb.ObjectRef(atespace=actor.atespace, name=actor.name),
        actor_uid=actor.meta.uid,
        worker_epoch=actor.worker_epoch,
    )


# ------------------------------------------------------------------------------ serving
Behavior = Callable[[bytes, grpc.aio.ServicerContext[Any, Any]], Awaitable[Any]]


class _Edge:
    """One method's wire: the era's request bytes in, a current request out, checked as the
    era's server checks it (unknown fields on the era's message, then `era_rules`)."""

    def __init__(self, codec: EraCodec, method: MethodDescriptor) -> None:
        self.codec = codec
        self.name = method.name
        self.current: type[Message] = getattr(pb, method.input_type.name)
        self.wire = self.current if codec.identity else codec.era_class(method.input_type.full_name)

    def parse(self, data: bytes) -> Message:
        """The era's message; grpc-go refuses bytes that do not parse before any interceptor:
        INTERNAL `grpc: error unmarshalling request: ...` (vendor/google.golang.org/grpc/
        server.go, processUnaryRPC)."""
        try:
            return self.wire.FromString(data)
        except DecodeError as exc:
            raise AteapiError(
                grpc.StatusCode.INTERNAL, f"grpc: error unmarshalling request: {exc}"
            ) from exc

    def request(self, message: Message) -> Message:
        reject_unknown_fields(message)
        check_request(self.codec.era, self.name, message)
        return message if self.codec.identity else self.codec.from_era(message, self.current)


def _behavior(plane: ControlPlane, edge: _Edge, handler: Handler, label: str) -> Behavior:
    async def behavior(data: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        started = time.perf_counter()

        def elapsed() -> tuple[tuple[str, str], ...]:
            # as ateapi's interceptor, on every answer: its client reads it off errors too
            return (("x-server-elapsed-us", str(int((time.perf_counter() - started) * 1e6))),)

        try:
            message = edge.parse(data)
        except AteapiError as exc:  # before any interceptor: no elapsed trailer
            plane.metrics.rpc_duration.labels(label, exc.code.name).observe(0.0)
            await context.abort(exc.code, exc.message)
            raise  # unreachable: abort raises

        def observe(code: grpc.StatusCode) -> None:
            # before the answer leaves: a client that reads the metric after its call returned
            # must find the call counted (it raced the server's `finally` under load)
            plane.metrics.rpc_duration.labels(label, code.name).observe(
                time.perf_counter() - started
            )

        try:
            result = handler(edge.request(message))
            if inspect.isawaitable(result):
                result = await result
        except AteapiError as exc:
            observe(exc.code)
            await context.abort(exc.code, exc.message, elapsed())
            raise  # unreachable: abort raises
        except asyncio.CancelledError:
            observe(grpc.StatusCode.CANCELLED)
            raise
        except Exception as exc:
            if isinstance(exc, grpc.aio.AbortError):
                raise
            log.exception("%s failed", edge.name)
            observe(grpc.StatusCode.INTERNAL)
            await context.abort(
                grpc.StatusCode.INTERNAL, f"internal server error: {exc}", elapsed()
            )
            raise
        observe(grpc.StatusCode.OK)
        context.set_trailing_metadata(elapsed())
        return result

    return behavior


def add_ateapi_services(
    server: grpc.aio.Server, plane: ControlPlane, identity: Identity, era: str = CURRENT
) -> None:
    """Serve `ateapi.Control` from ``plane`` in ``era``'s wire (one model inside, converted
    here); every RPC of the proto must be in the table."""
    service = pb.DESCRIPTOR.services_by_name["Control"]
    table = control_table(plane, identity)
    expected = set(service.methods_by_name)
    if expected != set(table):
        raise RuntimeError(
            f"{service.full_name}: the servicer table does not match the proto (missing "
            f"{sorted(expected - set(table))}, unknown {sorted(set(table) - expected)})"
        )
    codec = EraCodec(era)
    handlers = {
        m.name: grpc.unary_unary_rpc_method_handler(
            _behavior(plane, _Edge(codec, m), table[m.name], f"{service.full_name}/{m.name}"),
            request_deserializer=None,  # bytes: parsed in the behavior, in the era's wire
            response_serializer=codec.encode,
        )
        for m in service.methods
    }
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service.full_name, handlers),)
    )
    # as the generated add_*Servicer_to_server do: lets grpc route these paths without a lookup
    server.add_registered_method_handlers(service.full_name, handlers)  # type: ignore[attr-defined]
