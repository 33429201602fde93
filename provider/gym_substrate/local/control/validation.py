"""Request validation as ateapi answers it: Kubernetes field errors, one aggregate message.

ateapi validates every request with declarative validation generated from the proto's `+k8s:`
tags and answers INVALID_ARGUMENT with the error list's aggregate (apivalidation,
`resources.ToAPIError`): `<path>: Required value`, `<path>: Invalid value: "<v>": <detail>`,
several as `[e1, e2]`. Paths are the proto's snake_case fields from the request's field name
(`actor.metadata.name`). Unknown request fields are refused the same way by the server's last
interceptor (`RejectUnknownFieldsUnaryInterceptor`): `request: Invalid value: unknown field with
protobuf tag 99`, one error per message holding unknown fields, naming the first
(internal/ateinterceptors/rejectunknown_test.go@2e3e300a). Where Kubernetes versions word a
detail differently, docs/compatibility.md ("Validation messages") says which wording this
follows.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

import grpc
from google.protobuf import unknown_fields
from google.protobuf.message import Message

from gym_substrate.local.errors import AteapiError, go_quote

__all__ = [
    "FieldErrors",
    "check_delete_options",
    "check_label_key",
    "check_label_value",
    "check_ref",
    "check_selector",
    "check_short_name",
    "reject_unknown_fields",
    "validated_ref",
]

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_LABEL_DETAIL = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and "
    "must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex "
    "used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
_LABEL_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL_KEY_DETAIL = (
    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end "
    "with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for "
    "validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
)
_LABEL_VALUE_DETAIL = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or "
    "'my_value',  or '12345', regex used for validation is "
    "'(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
)
# an error message repeats at most this much of a value it refuses (gRPC caps status messages)
_SHOWN = 64
# and lists errors up to this many bytes (gRPC C-core clients refuse metadata over 8 KiB)
_MAX_MESSAGE = 4096


def _value(value: Any) -> str:
    """A value as Kubernetes' field errors print it: Go-quoted strings, bare numbers."""
    if isinstance(value, str):
        return go_quote(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)[:_SHOWN]


class FieldErrors:
    """Collects field errors; `raise_if_any` answers them as one INVALID_ARGUMENT."""

    def __init__(self) -> None:
        self.items: list[str] = []

    def __bool__(self) -> bool:
        return bool(self.items)

    def required(self, path: str) -> None:
        self.items.append(f"{path}: Required value")

    def invalid(self, path: str, value: Any, detail: str) -> None:
        self.items.append(f"{path}: Invalid value: {_value(value)}: {detail}")

    def invalid_omitted(self, path: str, detail: str) -> None:
        """An Invalid error that does not repeat the value (Kubernetes' OmitValue)."""
        self.items.append(f"{path}: Invalid value: {detail}")

    def forbidden(self, path: str, detail: str) -> None:
        self.items.append(f"{path}: Forbidden: {detail}")

    def too_many(self, path: str, count: int, limit: int) -> None:
        self.items.append(f"{path}: Too many: {count}: must have at most {limit} items")

    def too_long(self, path: str, limit: int) -> None:
        self.items.append(f"{path}: Too long: may not be more than {limit} bytes")

    def duplicate(self, path: str, value: Any) -> None:
        self.items.append(f"{path}: Duplicate value: {_value(value)}")

    def not_supported(self, path: str, value: Any, allowed: Iterable[str]) -> None:
        choices = ", ".join(f'"{a}"' for a in allowed)
        self.items.append(
            f"{path}: Unsupported value: {_value(value)}: supported values: {choices}"
        )

    def message(self) -> str:
        """The aggregate, `e` or `[e1, e2]`; past `_MAX_MESSAGE` bytes the rest is counted,
        not listed, so the status still fits a client's metadata (a request of thousands of
        bad entries would otherwise reach it as RESOURCE_EXHAUSTED, not INVALID_ARGUMENT)."""
        if len(self.items) == 1:
            return self.items[0]
        shown: list[str] = []
        size = 2
        for item in self.items:
            size += len(item.encode()) + 2
            if shown and size > _MAX_MESSAGE:
                break
            shown.append(item)
        rest = len(self.items) - len(shown)
        if rest:
            shown.append(f"and {rest} more errors")
        return "[" + ", ".join(shown) + "]"

    def raise_if_any(self) -> None:
        if self.items:
            raise AteapiError(grpc.StatusCode.INVALID_ARGUMENT, self.message())


def check_short_name(errors: FieldErrors, path: str, value: str, *, required: bool = True) -> None:
    """`+k8s:format=k8s-short-name`: a DNS-1123 label (and `+k8s:required` when ``required``)."""
    if not value:
        if required:
            errors.required(path)
        return
    if len(value.encode()) > 63:
        errors.invalid(path, value, "must be no more than 63 characters")
    if not _DNS_LABEL.fullmatch(value):
        errors.invalid(path, value, _DNS_LABEL_DETAIL)


