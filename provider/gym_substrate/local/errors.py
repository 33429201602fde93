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

__all__ = ["ApiError", "BackendError", "check_label", "check_selector", "quote"]

# Kubernetes label keys and values (not DNS labels: upper case, '_' and '.' are allowed).
# Always fullmatch: `$` would also match before a trailing newline.
_LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
# an error message repeats at most this much of the input it refuses
_QUOTE_CHARS = 64


class ApiError(Exception):
    """An ateapi error: the gRPC status `code` and the `message` Substrate sends with it."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class BackendError(RuntimeError):
    """The backend cannot start or stop; the message says why and what to do."""


def quote(value: str, *, bare: bool = False) -> str:
    """An input as an error message repeats it: at most 64 characters, then the length.

    ``repr`` of it, or the text itself with ``bare`` (where Substrate's own message has no
    quotes). gRPC sends a status message as metadata, which clients cap (16 KiB by default): a
    message repeating a 20 KB name reaches the client as RESOURCE_EXHAUSTED, not its real code.
    """
    shown = value[:_QUOTE_CHARS]
    text = shown if bare else repr(shown)
    if len(value) > _QUOTE_CHARS:
        text += f"... ({len(value)} characters)"
    return text


def check_label(value: str, what: str) -> None:
    """Refuse an actor id or atespace name that is not a DNS-1123 label (INVALID_ARGUMENT)."""
    if not value:
        raise ApiError(grpc.StatusCode.INVALID_ARGUMENT, f"{what} must not be empty")
    if not is_dns_label(value):
        raise ApiError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"{what} {quote(value)} is not a valid DNS-1123 label: use at most 63 lowercase "
            "letters, digits and '-', starting and ending with a letter or digit",
        )


def check_selector(labels: Mapping[str, str]) -> None:
    """Kubernetes label rules, as Substrate's CreateActor applies them to worker_selector."""
    if len(labels) > 10:
        raise ApiError(grpc.StatusCode.INVALID_ARGUMENT, "worker_selector has more than 10 labels")
    for key, value in labels.items():
        prefix, _, name = key.rpartition("/")
        if (
            len(name) > 63
            or not _LABEL_NAME.fullmatch(name)
            or (prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.fullmatch(prefix)))
            or ("/" in key and not prefix)
        ):
            raise ApiError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"worker_selector key {quote(key)} is not a valid label key: use [prefix/]name "
                "with a name of at most 63 letters, digits, '-', '_' or '.', alphanumeric at "
                "both ends",
            )
        if len(value) > 63 or (value and not _LABEL_NAME.fullmatch(value)):
            raise ApiError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"worker_selector value {quote(value)} for {quote(key)} is not a valid label "
                "value: at most 63 letters, digits, '-', '_' or '.', alphanumeric at both ends",
            )
