"""The gRPC front door: ateapi's services served from one table over the proto's RPCs.

Each `ateapi.Control` RPC is one row of `CONTROL_RPCS`: the `ControlPlane` method it calls, how
the request's fields become that method's arguments, and how the result becomes the response's
fields. One handler serves every row: it times the call (`rpc_server_call_duration_seconds`,
the `x-server-elapsed-us` trailer on every answer, errors included) and aborts with an
`ApiError`'s code and message unchanged.
The servicer decides nothing: validation, state and every error are the plane's; here requests
become arguments and records become messages (`ProtobufViews`). Request and response classes
come from the proto's service descriptor, so a table that misses an RPC fails at start-up.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import socket
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.descriptor import MethodDescriptor, ServiceDescriptor

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.local.errors import ApiError
from gym_substrate.local.lifecycle import ControlPlane
from gym_substrate.local.runtimes.base import Slot
from gym_substrate.local.session_identity import SessionIdentity
from gym_substrate.local.slots import WORKER_NAMESPACE, WORKER_POOL
from gym_substrate.local.store import ActorRecord, WorkerRecord

__all__ = ["CONTROL_RPCS", "ProtobufViews", "Rpc", "add_ateapi_services"]

log = logging.getLogger(__name__)


class ProtobufViews:
    """The ateapi messages for the plane's records (what the responses carry)."""

    def __init__(self, plane: ControlPlane) -> None:
        self.plane = plane
        self.node_name = socket.gethostname()

    def actor_pb(self, record: ActorRecord) -> pb.Actor:
        actor = pb.Actor(
            actor_id=record.actor_id,
            version=record.version,
            actor_template_namespace=record.template_namespace,
            actor_template_name=record.template_name,
            status=pb.Actor.Status.Value(record.status),  # type: ignore[arg-type]
            in_progress_snapshot=record.in_progress_snapshot,
            atespace=record.atespace,
            worker_selector=pb.Selector(match_labels=record.worker_selector),
        )
        if record.slot is not None:
            actor.ateom_pod_namespace = WORKER_NAMESPACE
            actor.ateom_pod_name = self.plane.worker_pod(record.slot)
            actor.ateom_pod_uid = record.pod_uid
            actor.worker_pool_name = WORKER_POOL
            actor.ateom_pod_ip = record.address
        if record.snapshot_kind == "local":
            actor.latest_snapshot_info.CopyFrom(
                pb.SnapshotInfo(
                    type=pb.SNAPSHOT_TYPE_LOCAL,
                    local=pb.LocalSnapshotInfo(
                        snapshot_prefix=record.snapshot_path,
                        node_vms_with_local_snapshots=[self.node_name],
                    ),
                )
            )
        elif record.snapshot_kind == "external":
            actor.latest_snapshot_info.CopyFrom(
                pb.SnapshotInfo(
                    type=pb.SNAPSHOT_TYPE_EXTERNAL,
                    external=pb.ExternalSnapshotInfo(
                        snapshot_uri_prefix=Path(record.snapshot_path).as_uri()
                    ),
                )
            )
        return actor

    def worker_pb(self, worker: WorkerRecord, actor: ActorRecord | None) -> pb.Worker:
        out = pb.Worker(
            worker_namespace=WORKER_NAMESPACE,
            worker_pool=WORKER_POOL,
            worker_pod=self.plane.worker_pod(worker.slot),
            version=worker.version,
            worker_pod_uid=worker.uid,
            node_name=self.node_name,
            # every worker has its pod's IP, free or not (real: controlapi/syncer.go)
            ip=self.plane.runtime.worker_ip(Slot(worker.slot)),
        )
        if actor is not None:
            out.actor_namespace = actor.template_namespace
            out.actor_template = actor.template_name
            out.actor_id = actor.actor_id
            out.actor_atespace = actor.atespace
        return out


# ------------------------------------------------------------------------------ the table
def _no_args(request: Any) -> tuple[Any, ...]:
    return ()


def _nothing(views: ProtobufViews, result: Any) -> dict[str, Any]:
    return {}


def _ref(request: Any) -> tuple[str, str]:
    return request.actor_ref.atespace, request.actor_ref.name


def _name(request: Any) -> tuple[str]:
    return (request.name,)


def _selector(message: pb.Selector) -> dict[str, str]:
    return dict(message.match_labels)


def _actor(views: ProtobufViews, record: ActorRecord) -> dict[str, Any]:
    return {"actor": views.actor_pb(record)}


def _atespace(views: ProtobufViews, name: str) -> dict[str, Any]:
    return {"atespace": pb.Atespace(name=name)}


@dataclass(frozen=True)
class Rpc:
    """One RPC: ``ControlPlane.<method>(*args(request))``, then ``response(views, result)``.

    ``response`` returns the response message's fields; the method may be sync or async.
    """

    method: str
    args: Callable[[Any], tuple[Any, ...]] = _no_args
    response: Callable[[ProtobufViews, Any], dict[str, Any]] = _nothing


