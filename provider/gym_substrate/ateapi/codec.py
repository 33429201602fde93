"""One internal model, converted at the edge: current ateapi messages in, the era's bytes out.

The provider, the stacks and the local backend work on one model, the current proto's messages
(`ateapi_pb2`), as Kubernetes works on its internal version and converts at the API. An
`EraCodec` turns a current message into the bytes an era's server expects and an era's bytes
into a current message. Its era classes are built from a file descriptor in a pool of their
own: the server's own (read by reflection), or ours for the era (`eras.era_file`), so field
numbers and types are right by construction. A message that is the same in both eras is copied
by its bytes; one that differs is walked field by field (by number), and the few whose meaning
moved are converted by the functions at the end of this module, each citing what it maps.

What cannot cross is said where it is lost: a v0.3/v0.4 snapshot has no generation (a
`Snapshot` read from one gets a synthetic generation, newest last) and no fidelity, only a
content scope: DATA reads as VOLUMES, FULL as UNSPECIFIED (the provider says UNKNOWN: memory
on gVisor and microVMs, files only on a runtime that keeps no memory, and the server does not
say which). A template's FULL is a preference for the most, MEMORY.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.ateapi.eras import CURRENT, V03, era_file, parse_era

__all__ = ["EraCodec", "EraStub"]

M = TypeVar("M", bound=Message)
Converter = Callable[["EraCodec", Any, Any], None]

_FULL, _DATA = 1, 2  # SnapshotContentScope
_COLD_BOOT = 1  # ResumeSource


def _repeated(field: FieldDescriptor) -> bool:
    """`is_repeated` (protobuf 6.31+; `label` is deprecated and goes in a later major)."""
    flag = getattr(field, "is_repeated", None)
    if flag is None:
        return bool(field.label == FieldDescriptor.LABEL_REPEATED)
    return bool(flag() if callable(flag) else flag)


def _is_map(field: FieldDescriptor) -> bool:
    return field.message_type is not None and field.message_type.GetOptions().map_entry


class EraCodec:
    """Convert between current messages and one era's wire (identity for ``current``)."""

    def __init__(
        self, era: str, files: Sequence[descriptor_pb2.FileDescriptorProto] | None = None
    ) -> None:
        self.era = parse_era(era)
        self._pool = descriptor_pool.DescriptorPool()
        timestamp = descriptor_pb2.FileDescriptorProto()
        timestamp_pb2.DESCRIPTOR.CopyToProto(timestamp)
        self._pool.Add(timestamp)
        for proto in files or [era_file(self.era)]:
            if proto.name != timestamp.name:
                self._pool.Add(proto)
        self._classes: dict[str, type[Message]] = {}
        self._differs = self._differing()

    @property
    def identity(self) -> bool:
        return self.era == CURRENT

    def era_class(self, full_name: str) -> type[Message]:
        """The era's message class named ``full_name`` (e.g. `ateapi.Tag`)."""
        found = self._classes.get(full_name)
        if found is None:
            descriptor = self._pool.FindMessageTypeByName(full_name)
            found = self._classes[full_name] = message_factory.GetMessageClass(descriptor)
        return found

    @property
    def pool(self) -> descriptor_pool.DescriptorPool:
        """The era's descriptors (what the local backend's reflection serves for it)."""
        return self._pool

    def stub(self, channel: Any) -> EraStub:
        """`ateapi.Control` over ``channel`` (blocking or aio) that speaks this era."""
        return EraStub(channel, self)

    def file(self) -> descriptor_pb2.FileDescriptorProto:
        """The era's ateapi file descriptor (what reflection serves for it)."""
        proto = descriptor_pb2.FileDescriptorProto()
        self._pool.FindFileContainingSymbol("ateapi.Control").CopyToProto(proto)
        return proto

    # -------------------------------------------------------------------------- the edge
    def encode(self, message: Message) -> bytes:
        """A current message as the era's bytes."""
        if self.identity:
            return message.SerializeToString()
        return self.to_era(message).SerializeToString()

    def decode(self, cls: type[M], data: bytes) -> M:
        """The era's bytes of a ``cls`` message, as a current ``cls``."""
        if self.identity:
            return cls.FromString(data)
        era_message = self.era_class(cls.DESCRIPTOR.full_name).FromString(data)
        return self.from_era(era_message, cls)

    def to_era(self, message: Message) -> Message:
        out = self.era_class(message.DESCRIPTOR.full_name)()
        self._copy(message, out, _TO_ERA)
        return out

    def from_era(self, message: Message, cls: type[M]) -> M:
        out = cls()
        self._copy(message, out, _FROM_ERA)
        return out

    # -------------------------------------------------------------------------- copying
    def _differing(self) -> set[str]:
        """Current message names whose wire differs in this era, directly or inside."""
        if self.identity:
            return set()
        ours = {m.full_name: m for m in _all_messages(pb.DESCRIPTOR.message_types_by_name.values())}
        differs = set()
        for name, descriptor in ours.items():
            try:
                theirs = self._pool.FindMessageTypeByName(name)
            except KeyError:
                differs.add(name)
                continue
            if _shape(descriptor) != _shape(theirs):
                differs.add(name)
        changed = True
        while changed:
            changed = False
            for name, descriptor in ours.items():
                inner = {f.message_type.full_name for f in descriptor.fields if f.message_type}
                if name not in differs and inner & differs:
                    differs.add(name)
                    changed = True
        return differs

    def _copy(self, src: Message, dst: Message, direction: dict[str, Converter]) -> None:
        special = direction.get(src.DESCRIPTOR.full_name)
        if special is not None:
            special(self, src, dst)
        elif src.DESCRIPTOR.full_name not in self._differs:
            dst.MergeFromString(src.SerializeToString())
        else:
            self._copy_fields(src, dst, direction)

    def _copy_fields(
        self,
        src: Message,
        dst: Message,
        direction: dict[str, Converter],
        skip: Iterable[int] = (),
    ) -> None:
        """Field by field, by number: what the other side lacks is dropped."""
        skipped = set(skip)
        for field, value in src.ListFields():
            target = dst.DESCRIPTOR.fields_by_number.get(field.number)
            if target is None or field.number in skipped:
                continue
            into = getattr(dst, target.name)
            if _is_map(field):
                for key, item in value.items():
                    if target.message_type.fields_by_name["value"].message_type is not None:
                        self._copy(item, into[key], direction)
                    else:
                        into[key] = item
            elif field.message_type is not None and target.message_type is not None:
                items = value if _repeated(field) else [value]
                for item in items:
                    self._copy(item, into.add() if _repeated(target) else into, direction)
            elif field.message_type is None and target.message_type is None:
                _copy_scalar(dst, field, target, value)


