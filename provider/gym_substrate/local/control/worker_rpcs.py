"""The Worker RPCs (controlapi/worker.go): read, drain, relabel, and re-register the pool's own.

The local pool's workers are the backend's `--workers` pods. ListWorkers, GetWorker and
ListWorkerActorAssignments read them; DrainWorker stops placements on one (idempotent);
UpdateWorker changes its labels and epoch (a rising epoch crashes the actors it held, as an
ateom restart does); DeleteWorker takes one out of the pool (its actors are crashed: the worker
pod went away) and CreateWorker registers it again under a fresh name. A worker pod this
backend does not have cannot be registered: there is nothing to run its actors.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import TYPE_CHECKING

import grpc

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.local.control.atespaces import check_preconditions
from gym_substrate.local.control.crashes import WORKER_GONE
from gym_substrate.local.control.paging import check_page_request, page
from gym_substrate.local.control.records import WORKER_ACTIVE, ActorRecord, WorkerRecord
from gym_substrate.local.control.validation import FieldErrors, check_short_name, validated_ref
from gym_substrate.local.errors import AteapiError

if TYPE_CHECKING:
    from gym_substrate.local.control.plane import ControlPlane

__all__ = ["WorkerRpcs"]


class WorkerRpcs:
    def __init__(self, plane: ControlPlane) -> None:
        self.plane = plane
        self.pool = plane.pool

    def list_workers(self, request: pb.ListWorkersRequest) -> tuple[list[WorkerRecord], str]:
        errors = FieldErrors()
        check_page_request(errors, request.page_size, request.page_token)
        errors.raise_if_any()
        return page(
            self.pool.all(),
            lambda w: (w.meta.name,),
            kind="worker",
            scope="",
            page_size=request.page_size,
            page_token=request.page_token,
        )

    def get(self, request: pb.GetWorkerRequest) -> WorkerRecord:
        return self.pool.get(validated_ref(request, "worker", atespaced=False))

    def drain(self, request: pb.DrainWorkerRequest) -> WorkerRecord:
        return self.pool.drain(validated_ref(request, "worker", atespaced=False))

    def assignments(
        self, request: pb.ListWorkerActorAssignmentsRequest
    ) -> tuple[list[tuple[ActorRecord, WorkerRecord]], str]:
        errors = FieldErrors()
        check_page_request(errors, request.page_size, request.page_token)
        errors.raise_if_any()
        worker = self.pool.get(validated_ref(request, "worker", atespaced=False))
        actors = self.plane.state.actors
        rows = [
            (actors[key], worker) for key in self.pool.holders(worker).values() if key in actors
        ]
        return page(
            rows,
            lambda row: (row[0].meta.uid,),
            kind="worker-assignment",
            scope="",
            page_size=request.page_size,
            page_token=request.page_token,
        )

    def update(self, request: pb.UpdateWorkerRequest) -> WorkerRecord:
        errors = FieldErrors()
        if not request.HasField("worker"):
            errors.required("worker")
            errors.raise_if_any()
        sent = request.worker
        check_short_name(errors, "worker.metadata.name", sent.metadata.name, required=True)
        errors.raise_if_any()
        name = sent.metadata.name
        if not sent.metadata.uid or not sent.metadata.version:
            missing = "uid" if not sent.metadata.uid else "version"
            raise AteapiError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"while updating worker {name}: persistence: precondition required: {missing}",
            )
        worker = self.pool.get(name)
        if sent.metadata.uid != worker.meta.uid:
            raise AteapiError(
                grpc.StatusCode.ABORTED, f"Worker {name} is not the one the request describes"
            )
        if sent.metadata.version != worker.meta.version:
            raise AteapiError(grpc.StatusCode.ABORTED, "concurrent update conflict, please retry")
        view = self.plane.views.worker(worker)
        for field in (
            "worker_namespace",
            "worker_pool",
            "worker_pod",
            "worker_pod_uid",
            "node_name",
        ):
            if getattr(sent, field) != getattr(view, field):
                raise AteapiError(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"worker.{field}: Invalid value: {getattr(sent, field)!r}: field is immutable",
                )
        if list(sent.ips) != list(view.ips):
            raise AteapiError(
                grpc.StatusCode.INVALID_ARGUMENT, "worker.ips: Invalid value: field is immutable"
            )
        if sent.epoch < worker.epoch:
            raise AteapiError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"worker.epoch: Invalid value: {sent.epoch}: may only increase (is {worker.epoch})",
            )
        return self.pool.update(name, dict(sent.labels), sent.epoch)

    async def delete(self, request: pb.DeleteWorkerRequest) -> WorkerRecord:
        name = validated_ref(request, "worker", atespaced=False)
        worker = self.pool.get(name)
        check_preconditions("Worker", name, worker.meta.uid, worker.meta.version, request.options)
        for key in list(self.pool.holders(worker).values()):
            record = self.plane.state.actors.get(key)
            if record is not None:
                await self.plane.crashes.crash_lost(record, WORKER_GONE)
        return self.pool.remove(worker)

    def create(self, request: pb.CreateWorkerRequest) -> WorkerRecord:
        errors = FieldErrors()
        if not request.HasField("worker"):
            errors.required("worker")
            errors.raise_if_any()
        sent = request.worker
        check_short_name(errors, "worker.worker_namespace", sent.worker_namespace)
        if not sent.worker_pod:
            errors.required("worker.worker_pod")
        errors.raise_if_any()
        removed = self.pool.removed_pod(sent.worker_pod)
        if removed is None:
            raise AteapiError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"worker pod {sent.worker_pod!r} is not one of the local backend's; its workers "
                "are its --workers pods (restart with more: gym-substrate local up --workers N), "
                "and only one removed with DeleteWorker can be registered again",
            )
        meta = dataclasses.replace(removed.meta, name=str(uuid.uuid4()), uid=str(uuid.uuid4()))
        return self.pool.restore(
            dataclasses.replace(removed, meta=meta, state=WORKER_ACTIVE, labels=dict(sent.labels))
        )
