"""The ateapi messages for the control plane's records (what every response carries).

Only here do records become wire messages. Snapshot folders show as upstream shows object
storage and node-local checkpoints: a DURABLE one as `object.snapshot_uri`
(`file://localhost/<folder>`), a LOCAL one as `local.snapshot_name` (the folder's name); the
node is this machine's host name.
"""

from __future__ import annotations

from pathlib import Path

from google.protobuf.timestamp_pb2 import Timestamp

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.core.states import state_value
from gym_substrate.local.control.records import (
    HOLDING_STATES,
    PAUSED,
    ActorRecord,
    AtespaceRecord,
    Meta,
    SnapshotRecord,
    TagRecord,
    TemplateRecord,
    WorkerRecord,
)
from gym_substrate.local.control.workers import WORKER_NAMESPACE, WORKER_POOL, WorkerPool

__all__ = ["Views", "file_uri", "object_ref", "timestamp"]


def timestamp(seconds: float) -> Timestamp:
    stamp = Timestamp()
    stamp.FromNanoseconds(int(seconds * 1e9))
    return stamp


def file_uri(path: str) -> str:
    """A snapshot folder as a storage URI whose 'bucket' is this machine."""
    return "file://localhost" + Path(path).as_posix()


def object_ref(key: str) -> pb.ObjectRef:
    atespace, _, name = key.partition("/")
    return pb.ObjectRef(atespace=atespace, name=name)


def metadata(meta: Meta) -> pb.ResourceMetadata:
    return pb.ResourceMetadata(
        atespace=meta.atespace,
        name=meta.name,
        uid=meta.uid,
        version=meta.version,
        create_time=timestamp(meta.create_time),
        update_time=timestamp(meta.update_time),
    )


def snapshot(record: SnapshotRecord) -> pb.Snapshot:
    out = pb.Snapshot(
        generation=record.generation,
        owner=pb.SnapshotOwner.Value(f"SNAPSHOT_OWNER_{record.owner}"),  # type: ignore[arg-type]
        actor_template_uid=record.template_uid,
    )
    for stored in record.storage:
        entry = out.storage.add(
            durability=pb.SnapshotDurability.Value(f"SNAPSHOT_DURABILITY_{stored.durability}"),
            status=pb.SnapshotStorageStatus.Value(f"SNAPSHOT_STORAGE_STATUS_{stored.status}"),
            fidelity=pb.SnapshotFidelity.Value(f"SNAPSHOT_FIDELITY_{stored.fidelity}"),
        )
        if stored.durability == "LOCAL":
            entry.local.snapshot_name = Path(stored.path).name
        else:
            entry.object.snapshot_uri = file_uri(stored.path)
    return out


class Views:
    def __init__(self, workers: WorkerPool) -> None:
        self.workers = workers

    def actor(self, record: ActorRecord) -> pb.Actor:
        status = pb.ActorStatus(
            state=state_value(record.state),  # type: ignore[arg-type]
            snapshots=[snapshot(s) for s in record.snapshots],
            last_assigned_generation=record.last_generation,
        )
        worker = self.workers.by_name(record.worker) if record.worker else None
        if worker is not None and record.state in HOLDING_STATES:
            status.worker_assignment.CopyFrom(self.assignment(worker, record.worker_epoch))
        if worker is not None or record.state == PAUSED:
            status.assigned_node = self.workers.node_name
        if record.crash_message:
            status.crash.message = record.crash_message
            status.crash.crash_time.CopyFrom(timestamp(record.crash_time))
        actor = pb.Actor(
            metadata=metadata(record.meta),
            actor_template=object_ref(record.template),
            status=status,
        )
        if record.worker_selector:
            actor.worker_selector.match_labels.update(record.worker_selector)
        if record.source_tag:
            actor.source_tag.CopyFrom(object_ref(record.source_tag))
        return actor

    def assignment(self, worker: WorkerRecord, epoch: int) -> pb.WorkerAssignment:
        return pb.WorkerAssignment(
            worker=pb.ObjectRef(name=worker.meta.name),
            worker_namespace=WORKER_NAMESPACE,
            worker_pool=WORKER_POOL,
            worker_pod=self.workers.pod_name(worker),
            worker_pod_uid=worker.pod_uid,
            worker_pod_ips=[self.workers.ip(worker)],
            node_name=self.workers.node_name,
            worker_epoch=epoch,
        )

    def worker(self, worker: WorkerRecord) -> pb.Worker:
        out = pb.Worker(
            metadata=metadata(worker.meta),
            worker_namespace=WORKER_NAMESPACE,
            worker_pool=WORKER_POOL,
            worker_pod=self.workers.pod_name(worker),
            worker_pod_uid=worker.pod_uid,
            node_name=self.workers.node_name,
            ips=[self.workers.ip(worker)],
            sandbox_class="gvisor",
            labels=worker.labels,
            epoch=worker.epoch,
        )
        out.status.state = pb.WorkerState.Value(f"WORKER_STATE_{worker.state}")  # type: ignore[assignment]
        out.status.capacity.actors = worker.capacity
        out.status.allocated.actors = self.workers.allocated(worker)
        out.status.observed_epoch = worker.observed_epoch
        out.status.hardware.attributes["architecture"] = "amd64"
        return out

    @staticmethod
    def atespace(record: AtespaceRecord) -> pb.Atespace:
        return pb.Atespace(metadata=metadata(record.meta))

    @staticmethod
    def template(record: TemplateRecord) -> pb.ActorTemplate:
        out = pb.ActorTemplate.FromString(record.message)
        out.metadata.CopyFrom(metadata(record.meta))
        out.status.SetInParent()
        golden = out.status.golden_snapshot_status
        if record.golden_tag:
            golden.golden_tag.CopyFrom(object_ref(record.golden_tag))
        if record.snapshot_time:
            golden.snapshot_time.CopyFrom(timestamp(record.snapshot_time))
        if record.golden_error:
            golden.error_message = record.golden_error
        return out

    @staticmethod
    def tag(record: TagRecord) -> pb.Tag:
        out = pb.Tag(
            metadata=metadata(record.meta),
            scope=pb.TagScope.Value(f"TAG_SCOPE_{record.scope}"),  # type: ignore[arg-type]
            source_actor=object_ref(record.source_actor),
        )
        out.status.actor_template_uid = record.template_uid
        if record.snapshot is not None:
            out.status.snapshot.CopyFrom(snapshot(record.snapshot))
        return out