def _copy_scalar(dst: Message, field: FieldDescriptor, target: FieldDescriptor, value: Any) -> None:
    """A scalar or enum; one string and a list of strings share a wire type (RB calls
    `worker_pod_ip` -> `worker_pod_ips` wire-compatible): the list keeps its last item."""
    if _repeated(field) and _repeated(target):
        getattr(dst, target.name).extend(value)
    elif _repeated(field):
        if len(value):
            setattr(dst, target.name, value[-1])
    elif _repeated(target):
        getattr(dst, target.name).append(value)
    else:
        setattr(dst, target.name, value)


def _all_messages(top: Iterable[Descriptor]) -> list[Descriptor]:
    found: list[Descriptor] = []
    for descriptor in top:
        found.append(descriptor)
        found.extend(_all_messages(descriptor.nested_types))
    return found


def _shape(descriptor: Descriptor) -> set[tuple[int, int, bool, str]]:
    return {
        (
            f.number,
            f.type,
            _repeated(f),
            (f.message_type or f.enum_type).full_name if (f.message_type or f.enum_type) else "",
        )
        for f in descriptor.fields
    }


# ------------------------------------------------------------------------------ conversions
def _scope(fidelity: int) -> int:
    """SnapshotFidelity -> SnapshotContentScope: VOLUMES is data only, the rest FULL."""
    return _DATA if fidelity == pb.SNAPSHOT_FIDELITY_VOLUMES else _FULL


def _fidelity(scope: int) -> int:
    """A template's preference: FULL asks for the most the runtime keeps (MEMORY)."""
    return pb.SNAPSHOT_FIDELITY_VOLUMES if scope == _DATA else pb.SNAPSHOT_FIDELITY_MEMORY


