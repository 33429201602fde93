"""The router's own answers: ext_proc's immediate responses and how resume errors map to them.

Statuses and bodies follow `mapResumeError` (`cmd/atenet/internal/router/ingress/errors.go`
@18d1c266): `<ref>` is `atespace/name` unquoted, except in the parking lot's 503, which Go's
`%q` quotes. A denial is text/plain (`extproc/errors.go@86d8bcf8`). The route outcome label
follows `classifyOutcome` as `extproc/metrics_test.go@2e3e300a` pins it: the gRPC code wins,
then the HTTP status of a denial.
"""

from __future__ import annotations

import grpc
from aiohttp import web

from gym_substrate.local.errors import AteapiError
from gym_substrate.local.router.headers import ActorRef

__all__ = [
    "BudgetExhausted",
    "Denied",
    "ParkingFull",
    "bare_reply",
    "map_resume_error",
    "text_reply",
]

_ENVOY = "envoy"


class BudgetExhausted(AteapiError):
    """The flight's budget ran out while the last error was still retryable.

    It carries that error's code and message, so it maps like it (capacity stays a 503);
    only the parking metric tells it apart (`budgetExhaustedError`, resumer.go@18d1c266).
    """

    def __init__(self, last: AteapiError) -> None:
        super().__init__(last.code, last.message)


class ParkingFull(Exception):
    """The lot had no free place when this caller's flight started retrying."""


class Denied(Exception):
    """A request the router answers itself: ``status``, ``body`` and the route ``outcome``."""

    def __init__(self, status: int, body: str, outcome: str) -> None:
        super().__init__(f"{status} {body}")
        self.status = status
        self.body = body
        self.outcome = outcome

    def reply(self) -> web.Response:
        return text_reply(self.status, self.body)


def text_reply(status: int, body: str) -> web.Response:
    """An ext_proc immediate response (or an Envoy local reply with a body)."""
    headers = {"Server": _ENVOY, "Content-Type": "text/plain"}  # exactly, no charset
    return web.Response(status=status, body=body.encode(), headers=headers)


def bare_reply(status: int) -> web.Response:
    """An Envoy local reply without a body (ext_proc timeout, refused upgrade)."""
    return web.Response(status=status, headers={"Server": _ENVOY})


_C = grpc.StatusCode
# gRPC code -> (HTTP status, body; {ref} and {msg} filled in)
_MAPPED = {
    _C.NOT_FOUND: (404, "actor {ref} not found"),
    _C.FAILED_PRECONDITION: (503, "actor {ref} unavailable: {msg}"),
    _C.ABORTED: (503, "actor {ref} unavailable: {msg}"),
    _C.UNAVAILABLE: (503, "actor {ref} unavailable"),
    _C.RESOURCE_EXHAUSTED: (503, "actor {ref} unavailable: {msg}"),
    _C.DEADLINE_EXCEEDED: (504, "actor {ref} request timed out"),
    _C.PERMISSION_DENIED: (403, "actor {ref} access denied"),
    _C.UNAUTHENTICATED: (401, "actor {ref} authentication required"),
}
_OTHER = (500, "error resuming actor {ref}")
# gRPC code -> ate.router.outcome; any other code is "resume_error"
_OUTCOMES = {
    _C.CANCELLED: "cancelled",
    _C.DEADLINE_EXCEEDED: "timeout",
    _C.FAILED_PRECONDITION: "failed_precondition",
    _C.ABORTED: "lock_conflict",
    _C.NOT_FOUND: "not_found",
    _C.UNAVAILABLE: "unavailable",
    _C.RESOURCE_EXHAUSTED: "no_capacity",
}


def map_resume_error(ref: ActorRef, exc: BaseException) -> Denied:
    """The client's answer to a resume that failed with ``exc``."""
    if isinstance(exc, ParkingFull):
        # refs are DNS labels, so Go's %q is plain double quotes; no Retry-After header
        return Denied(503, f'actor "{ref}" unavailable: router at capacity', "unavailable")
    if isinstance(exc, AteapiError):
        status, body = _MAPPED.get(exc.code, _OTHER)
        outcome = _OUTCOMES.get(exc.code, "resume_error")
        return Denied(status, body.format(ref=ref, msg=exc.message), outcome)
    return Denied(_OTHER[0], _OTHER[1].format(ref=ref), "resume_error")
