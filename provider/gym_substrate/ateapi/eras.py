"""The ateapi release eras: where their wire differs from the proto we compile, as data.

Users install Substrate releases (`ate-setup` with `images.tag`), and the releases differ from
main exactly where tags, snapshots and template snapshot settings live. Our stubs follow main at
2179589f ("current"). Every other era is written here once, as the message tables that differ
(names, numbers, types, read from upstream's protos; docs/compatibility.md cites each row):

* ``v0.3`` (v0.2.0, v0.3.0): `SnapshotConfig {on_pause=1, on_commit=2, on_resume=3,
  storage_location=4}`, `TagStatus.snapshot` an `ExternalSnapshot`, `ActorStatus` snapshots in
  fields 3/4/5/8, `WorkerAssignment.worker_pod_ip` a single string.
* ``v0.4`` (v0.4.0, v0.4.1 as far as the evidence goes): `SnapshotConfig {on_commit=2,
  storage_location=4}`, `worker_pod_ips` repeated and `worker_epoch`; tags and actor status as
  v0.3.
* ``current`` (main at 2179589f; 0e4768ab has the same layout where we read or write).

``era_file(era)`` is the current `FileDescriptorProto` with the era's tables applied: a
descriptor of the era's whole wire, from which `codec.py` builds message classes (in a pool
of their own) and the local backend serves reflection. ``detect_era`` compares a server's own
descriptors (from gRPC reflection) with these tables, field by field, and names the era or says
precisely which fields match none. Why tables and not one `.proto` per era: the eras share all
but seven messages, and a table that states only the difference is the one place to read it.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from google.protobuf import descriptor_pb2

from gym_substrate.ateapi import ateapi_pb2 as pb

__all__ = [
    "CURRENT",
    "ERAS",
    "ERA_RELEASES",
    "EraError",
    "V03",
    "V04",
    "detect_era",
    "era_file",
    "parse_era",
    "signature",
]

V03, V04, CURRENT = "v0.3", "v0.4", "current"
ERAS = (V03, V04, CURRENT)
# what users install, per era (docs/compatibility.md has the evidence for each)
ERA_RELEASES: Mapping[str, str] = {
    V03: "Substrate v0.2.0 and v0.3.0",
    V04: "Substrate v0.4.0 and v0.4.1",
    CURRENT: "Substrate main at 2179589f (and 0e4768ab)",
}

_FDP = descriptor_pb2.FieldDescriptorProto
_SCALARS = {
    "string": _FDP.TYPE_STRING,
    "int32": _FDP.TYPE_INT32,
    "int64": _FDP.TYPE_INT64,
    "bool": _FDP.TYPE_BOOL,
}


class EraError(ValueError):
    """An era that is not one of ours, or a server whose descriptors match none of them."""


@dataclass(frozen=True)
class Field:
    """One field: ``kind`` is a scalar name, or ``enum:X`` / ``msg:X`` (X in package ateapi)."""

    name: str
    number: int
    kind: str
    repeated: bool = False


def _f(name: str, number: int, kind: str, repeated: bool = False) -> Field:
    return Field(name, number, kind, repeated)


_SCOPE_VALUES = ("UNSPECIFIED", "FULL", "DATA")
_ACTOR_STATUS_V03 = (
    _f("state", 1, "enum:ActorState"),
    _f("worker_assignment", 2, "msg:WorkerAssignment"),
    _f("in_progress_snapshot_uri", 3, "string"),
    _f("external_snapshot", 4, "msg:ExternalSnapshot"),
    _f("local_snapshot", 5, "msg:LocalSnapshot"),
    _f("actor_volumes", 7, "msg:ExternalVolume", repeated=True),
    _f("in_progress_local_snapshot_name", 8, "string"),
    _f("crash", 9, "msg:ActorCrash"),
)
_RELEASE_COMMON: dict[str, tuple[Field, ...]] = {
    "ExternalSnapshot": (
        _f("snapshot_uri", 1, "string"),
        _f("content_scope", 2, "enum:SnapshotContentScope"),
        _f("actor_template_uid", 3, "string"),
    ),
    "TagStatus": (
        _f("snapshot", 1, "msg:ExternalSnapshot"),
        _f("actor_template_uid", 2, "string"),
        _f("storage_location", 3, "string"),
    ),
    "ActorStatus": _ACTOR_STATUS_V03,
    "LocalSnapshot": (
        _f("snapshot_name", 1, "string"),
        _f("node_vms_with_local_snapshots", 2, "string", repeated=True),
        _f("content_scope", 3, "enum:SnapshotContentScope"),
    ),
}
_WORKER_ASSIGNMENT_HEAD = (
    _f("worker_namespace", 1, "string"),
    _f("worker_pool", 2, "string"),
    _f("worker_pod", 3, "string"),
    _f("worker_pod_uid", 4, "string"),
)
_WORKER_ASSIGNMENT_TAIL = (_f("worker", 6, "msg:ObjectRef"), _f("node_name", 7, "string"))

# Per era: messages whose fields differ from current (whole field lists), enums it adds, and the
# current messages and enums it does not have.
MESSAGES: Mapping[str, Mapping[str, tuple[Field, ...]]] = {
    V03: {
        **_RELEASE_COMMON,
        "SnapshotConfig": (
            _f("on_pause", 1, "enum:SnapshotContentScope"),
            _f("on_commit", 2, "enum:SnapshotContentScope"),
            _f("on_resume", 3, "msg:OnResumeConfig"),
            _f("storage_location", 4, "string"),
        ),
        "OnResumeConfig": (_f("from_data", 1, "enum:ResumeSource"),),
        "WorkerAssignment": (
            *_WORKER_ASSIGNMENT_HEAD,
            _f("worker_pod_ip", 5, "string"),
            *_WORKER_ASSIGNMENT_TAIL,
        ),
    },
    V04: {
        **_RELEASE_COMMON,
        "SnapshotConfig": (
            _f("on_commit", 2, "enum:SnapshotContentScope"),
            _f("storage_location", 4, "string"),
        ),
        "WorkerAssignment": (
            *_WORKER_ASSIGNMENT_HEAD,
            _f("worker_pod_ips", 5, "string", repeated=True),
            *_WORKER_ASSIGNMENT_TAIL,
            _f("worker_epoch", 8, "int64"),
        ),
    },
    CURRENT: {},
}
ENUMS: Mapping[str, Mapping[str, tuple[str, ...]]] = {
    V03: {
        "SnapshotContentScope": _SCOPE_VALUES,
        "ResumeSource": ("UNSPECIFIED", "COLD_BOOT", "GOLDEN"),
    },
    V04: {"SnapshotContentScope": _SCOPE_VALUES},
    CURRENT: {},
}
_CURRENT_ONLY_MESSAGES = ("Snapshot", "SnapshotStorage", "ObjectSnapshot")
_CURRENT_ONLY_ENUMS = (
    "SnapshotOwner",
    "SnapshotDurability",
    "SnapshotStorageStatus",
    "SnapshotFidelity",
)
# Enum value prefixes, as upstream spells them (SNAPSHOT_CONTENT_SCOPE_FULL, RESUME_SOURCE_...).
_ENUM_PREFIX = {"SnapshotContentScope": "SNAPSHOT_CONTENT_SCOPE_", "ResumeSource": "RESUME_SOURCE_"}


def parse_era(text: str) -> str:
    """``v0.3`` / ``v0.4`` / ``current`` (also ``0.3``, ``v0.3.0``, ``v0.2.0``, ``main``)."""
    cleaned = text.strip().lower().removeprefix("v")
    aliases = {"0.2": V03, "0.2.0": V03, "0.3": V03, "0.3.0": V03, "0.4": V04, "0.4.0": V04}
    aliases.update({"0.4.1": V04, "current": CURRENT, "main": CURRENT})
    if cleaned in aliases:
        return aliases[cleaned]
    raise EraError(
        f"unknown ateapi era {text!r}: use one of {', '.join(ERAS)} "
        f"({'; '.join(f'{e}: {r}' for e, r in ERA_RELEASES.items())})"
    )


def _field(spec: Field) -> descriptor_pb2.FieldDescriptorProto:
    field = _FDP(name=spec.name, number=spec.number, json_name=_camel(spec.name))
    field.label = _FDP.LABEL_REPEATED if spec.repeated else _FDP.LABEL_OPTIONAL
    if spec.kind in _SCALARS:
        field.type = _SCALARS[spec.kind]
    else:
        kind, _, name = spec.kind.partition(":")
        field.type = _FDP.TYPE_ENUM if kind == "enum" else _FDP.TYPE_MESSAGE
        field.type_name = f".ateapi.{name}"
    return field


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def _current_file() -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto()
    pb.DESCRIPTOR.CopyToProto(proto)
    return proto


def era_file(era: str) -> descriptor_pb2.FileDescriptorProto:
    """The era's whole ateapi wire as one file descriptor (package `ateapi`, same file name)."""
    era = parse_era(era)
    proto = _current_file()
    if era == CURRENT:
        return proto
    tables = MESSAGES[era]
    kept = [m for m in proto.message_type if m.name not in _CURRENT_ONLY_MESSAGES]
    del proto.message_type[:]
    proto.message_type.extend(kept)
    enums = [e for e in proto.enum_type if e.name not in _CURRENT_ONLY_ENUMS]
    del proto.enum_type[:]
    proto.enum_type.extend(enums)
    present = {m.name: m for m in proto.message_type}
    for name, fields in tables.items():
        message = present.get(name) or proto.message_type.add(name=name)
        del message.field[:]
        message.field.extend(_field(spec) for spec in fields)
    for name, values in ENUMS[era].items():
        enum = proto.enum_type.add(name=name)
        for number, value in enumerate(values):
            enum.value.add(name=_ENUM_PREFIX[name] + value, number=number)
    return proto