def _held(scope: int) -> int:
    """What a v0.3/v0.4 snapshot holds, as far as the server says: DATA is the volumes only;
    FULL is the whole sandbox as its runtime checkpoints it (memory on gVisor and microVMs,
    files only elsewhere), which the server does not tell apart: UNSPECIFIED, read as UNKNOWN."""
    return pb.SNAPSHOT_FIDELITY_VOLUMES if scope == _DATA else pb.SNAPSHOT_FIDELITY_UNSPECIFIED


def _config_to_era(codec: EraCodec, src: pb.SnapshotConfig, dst: Any) -> None:
    """v0.3 `{on_pause, on_commit, on_resume, storage_location=4}`, v0.4 `{on_commit,
    storage_location=4}`, from current `{storage_location=1, preferred_fidelity=2}`; on_pause
    equals on_commit (v0.3's subset rule) and on_resume is a cold boot, v0.3's defaults."""
    dst.storage_location = src.storage_location
    dst.on_commit = _scope(src.preferred_fidelity)
    if codec.era == V03:
        dst.on_pause = dst.on_commit
        dst.on_resume.from_data = _COLD_BOOT


def _config_from_era(codec: EraCodec, src: Any, dst: pb.SnapshotConfig) -> None:
    dst.storage_location = src.storage_location
    dst.preferred_fidelity = _fidelity(src.on_commit)  # type: ignore[assignment]


def _durable(snapshot: pb.Snapshot) -> pb.SnapshotStorage | None:
    found = [s for s in snapshot.storage if s.durability == pb.SNAPSHOT_DURABILITY_DURABLE]
    return found[0] if found else None


def _tag_status_to_era(codec: EraCodec, src: pb.TagStatus, dst: Any) -> None:
    """`ExternalSnapshot` set once the copy is COMPLETED: a v0.3 tag is ready when it is set
    (workflow_tag.go@009b19c5 sets it last)."""
    dst.actor_template_uid = src.actor_template_uid
    stored = _durable(src.snapshot)
    if stored is not None and stored.status == pb.SNAPSHOT_STORAGE_STATUS_COMPLETED:
        dst.snapshot.snapshot_uri = stored.object.snapshot_uri
        dst.snapshot.content_scope = _scope(stored.fidelity)


def _tag_status_from_era(codec: EraCodec, src: Any, dst: pb.TagStatus) -> None:
    dst.actor_template_uid = src.actor_template_uid
    snapshot = dst.snapshot
    snapshot.generation = 1
    snapshot.owner = pb.SNAPSHOT_OWNER_TAG
    snapshot.actor_template_uid = src.actor_template_uid
    stored = snapshot.storage.add(durability=pb.SNAPSHOT_DURABILITY_DURABLE)
    if src.snapshot.snapshot_uri:
        stored.status = pb.SNAPSHOT_STORAGE_STATUS_COMPLETED
        stored.fidelity = _held(src.snapshot.content_scope)  # type: ignore[assignment]
        stored.object.snapshot_uri = src.snapshot.snapshot_uri
    else:  # still being created, or its create died: not usable
        stored.status = pb.SNAPSHOT_STORAGE_STATUS_IN_PROGRESS


_SNAPSHOTS, _LAST_GENERATION = 11, 12


def _newest(status: pb.ActorStatus, durability: int, state: int) -> tuple[Any, Any] | None:
    found = [
        (snapshot, stored)
        for snapshot in status.snapshots
        for stored in snapshot.storage
        if stored.durability == durability and stored.status == state
    ]
    return max(found, key=lambda pair: pair[0].generation) if found else None


