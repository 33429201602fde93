"""The local backend's errors.

`AteapiError` is what an ateapi call answers: the gRPC status code and message Substrate sends
(the control plane raises it, the servicer aborts with it unchanged, the router maps it to
atenet's HTTP answers, so both front doors report one error the same way). `BackendError` is a
backend that cannot start or stop; both messages say what to do. A runtime's `RuntimeFailure`
belongs to its contract (`runtimes/base.py`).
"""

from __future__ import annotations

import grpc

__all__ = ["AteapiError", "BackendError", "go_quote", "internal", "quote"]

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


class AteapiError(Exception):
    """An ateapi error: the gRPC status `code` and the `message` Substrate sends with it."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class BackendError(RuntimeError):
    """The backend cannot start or stop; the message says why and what to do."""


def internal(message: str) -> AteapiError:
    """An error ateapi returns without a gRPC status: its interceptor makes it INTERNAL so."""
    return AteapiError(grpc.StatusCode.INTERNAL, f"internal server error: {message}")


def _cap(value: str) -> tuple[str, str]:
    if len(value) > _QUOTE_CHARS:
        return value[:_QUOTE_CHARS], f"... ({len(value)} characters)"
    return value, ""


def quote(value: str, *, bare: bool = False) -> str:
    """An input as an error message repeats it: at most 64 characters, then the length.

    ``repr`` of it, or the text itself with ``bare``. gRPC sends a status message as metadata,
    which clients cap (16 KiB by default): a message repeating a 20 KB name reaches the client
    as RESOURCE_EXHAUSTED, not its real code.
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
