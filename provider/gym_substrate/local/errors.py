"""The local backend's errors, and the name checks ateapi applies before it touches any state.

`ApiError` is what an ateapi call answers; `BackendError` is a backend that cannot start or stop
(both messages say what to do); a runtime's `RuntimeFailure` belongs to its contract
(`runtimes/base.py`). The control plane raises `ApiError(code, message)` with the exact gRPC
status codes and messages Substrate's ateapi uses (reference/substrate.md §1.2-1.5); the gRPC
servicer aborts with them as they are and the router maps them to atenet's HTTP answers, so both
front doors report one error the same way.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import grpc

from gym_substrate._names import is_dns_label

__all__ = [
    "ApiError",
    "BackendError",
    "go_quote",
    "internal",
    "quote",
    "require",
    "validate_actor_id",
    "validate_atespace",
    "validate_selector",
]

# Kubernetes label keys and values and DNS-1123 names, as k8s.io/apimachinery (v0.36, which
# ateapi pins) checks them. Always fullmatch: `$` would also match before a trailing newline.
_LABEL_NAME_FMT = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_LABEL_NAME = re.compile(_LABEL_NAME_FMT)
_DNS_LABEL_FMT = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_SUBDOMAIN_FMT = _DNS_LABEL_FMT + "(\\." + _DNS_LABEL_FMT + ")*"
_DNS_SUBDOMAIN = re.compile(_DNS_SUBDOMAIN_FMT)
_LABEL_KEY_MSG = (
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
    "alphanumeric character"
)
_LABEL_VALUE_MSG = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or "
    "'.', and must start and end with an alphanumeric character"
)
_SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or "
    "'.', and must start and end with an alphanumeric character"
)
_MAX_SELECTOR_LABELS = 10
# an error message repeats at most this much of the input it refuses
_QUOTE_CHARS = 64
_GO_ESCAPES = {
    "\a": "\\a",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\v": "\\v",
}


class ApiError(Exception):
    """An ateapi error: the gRPC status `code` and the `message` Substrate sends with it."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class BackendError(RuntimeError):
    """The backend cannot start or stop; the message says why and what to do."""


def internal(message: str) -> ApiError:
    """An error ateapi returns without a gRPC status: its interceptor makes it INTERNAL so."""
    return ApiError(grpc.StatusCode.INTERNAL, f"internal server error: {message}")


def _cap(value: str) -> tuple[str, str]:
    if len(value) > _QUOTE_CHARS:
        return value[:_QUOTE_CHARS], f"... ({len(value)} characters)"
    return value, ""


def quote(value: str, *, bare: bool = False) -> str:
    """An input as an error message repeats it: at most 64 characters, then the length.

    ``repr`` of it, or the text itself with ``bare`` (where Substrate's own message has no
    quotes). gRPC sends a status message as metadata, which clients cap (16 KiB by default): a
    message repeating a 20 KB name reaches the client as RESOURCE_EXHAUSTED, not its real code.
    """
    shown, rest = _cap(value)
    return (shown if bare else repr(shown)) + rest


def go_quote(value: str) -> str:
    """Go's ``%q`` of an input (double quotes, Go escapes), capped as ``quote`` caps it."""
    shown, rest = _cap(value)
    out = []
    for char in shown:
        if char in ('"', "\\"):
            out.append("\\" + char)
        elif char in _GO_ESCAPES:
            out.append(_GO_ESCAPES[char])
        elif char.isprintable():
            out.append(char)
        elif ord(char) < 0x80:
            out.append(f"\\x{ord(char):02x}")
        elif ord(char) <= 0xFFFF:
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(f"\\U{ord(char):08x}")
    return '"' + "".join(out) + '"' + rest


def require(value: str, message: str) -> None:
    """INVALID_ARGUMENT ``message`` (ateapi's "... is required") for an empty field."""
    if not value:
        raise ApiError(grpc.StatusCode.INVALID_ARGUMENT, message)