CONTROL_RPCS: Mapping[str, Rpc] = {
    "GetActor": Rpc("get_actor", _ref, _actor),
    "CreateActor": Rpc(
        "create_actor",
        lambda r: (
            *_ref(r),
            r.actor_template_namespace,
            r.actor_template_name,
            _selector(r.worker_selector),
        ),
        _actor,
    ),
    "UpdateActor": Rpc("update_actor", lambda r: (*_ref(r), _selector(r.worker_selector)), _actor),
    "SuspendActor": Rpc("suspend_actor", _ref, _actor),
    "PauseActor": Rpc("pause_actor", _ref, _actor),
    "ResumeActor": Rpc("resume_actor", lambda r: (*_ref(r), r.boot), _actor),
    "DeleteActor": Rpc("delete_actor", _ref),
    "ListWorkers": Rpc(
        "workers_list",
        response=lambda views, pairs: {"workers": [views.worker_pb(w, a) for w, a in pairs]},
    ),
    "ListActors": Rpc(
        "list_actors",
        lambda r: (r.page_size, r.page_token, r.atespace),
        lambda views, page: {
            "actors": [views.actor_pb(record) for record in page[0]],
            "next_page_token": page[1],
        },
    ),
    "CreateAtespace": Rpc("create_atespace", _name, _atespace),
    "GetAtespace": Rpc("get_atespace", _name, _atespace),
    "ListAtespaces": Rpc(
        "list_atespaces",
        response=lambda views, names: {"atespaces": [pb.Atespace(name=n) for n in names]},
    ),
    "DeleteAtespace": Rpc("delete_atespace", _name),
    "DebugClear": Rpc("debug_clear"),
}


# ------------------------------------------------------------------------------ serving
Behavior = Callable[[Any, grpc.aio.ServicerContext[Any, Any]], Any]


def _message_class(descriptor: Any) -> Any:
    return getattr(pb, descriptor.name)


def _method_handler(
    method: MethodDescriptor, behavior: Behavior
) -> grpc.RpcMethodHandler[Any, Any]:
    return grpc.unary_unary_rpc_method_handler(
        behavior,
        request_deserializer=_message_class(method.input_type).FromString,
        response_serializer=_message_class(method.output_type).SerializeToString,
    )


def _control_behavior(
    plane: ControlPlane, views: ProtobufViews, method: MethodDescriptor, rpc: Rpc
) -> Behavior:
    response_class = _message_class(method.output_type)
    call = getattr(plane, rpc.method)
    label = f"{method.containing_service.full_name}/{method.name}"

    async def behavior(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        started = time.perf_counter()
        code = grpc.StatusCode.OK

        def elapsed() -> tuple[tuple[str, str], ...]:
            # as ateapi's interceptor, on every answer: its client reads it off errors too
            return (("x-server-elapsed-us", str(int((time.perf_counter() - started) * 1e6))),)

        try:
            result = call(*rpc.args(request))
            if inspect.isawaitable(result):
                result = await result
            response = response_class(**rpc.response(views, result))
        except ApiError as exc:
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
        return response

    return behavior


def _register(
    server: grpc.aio.Server,
    service: ServiceDescriptor,
    names: Collection[str],
    behavior_for: Callable[[MethodDescriptor], Behavior],
) -> None:
    """Serve every RPC of ``service``; ``names`` (the table's rows) must be exactly its RPCs."""
    expected = set(service.methods_by_name)
    if expected != set(names):
        raise RuntimeError(
            f"{service.full_name}: the servicer table does not match the proto (missing "
            f"{sorted(expected - set(names))}, unknown {sorted(set(names) - expected)})"
        )
    handlers = {m.name: _method_handler(m, behavior_for(m)) for m in service.methods}
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service.full_name, handlers),)
    )
    # as the generated add_*Servicer_to_server do: lets grpc route these paths without a lookup
    server.add_registered_method_handlers(service.full_name, handlers)  # type: ignore[attr-defined]


def add_ateapi_services(
    server: grpc.aio.Server, plane: ControlPlane, identity: SessionIdentity | None = None
) -> None:
    """Serve ateapi.Control from ``plane`` and ateapi.SessionIdentity from ``identity`` (by
    default one that trusts no issuer: `session_identity.py`)."""
    services = pb.DESCRIPTOR.services_by_name
    views = ProtobufViews(plane)
    _register(
        server,
        services["Control"],
        CONTROL_RPCS,
        lambda method: _control_behavior(plane, views, method, CONTROL_RPCS[method.name]),
    )
    behaviors = (identity or SessionIdentity()).behaviors
    _register(server, services["SessionIdentity"], behaviors, lambda method: behaviors[method.name])