def _actor_status_to_era(codec: EraCodec, src: pb.ActorStatus, dst: Any) -> None:
    """Fields 11/12 become v0.3's 3/4/5/8: the newest completed durable generation is the
    external snapshot, the newest completed local one the local snapshot, and the newest
    unfinished of each its in-progress name."""
    codec._copy_fields(src, dst, _TO_ERA, skip=(_SNAPSHOTS, _LAST_GENERATION))
    durable, local = pb.SNAPSHOT_DURABILITY_DURABLE, pb.SNAPSHOT_DURABILITY_LOCAL
    done, running = pb.SNAPSHOT_STORAGE_STATUS_COMPLETED, pb.SNAPSHOT_STORAGE_STATUS_IN_PROGRESS
    if pair := _newest(src, durable, done):
        dst.external_snapshot.snapshot_uri = pair[1].object.snapshot_uri
        dst.external_snapshot.content_scope = _scope(pair[1].fidelity)
        dst.external_snapshot.actor_template_uid = pair[0].actor_template_uid
    if pair := _newest(src, local, done):
        dst.local_snapshot.snapshot_name = pair[1].local.snapshot_name
        dst.local_snapshot.content_scope = _scope(pair[1].fidelity)
    if pair := _newest(src, durable, running):
        dst.in_progress_snapshot_uri = pair[1].object.snapshot_uri
    if pair := _newest(src, local, running):
        dst.in_progress_local_snapshot_name = pair[1].local.snapshot_name


def _actor_status_from_era(codec: EraCodec, src: Any, dst: pb.ActorStatus) -> None:
    """v0.3's 3/4/5/8 as generations, oldest first: the external snapshot (owned by a tag when
    its URI is under `/tags/`, as a borrowed golden or source tag's is: resources
    NewTagSnapshotURI), the one being written, the local one, the local one being written."""
    codec._copy_fields(src, dst, _FROM_ERA, skip=(3, 4, 5, 8))
    external = src.external_snapshot
    durable, local = pb.SNAPSHOT_DURABILITY_DURABLE, pb.SNAPSHOT_DURABILITY_LOCAL
    done, running = pb.SNAPSHOT_STORAGE_STATUS_COMPLETED, pb.SNAPSHOT_STORAGE_STATUS_IN_PROGRESS
    entries = [
        (external.snapshot_uri, durable, done),
        (src.in_progress_snapshot_uri, durable, running),
        (src.local_snapshot.snapshot_name, local, done),
        (src.in_progress_local_snapshot_name, local, running),
    ]
    for where, durability, status in entries:
        if not where:
            continue
        snapshot = dst.snapshots.add(generation=len(dst.snapshots) + 1)
        tagged = durability == durable and "/tags/" in where
        snapshot.owner = pb.SNAPSHOT_OWNER_TAG if tagged else pb.SNAPSHOT_OWNER_ACTOR
        snapshot.actor_template_uid = external.actor_template_uid
        stored = snapshot.storage.add(durability=durability, status=status)  # type: ignore[arg-type]
        stored.fidelity = _held(external.content_scope)  # type: ignore[assignment]
        if durability == durable:
            stored.object.snapshot_uri = where
        else:
            stored.local.snapshot_name = where
    dst.last_assigned_generation = len(dst.snapshots)


_TO_ERA: dict[str, Converter] = {
    "ateapi.SnapshotConfig": _config_to_era,
    "ateapi.TagStatus": _tag_status_to_era,
    "ateapi.ActorStatus": _actor_status_to_era,
}
_FROM_ERA: dict[str, Converter] = {
    "ateapi.SnapshotConfig": _config_from_era,
    "ateapi.TagStatus": _tag_status_from_era,
    "ateapi.ActorStatus": _actor_status_from_era,
}


class EraStub:
    """Like the generated `ControlStub`, with each call's messages converted by a codec: the
    caller sends and reads current messages whatever the server's era."""

    def __init__(self, channel: Any, codec: EraCodec) -> None:
        self._channel = channel
        self._codec = codec
        self._service = pb.DESCRIPTOR.services_by_name["Control"]
        self._calls: dict[str, Any] = {}

    def __getattr__(self, method: str) -> Any:
        if method.startswith("_"):
            raise AttributeError(method)
        call = self._calls.get(method)
        if call is None:
            try:
                output = getattr(pb, self._service.methods_by_name[method].output_type.name)
            except KeyError:
                raise AttributeError(f"ateapi.Control has no method {method}") from None
            codec = self._codec
            call = self._calls[method] = self._channel.unary_unary(
                f"/{self._service.full_name}/{method}",
                request_serializer=codec.encode,
                response_deserializer=lambda data, output=output: codec.decode(output, data),
            )
        return call