def _validate_label(value: str, what: str) -> None:
    # internal/resources/actor.go: the length first (in bytes, as Go counts), then the pattern
    if len(value.encode()) > 63:
        raise ApiError(
            grpc.StatusCode.INVALID_ARGUMENT, f"invalid {what}: must be no more than 63 characters"
        )
    if not is_dns_label(value):
        raise ApiError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"invalid {what}: must start and end with a lower case alphanumeric character, and "
            "consist only of lower case alphanumeric characters or '-'",
        )


def validate_actor_id(value: str) -> None:
    """ateapi's ValidateActorID: a DNS-1123 label, else INVALID_ARGUMENT "invalid actor_id: ..."."""
    _validate_label(value, "actor_id")


def validate_atespace(value: str) -> None:
    """ateapi's ValidateAtespace: a DNS-1123 label, else "invalid atespace: ..."."""
    _validate_label(value, "atespace")


def _regex_error(message: str, pattern: str, *examples: str) -> str:
    shown = "".join(("" if i == 0 else " or ") + f"'{e}', " for i, e in enumerate(examples))
    return f"{message} (e.g. {shown}regex used for validation is '{pattern}')"


def _max_len(limit: int) -> str:
    return f"must be no more than {limit} bytes"


def _label_key_errors(key: str) -> list[str]:
    """apimachinery's IsLabelKey (IsQualifiedName): every problem of a label key, in its order."""
    errors: list[str] = []
    parts = key.split("/")
    if len(parts) > 2:
        return [
            "a valid label key "
            + _regex_error(_LABEL_KEY_MSG, _LABEL_NAME_FMT, "MyName", "my.name", "123-abc")
            + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
        ]
    name = parts[-1]
    if len(parts) == 2:
        prefix = parts[0]
        if not prefix:
            errors.append("prefix part must be non-empty")
        else:
            if len(prefix.encode()) > 253:
                errors.append("prefix part " + _max_len(253))
            if not _DNS_SUBDOMAIN.fullmatch(prefix):
                errors.append(
                    "prefix part " + _regex_error(_SUBDOMAIN_MSG, _DNS_SUBDOMAIN_FMT, "example.com")
                )
    if not name:
        errors.append("name part must be non-empty")
    elif len(name.encode()) > 63:
        errors.append("name part " + _max_len(63))
    if not _LABEL_NAME.fullmatch(name):
        errors.append(
            "name part "
            + _regex_error(_LABEL_KEY_MSG, _LABEL_NAME_FMT, "MyName", "my.name", "123-abc")
        )
    return errors


def _label_value_errors(value: str) -> list[str]:
    """apimachinery's IsLabelValue."""
    errors = []
    if len(value.encode()) > 63:
        errors.append(_max_len(63))
    if value and not _LABEL_NAME.fullmatch(value):
        errors.append(
            _regex_error(_LABEL_VALUE_MSG, f"({_LABEL_NAME_FMT})?", "MyValue", "my_value", "12345")
        )
    return errors


def validate_selector(labels: Mapping[str, str]) -> None:
    """create_actor.go's validateSelector: at most 10 labels, Kubernetes label keys and values.

    Go walks the map in random order, so which bad label a real server names first varies;
    here it is the first in the request.
    """
    if len(labels) > _MAX_SELECTOR_LABELS:
        raise ApiError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"worker_selector has {len(labels)} match_labels entries, exceeding the limit of "
            f"{_MAX_SELECTOR_LABELS}",
        )
    for key, value in labels.items():
        problems = _label_key_errors(key)
        if problems:
            raise ApiError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"invalid worker_selector label key {go_quote(key)}: {'; '.join(problems)}",
            )
        problems = _label_value_errors(value)
        if problems:
            raise ApiError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"invalid worker_selector label value {go_quote(value)} for key "
                f"{go_quote(key)}: {'; '.join(problems)}",
            )