def check_label_key(errors: FieldErrors, path: str, key: str) -> None:
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.fullmatch(prefix)):
        errors.invalid(path, key, "prefix part must be a lowercase RFC 1123 subdomain")
    elif key.count("/") > 1:
        errors.invalid(path, key, "a qualified name must have at most one '/'")
    elif not name:
        errors.invalid(path, key, "name part must be non-empty")
    elif len(name) > 63:
        errors.invalid(path, key, "name part must be no more than 63 characters")
    elif not _LABEL_NAME.fullmatch(name):
        errors.invalid(path, key, _LABEL_KEY_DETAIL)


def check_label_value(errors: FieldErrors, path: str, value: str) -> None:
    if len(value) > 63:
        errors.invalid(path, value, "must be no more than 63 characters")
    elif value and not _LABEL_NAME.fullmatch(value):
        errors.invalid(path, value, _LABEL_VALUE_DETAIL)


def check_selector(errors: FieldErrors, path: str, labels: Mapping[str, str]) -> None:
    """A `Selector`: match_labels set (a union of one), 1..10 labels, valid keys and values."""
    if not labels:
        errors.invalid_omitted(path, "must specify one of: `match_labels`")
        return
    if len(labels) > 10:
        errors.too_many(f"{path}.match_labels", len(labels), 10)
    for key, value in labels.items():
        check_label_key(errors, f"{path}.match_labels", key)
        check_label_value(errors, f"{path}.match_labels[{key}]", value)


def _unknown(message: Message, path: str, errors: FieldErrors) -> None:
    # one error per message, naming its first unknown tag (findUnknownFields)
    found = unknown_fields.UnknownFieldSet(message)  # type: ignore[attr-defined]
    if len(found):
        errors.invalid_omitted(path, f"unknown field with protobuf tag {found[0].field_number}")
    for descriptor, value in message.ListFields():
        if descriptor.message_type is None:
            continue
        child = descriptor.name
        if descriptor.message_type.GetOptions().map_entry:
            if descriptor.message_type.fields_by_name["value"].message_type is not None:
                for key, item in value.items():
                    _unknown(item, f"{path}.{child}[{key}]" if path != "request" else child, errors)
            continue
        if descriptor.is_repeated:
            for index, item in enumerate(value):
                where = f"{child}[{index}]" if path == "request" else f"{path}.{child}[{index}]"
                _unknown(item, where, errors)
        else:
            _unknown(value, child if path == "request" else f"{path}.{child}", errors)


def reject_unknown_fields(request: Message) -> None:
    """INVALID_ARGUMENT for any field this API does not have, anywhere in the request.

    A client built from another version of the proto (the June API's CreateActorRequest has
    fields 2-4) is refused instead of half-read.
    """
    errors = FieldErrors()
    _unknown(request, "request", errors)
    errors.raise_if_any()


_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def check_ref(
    errors: FieldErrors, path: str, ref: Any, present: bool, *, atespaced: bool = True
) -> None:
    """An `ObjectRef` field: required, a short name, and an atespace for atespaced resources
    (`+k8s:subfield(atespace)=+k8s:required`) or none for global ones (`...=+k8s:forbidden`)."""
    if not present:
        errors.required(path)
        return
    if atespaced:
        check_short_name(errors, f"{path}.atespace", ref.atespace)
    elif ref.atespace:
        errors.forbidden(f"{path}.atespace", "may not be specified")
    check_short_name(errors, f"{path}.name", ref.name)


def check_delete_options(errors: FieldErrors, path: str, options: Any) -> None:
    """`DeleteOptions`: version >= 1 when set, uid a lowercase UUID when set."""
    if options.version < 0:
        errors.invalid(f"{path}.version", options.version, "must be greater than or equal to 1")
    if options.uid and not _UUID.fullmatch(options.uid):
        errors.invalid(f"{path}.uid", options.uid, "must be a lowercase UUID in 8-4-4-4-12 format")


def validated_ref(request: Any, field: str, *, atespaced: bool = True) -> str:
    """The request's ObjectRef ``field`` as `atespace/name` (or `name`), validated."""
    errors = FieldErrors()
    ref = getattr(request, field)
    check_ref(errors, field, ref, request.HasField(field), atespaced=atespaced)
    if "options" in request.DESCRIPTOR.fields_by_name and request.HasField("options"):
        check_delete_options(errors, "options", request.options)
    errors.raise_if_any()
    return f"{ref.atespace}/{ref.name}" if atespaced else ref.name
