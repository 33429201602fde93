"""One error type for every expected failure, rendered as the contract's JSON error body.

Handlers raise `ApiError`; a single middleware turns it (and aiohttp's own HTTP exceptions) into
`{"error": {"code", "message"}}`, so no code path can leak a stack trace to a client.
"""

from __future__ import annotations

import json

from aiohttp import web

__all__ = ["ApiError", "error_response"]


class ApiError(Exception):
    """A client-visible failure: HTTP status, snake_case code and a message saying how to fix it."""

    def __init__(
        self, status: int, code: str, message: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers or {}


def error_response(
    status: int, code: str, message: str, headers: dict[str, str] | None = None
) -> web.Response:
    body = json.dumps({"error": {"code": code, "message": message}})
    resp = web.Response(status=status, text=body, content_type="application/json")
    if headers:
        resp.headers.update(headers)
    return resp
