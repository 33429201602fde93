"""One error type for every expected failure, rendered as the contract's JSON error body.

Handlers raise `ApiError`; a single middleware turns it (and the server's own `HTTPError`) into
`{"error": {"code", "message"}}`, so no code path can leak a stack trace to a client.
"""

from __future__ import annotations

import json

from ._http import Response
from ._wire import reply
from .contract import ErrorBody, ErrorCode

__all__ = ["ApiError", "body_timeout_error", "code_for_status", "error_body", "error_response"]

# Statuses that the server raises or answers by itself, as the contract's error codes.
_STATUS_CODES: dict[int, ErrorCode] = {
    401: "unauthorized",
    403: "permission_denied",
    404: "not_found",
    405: "method_not_allowed",
    408: "request_timeout",
    413: "too_large",
    416: "range_not_satisfiable",
}


def code_for_status(status: int) -> ErrorCode:
    return _STATUS_CODES.get(status, "bad_request" if status < 500 else "internal")


class ApiError(Exception):
    """A client-visible failure: HTTP status, snake_case code and a message saying how to fix it."""

    def __init__(
        self, status: int, code: ErrorCode, message: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers or {}


def error_body(code: ErrorCode, message: str) -> bytes:
    return json.dumps(reply(ErrorBody, {"error": {"code": code, "message": message}})).encode()


def error_response(
    status: int, code: ErrorCode, message: str, headers: dict[str, str] | None = None
) -> Response:
    return Response(error_body(code, message), status, "application/json", headers)


def body_timeout_error(seconds: float) -> ApiError:
    """The answer to a body that did not arrive in time; the connection is closed after it."""
    return ApiError(
        408,
        "request_timeout",
        f"the request body did not arrive within {seconds:g} s of its headers; "
        "the connection is closed",
    )