# ---------------------------------------------------------------------------------- detection
Signature = dict[str, dict[int, tuple[str, str, bool]]]


def signature(files: Iterable[descriptor_pb2.FileDescriptorProto]) -> Signature:
    """For each message any era changes: number -> (name, type, repeated) of its fields."""
    watched = {name for era in ERAS for name in MESSAGES[era]} | {"TagStatus", "ActorStatus"}
    found: Signature = {}
    for proto in files:
        if proto.package != "ateapi":
            continue
        for message in proto.message_type:
            if message.name in watched:
                found[message.name] = {
                    f.number: (f.name, f.type_name or _FDP.Type.Name(f.type), _repeated(f))
                    for f in message.field
                }
    return found


def _repeated(field: descriptor_pb2.FieldDescriptorProto) -> bool:
    return bool(field.label == _FDP.LABEL_REPEATED)


_TELLING = ("SnapshotConfig", "TagStatus", "ActorStatus", "WorkerAssignment")


@functools.cache
def _era_signature(era: str) -> Signature:
    return signature([era_file(era)])


def _mismatches(era: str, seen: Signature) -> list[str]:
    """How the server's telling messages differ from ``era``'s (empty: it is that era)."""
    ours = _era_signature(era)
    problems = []
    for name in _TELLING:
        theirs = seen.get(name)
        if theirs is None:
            problems.append(f"it has no message {name}")
            continue
        for number, (field, kind, repeated) in sorted(ours[name].items()):
            got = theirs.get(number)
            if got is None:
                problems.append(f"{name} has no field {number} ({field})")
            elif got[1:] != (kind, repeated):
                label = "repeated " if got[2] else ""
                problems.append(f"{name}.{got[0]} = {number} is {label}{got[1]}")
        for number in sorted(set(theirs) - set(ours[name])):
            # a field ours lacks is fine (a newer server adds some) unless another era has it
            if any(_era_signature(e)[name].get(number) == theirs[number] for e in ERAS):
                problems.append(f"{name} has field {number} ({theirs[number][0]})")
    return problems


def detect_era(files: Iterable[descriptor_pb2.FileDescriptorProto]) -> str:
    """The era whose telling fields the server's descriptors have; EraError when none fits."""
    seen = signature(files)
    if not seen:
        raise EraError("its reflection describes no message of package ateapi")
    verdicts = {era: _mismatches(era, seen) for era in ERAS}
    matching = [era for era, problems in verdicts.items() if not problems]
    if len(matching) == 1:
        return matching[0]
    described = "; ".join(
        f"not {era} ({', '.join(problems[:3])})" for era, problems in verdicts.items()
    )
    raise EraError(f"its ateapi matches no era gym-substrate speaks: {described}")
