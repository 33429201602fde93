"""Our ateapi.proto against upstream's wire tables, message by message.

Upstream: agent-substrate/substrate `pkg/proto/ateapipb/ateapi.proto` at commit
2179589ffdc1d10c8a676042ac8355682863553d, transcribed independently of ours into
`tests/conformance/upstream/ateapi_upstream.proto` and compiled at test time into a descriptor
pool of its own (upstream_ateapi.py). Ours is `gym_substrate.ateapi.ateapi_pb2.DESCRIPTOR`.

What a client relies on: every message and enum we declare exists upstream with the same field
names, numbers, types, labels, map-ness, referenced type names and enum values (else a field we
write lands somewhere else, or nowhere, on upstream's server); every RPC of our `Control` is
upstream's with the same request and response types, and every RPC of upstream's `Control` is
ours. Our proto deliberately leaves out upstream's `WorkerService`: atelet calls it, and no part
of gym-substrate plays atelet against a real cluster.

Each test gathers every difference before failing, and names the message and field of each.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from google.protobuf import descriptor_pb2
from upstream_ateapi import PACKAGE, upstream_file

from gym_substrate.ateapi import ateapi_pb2

FDP = descriptor_pb2.FileDescriptorProto
DP = descriptor_pb2.DescriptorProto
EDP = descriptor_pb2.EnumDescriptorProto
FD = descriptor_pb2.FieldDescriptorProto

# Left out of ours on purpose (module docstring).
OMITTED_SERVICES = {"WorkerService"}


@pytest.fixture(scope="module")
def ours() -> FDP:
    fdp = FDP()
    ateapi_pb2.DESCRIPTOR.CopyToProto(fdp)
    return fdp


@pytest.fixture(scope="module")
def theirs(upstream_set: descriptor_pb2.FileDescriptorSet) -> FDP:
    return upstream_file(upstream_set)


def _walk_messages(prefix: str, messages: Iterator[DP] | list[DP]) -> Iterator[tuple[str, DP]]:
    for message in messages:
        name = f"{prefix}.{message.name}"
        yield name, message
        yield from _walk_messages(name, list(message.nested_type))


def messages_of(fdp: FDP) -> dict[str, DP]:
    """Every message by full name (no leading dot), nested ones and map entries included."""
    return dict(_walk_messages(fdp.package, list(fdp.message_type)))


def enums_of(fdp: FDP) -> dict[str, EDP]:
    """Every enum by full name, the ones nested in messages included."""
    found = {f"{fdp.package}.{enum.name}": enum for enum in fdp.enum_type}
    for name, message in messages_of(fdp).items():
        found.update({f"{name}.{enum.name}": enum for enum in message.enum_type})
    return found


def _short(full: str) -> str:
    """``.ateapi.Actor`` or ``ateapi.Actor`` as ``Actor`` (what assertion messages show)."""
    return full.lstrip(".").removeprefix(f"{PACKAGE}.")


def _is_map(field: FD, messages: dict[str, DP]) -> bool:
    if field.label != FD.LABEL_REPEATED or field.type != FD.TYPE_MESSAGE:
        return False
    entry = messages.get(field.type_name.lstrip("."))
    return entry is not None and entry.options.map_entry


def field_shape(field: FD, message: DP, messages: dict[str, DP]) -> dict[str, object]:
    """What of a field the wire (and the generated API) depends on, by attribute name."""
    oneof = ""
    if field.HasField("oneof_index") and not field.proto3_optional:
        oneof = message.oneof_decl[field.oneof_index].name
    return {
        "number": field.number,
        "type": FD.Type.Name(field.type),
        "label": FD.Label.Name(field.label),
        "map": _is_map(field, messages),
        "type_name": _short(field.type_name),
        "proto3_optional": field.proto3_optional,
        "oneof": oneof,
    }


def _fields(message: DP) -> dict[str, FD]:
    return {field.name: field for field in message.field}


def _fail_if(problems: list[str], what: str) -> None:
    if problems:
        pytest.fail(f"{len(problems)} {what}:\n  " + "\n  ".join(problems), pytrace=False)


def test_package_and_services(ours: FDP, theirs: FDP) -> None:
    """Same package (it is in every method path and type URL); only WorkerService left out."""
    assert ours.package == theirs.package == PACKAGE
    our_services = {service.name for service in ours.service}
    their_services = {service.name for service in theirs.service}
    assert our_services - their_services == set(), "services of ours that upstream lacks"
    assert their_services - our_services == OMITTED_SERVICES, (
        "upstream's services missing from ours, besides the deliberately omitted WorkerService"
    )


def _methods(fdp: FDP, service: str) -> dict[str, descriptor_pb2.MethodDescriptorProto]:
    for candidate in fdp.service:
        if candidate.name == service:
            return {method.name: method for method in candidate.method}
    return {}


def rpc_problems(ours: FDP, theirs: FDP) -> list[str]:
    our_rpcs, their_rpcs = _methods(ours, "Control"), _methods(theirs, "Control")
    problems = [
        f"Control.{name}: upstream has it, ours does not"
        for name in their_rpcs
        if name not in our_rpcs
    ]
    for name, ours_method in our_rpcs.items():
        theirs_method = their_rpcs.get(name)
        if theirs_method is None:
            problems.append(f"Control.{name}: ours has it, upstream does not")
            continue
        for attribute in ("input_type", "output_type", "client_streaming", "server_streaming"):
            mine, upstream = getattr(ours_method, attribute), getattr(theirs_method, attribute)
            if isinstance(mine, str):
                mine, upstream = _short(mine), _short(upstream)
            if mine != upstream:
                problems.append(f"Control.{name} {attribute}: ours {mine}, upstream {upstream}")
    return problems


def test_control_rpcs_match_both_ways(ours: FDP, theirs: FDP) -> None:
    _fail_if(rpc_problems(ours, theirs), "differences between our Control and upstream's")


def message_problems(ours: FDP, theirs: FDP) -> list[str]:
    our_messages, their_messages = messages_of(ours), messages_of(theirs)
    problems: list[str] = []
    for full, mine in our_messages.items():
        name = _short(full)
        upstream = their_messages.get(full)
        if upstream is None:
            problems.append(f"{name}: ours declares it, upstream has no such message")
            continue
        our_fields, their_fields = _fields(mine), _fields(upstream)
        for field_name, field in their_fields.items():
            if field_name not in our_fields:
                shape = field_shape(field, upstream, their_messages)
                problems.append(
                    f"{name}.{field_name}: missing from ours (upstream: {shape['label']} "
                    f"{shape['type_name'] or shape['type']} = {shape['number']})"
                )
        for field_name, field in our_fields.items():
            their_field = their_fields.get(field_name)
            if their_field is None:
                problems.append(
                    f"{name}.{field_name}: ours has it (= {field.number}), upstream does not"
                )
                continue
            our_shape = field_shape(field, mine, our_messages)
            their_shape = field_shape(their_field, upstream, their_messages)
            for attribute, value in our_shape.items():
                if value != their_shape[attribute]:
                    problems.append(
                        f"{name}.{field_name} {attribute}: ours {value!r}, "
                        f"upstream {their_shape[attribute]!r}"
                    )
    return problems


def test_messages_match(ours: FDP, theirs: FDP) -> None:
    """Every message of ours is upstream's, field for field (both ways within a message)."""
    _fail_if(message_problems(ours, theirs), "differences between our messages and upstream's")


