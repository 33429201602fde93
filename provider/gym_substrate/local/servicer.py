"""The gRPC front door: `ateapi.Control` served from one table over the proto's RPCs.

Each RPC is one row of `control_table`: the control-plane part that answers it and how its
record becomes the response. One handler serves every row, as ateapi's interceptor chain does:
it refuses unknown request fields first (`RejectUnknownFieldsUnaryInterceptor`), times the call
(`rpc_server_call_duration_seconds`, the `x-server-elapsed-us` trailer on every answer, errors
included) and aborts with an `AteapiError`'s code and message unchanged; any other exception is
INTERNAL `internal server error: ...`. Request and response classes come from the proto's
service descriptor, so a table that misses an RPC fails at start-up.

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

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.local.control.identity import Identity
from gym_substrate.local.control.plane import ControlPlane
from gym_substrate.local.control.validation import reject_unknown_fields
from gym_substrate.local.control.worker_rpcs import WorkerRpcs
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
Behavior = Callable[[Any, grpc.aio.ServicerContext[Any, Any]], Awaitable[Any]]


def _behavior(plane: ControlPlane, method: MethodDescriptor, handler: Handler) -> Behavior:
    label = f"{method.containing_service.full_name}/{method.name}"

    async def behavior(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        started = time.perf_counter()
        code = grpc.StatusCode.OK

        def elapsed() -> tuple[tuple[str, str], ...]:
            # as ateapi's interceptor, on every answer: its client reads it off errors too
            return (("x-server-elapsed-us", str(int((time.perf_counter() - started) * 1e6))),)

        try:
            reject_unknown_fields(request)
            result = handler(request)
            if inspect.isawaitable(result):
                result = await result
        except AteapiError as exc:
            code = exc.code
            await context.abort(exc.code, exc.message, elapsed())
            raise  # unreachable: abort raises
        except asyncio.CancelledError:
            code = grpc.StatusCode.CANCELLED
            raise
        except Exception as exc:
            if isinstance(exc, grpc.aio.AbortError):
                raise
            code = grpc.StatusCode.INTERNAL
            log.exception("%s failed", method.name)
            await context.abort(
                grpc.StatusCode.INTERNAL, f"internal server error: {exc}", elapsed()
            )
            raise
        finally:
            plane.metrics.rpc_duration.labels(label, code.name).observe(
                time.perf_counter() - started
            )
        context.set_trailing_metadata(elapsed())
        return result

    return behavior


def add_ateapi_services(server: grpc.aio.Server, plane: ControlPlane, identity: Identity) -> None:
    """Serve `ateapi.Control` from ``plane``; every RPC of the proto must be in the table."""
    service = pb.DESCRIPTOR.services_by_name["Control"]
    table = control_table(plane, identity)
    expected = set(service.methods_by_name)
    if expected != set(table):
        raise RuntimeError(
            f"{service.full_name}: the servicer table does not match the proto (missing "
            f"{sorted(expected - set(table))}, unknown {sorted(set(table) - expected)})"
        )
    handlers = {
        m.name: grpc.unary_unary_rpc_method_handler(
            _behavior(plane, m, table[m.name]),
            request_deserializer=getattr(pb, m.input_type.name).FromString,
            response_serializer=getattr(pb, m.output_type.name).SerializeToString,
        )
        for m in service.methods
    }
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service.full_name, handlers),)
    )
    # as the generated add_*Servicer_to_server do: lets grpc route these paths without a lookup
    server.add_registered_method_handlers(service.full_name, handlers)  # type: ignore[attr-defined]