def enum_problems(ours: FDP, theirs: FDP) -> list[str]:
    their_enums = enums_of(theirs)
    problems: list[str] = []
    for full, mine in enums_of(ours).items():
        name = _short(full)
        upstream = their_enums.get(full)
        if upstream is None:
            problems.append(f"{name}: ours declares it, upstream has no such enum")
            continue
        our_values = {value.name: value.number for value in mine.value}
        their_values = {value.name: value.number for value in upstream.value}
        for value_name in sorted(our_values.keys() | their_values.keys()):
            mine_n, theirs_n = our_values.get(value_name), their_values.get(value_name)
            if mine_n != theirs_n:
                problems.append(f"{name}.{value_name}: ours {mine_n}, upstream {theirs_n}")
    return problems


def test_enums_match(ours: FDP, theirs: FDP) -> None:
    """Every enum of ours (nested ones too) is upstream's, with the same names and numbers."""
    _fail_if(enum_problems(ours, theirs), "differences between our enums and upstream's")


def _reachable(fdp: FDP, service: str) -> set[str]:
    """Full names of every message and enum an RPC of ``service`` can carry."""
    messages, enums = messages_of(fdp), enums_of(fdp)
    todo = [
        name.lstrip(".")
        for method in _methods(fdp, service).values()
        for name in (method.input_type, method.output_type)
    ]
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        message = messages.get(name)
        if message is not None:
            todo.extend(f.type_name.lstrip(".") for f in message.field if f.type_name)
    return {name for name in seen if name in messages or name in enums}


def test_everything_control_carries_is_ours(ours: FDP, theirs: FDP) -> None:
    """What upstream's Control can carry is all in ours; only WorkerService's messages may be
    missing."""
    declared = set(messages_of(ours)) | set(enums_of(ours))
    missing = sorted(_short(name) for name in _reachable(theirs, "Control") - declared)
    assert missing == [], f"upstream's Control carries these, ours lacks them: {missing}"


def reserved_problems(ours: FDP, theirs: FDP) -> list[str]:
    our_messages = messages_of(ours)
    problems: list[str] = []
    for full, upstream in messages_of(theirs).items():
        mine = our_messages.get(full)
        if mine is None:
            continue
        name = _short(full)
        our_numbers = {n for r in mine.reserved_range for n in range(r.start, r.end)}
        for reserved in upstream.reserved_range:
            for number in range(reserved.start, reserved.end):
                if number not in our_numbers:
                    problems.append(f"{name}: upstream reserves number {number}, ours does not")
        for reserved_name in upstream.reserved_name:
            if reserved_name not in mine.reserved_name:
                problems.append(f"{name}: upstream reserves name {reserved_name!r}, ours does not")
    return problems


def test_upstream_reserved_is_reserved_in_ours(ours: FDP, theirs: FDP) -> None:
    """A number or name upstream retired is never given a new meaning by ours."""
    _fail_if(reserved_problems(ours, theirs), "reservations of upstream missing from ours")


def redact_problems(ours: FDP, theirs: FDP) -> list[str]:
    our_messages = messages_of(ours)
    problems: list[str] = []
    for full, upstream in messages_of(theirs).items():
        mine = our_messages.get(full)
        if mine is None:
            continue
        our_fields = _fields(mine)
        for field in upstream.field:
            our_field = our_fields.get(field.name)
            if (
                our_field is not None
                and field.options.debug_redact
                and not our_field.options.debug_redact
            ):
                problems.append(f"{_short(full)}.{field.name}: upstream redacts it, ours does not")
    return problems


def test_redacted_fields_stay_redacted(ours: FDP, theirs: FDP) -> None:
    """Fields upstream marks debug_redact (a token, env values) are redacted in ours too, so
    they stay out of text dumps and logs."""
    _fail_if(redact_problems(ours, theirs), "fields upstream redacts that ours does not")


def _field(fdp: FDP, message: str, field: str) -> FD:
    return next(f for f in messages_of(fdp)[f"{PACKAGE}.{message}"].field if f.name == field)


def test_the_comparison_sees_each_kind_of_difference(ours: FDP) -> None:
    """The checks above would pass on a comparator that sees nothing: change a copy of ours in
    each way they guard against, and each change is reported, naming message and field."""
    changed = FDP()
    changed.CopyFrom(ours)
    _field(changed, "Actor", "status").number = 3
    _field(changed, "ObjectRef", "name").type = FD.TYPE_BYTES
    _field(changed, "ResumeActorResponse", "resumed").label = FD.LABEL_REPEATED
    _field(changed, "ListActorsRequest", "page_size").name = "size"
    _field(changed, "Actor", "source_tag").type_name = f".{PACKAGE}.ResourceMetadata"
    _field(changed, "Selector.MatchLabelsEntry", "value").type = FD.TYPE_INT32
    state = next(e for e in changed.enum_type if e.name == "ActorState")
    state.value[-1].number = 10
    del messages_of(changed)[f"{PACKAGE}.TrustBundleDataSource"].reserved_name[:]
    _field(changed, "EnvVar", "value").options.ClearField("debug_redact")
    control = next(s for s in changed.service if s.name == "Control")
    method = next(m for m in control.method if m.name == "DeleteActor")
    method.output_type = f".{PACKAGE}.ResumeActorResponse"
    atespace = f".{PACKAGE}.Atespace"
    control.method.add(name="DebugClear", input_type=atespace, output_type=atespace)

    problems = "\n".join(
        message_problems(changed, ours)
        + enum_problems(changed, ours)
        + rpc_problems(changed, ours)
        + reserved_problems(changed, ours)
        + redact_problems(changed, ours)
    )
    for expected in (
        "Actor.status number: ours 3, upstream 7",
        "ObjectRef.name type: ours 'TYPE_BYTES', upstream 'TYPE_STRING'",
        "ResumeActorResponse.resumed label: ours 'LABEL_REPEATED', upstream 'LABEL_OPTIONAL'",
        "ListActorsRequest.page_size: missing from ours",
        "ListActorsRequest.size: ours has it",
        "Actor.source_tag type_name: ours 'ResourceMetadata', upstream 'ObjectRef'",
        "Selector.MatchLabelsEntry.value type: ours 'TYPE_INT32', upstream 'TYPE_STRING'",
        "ActorState.ACTOR_STATE_REVERTING: ours 10, upstream 9",
        "TrustBundleDataSource: upstream reserves name 'name', ours does not",
        "EnvVar.value: upstream redacts it, ours does not",
        "Control.DeleteActor output_type: ours ResumeActorResponse, upstream Actor",
        "Control.DebugClear: ours has it, upstream does not",
    ):
        assert expected in problems, f"not reported: {expected}\nreported:\n{problems}"
