"""One exception tree for the provider, and the two places foreign errors are translated.

Callers catch at whatever level they care about; grpc and aiohttp errors never escape this package
raw. `translate_grpc_error` (used by `control_client.ControlClient` and by the server check
its first call runs, `_apicheck`) and `translate_http_errors` (used only by
`agent_client.AgentClient`) are the single crossing points;
both chain the original with `raise ... from exc`. The two roots live in
`gym_substrate.core.errors`, shared by all products.

    SubstrateError
    ├── ConfigError (+ ValueError)                 bad YAML / constructor input; names the path
    │   ├── UnsupportedServerError                 ateapi speaks the June 2026 API (refused)
    │   └── ConnectionConfigError                  connection.api/.router/.tls reach the wrong
    │                                              thing (or nothing); names the key to change
    ├── ProviderClosedError (+ RuntimeError)       the provider was used after aclose()
    ├── ControlPlaneError                          a gRPC call to ateapi failed
    │   ├── ActorNotFoundError                     NOT_FOUND
    │   ├── AlreadyExistsError                     ALREADY_EXISTS
    │   ├── NoFreeWorkersError                     RESOURCE_EXHAUSTED: no free capacity yet
    │   │                                          (waited out within the create/resume deadline)
    │   └── TransientControlPlaneError             UNAVAILABLE, ABORTED, DEADLINE_EXCEEDED
    │                                              (retried by policy)
    ├── ActorCrashedError                          the actor is CRASHED (has the crash message)
    ├── AgentError                                 an HTTP call through the router failed
    │   ├── AgentTransportError (+ ConnectionError)  reset, refused, read timeout
    │   ├── RouterError                            router 5xx/404: the actor was not reached
    │   │   └── ActorUnavailableError              router 503: the actor has no worker
    │   └── AgentResponseError                     the agent answered 4xx/5xx (has `code`)
    │       ├── ActorMismatchError                 409 actor_mismatch: wrong sandbox reached
    │       └── AgentProtocolError                 a success answer the contract does not
    │                                              declare (code `bad_reply`; names the
    │                                              endpoint and the field)
    ├── TransferError (+ OSError)                  upload/download failed or sha256 mismatch
    ├── RetryError                                 a retry deadline ran out (chained to the cause)
    ├── CloseError (+ RuntimeError)                close() could not delete the actor
    ├── SnapshotError                              a snapshot could not be taken, found or deleted
    │   ├── SnapshotBusyError                      calls were in flight in the source sandbox
    │   └── SnapshotInUseError                     live sandboxes still borrow it (`.borrowers`)
    └── SubstrateCreateError (+ SandboxCreateError)
        └── SubstrateCreateVerificationError (+ SandboxCreateVerificationError)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from gym_substrate.core.errors import ConfigError, SubstrateError
from gym_substrate.nemo.types import SandboxCreateError, SandboxCreateVerificationError

if TYPE_CHECKING:  # grpc is imported where it is used: `render` and the agent never pay for it
    import grpc

__all__ = [
    "ActorCrashedError",
    "ActorMismatchError",
    "ActorNotFoundError",
    "ActorUnavailableError",
    "AgentError",
    "AgentProtocolError",
    "AgentResponseError",
    "AgentTransportError",
    "AlreadyExistsError",
    "CloseError",
    "ConfigError",
    "ConnectionConfigError",
    "ControlPlaneError",
    "NoFreeWorkersError",
    "ProviderClosedError",
    "RetryError",
    "RouterError",
    "SnapshotBusyError",
    "SnapshotError",
    "SnapshotInUseError",
    "SubstrateCreateError",
    "SubstrateCreateVerificationError",
    "SubstrateError",
    "TransferError",
    "TransientControlPlaneError",
    "UnsupportedServerError",
    "translate_grpc_error",
    "translate_http_errors",
]


class UnsupportedServerError(ConfigError):
    """ateapi is older than this package speaks (June 2026 API); the message says what to run."""


class ConnectionConfigError(ConfigError):
    """The configured address answers as something else (or nothing answers): the message says
    what was found and which key to change (`key`, e.g. `connection.tls.plaintext`)."""

    def __init__(self, message: str, *, key: str) -> None:
        super().__init__(message)
        self.key = key


class ProviderClosedError(SubstrateError, RuntimeError):
    """The provider was used after `aclose()`."""


class ControlPlaneError(SubstrateError):
    """A gRPC call to Substrate's control plane (ateapi) failed."""

    def __init__(
        self,
        message: str,
        *,
        code: grpc.StatusCode | None = None,
        method: str = "",
        details: str = "",
    ) -> None:
        super().__init__(message)
        self.code = code
        self.method = method
        self.details = details


class ActorNotFoundError(ControlPlaneError):
    """The actor (or atespace) does not exist."""


class AlreadyExistsError(ControlPlaneError):
    """The actor or atespace already exists."""


class NoFreeWorkersError(ControlPlaneError):
    """RESOURCE_EXHAUSTED: no worker has free capacity for the actor yet.

    Workers free up as other actors park or go, so the provider waits this out within the
    create (or resume) deadline; the name is from the days of one actor per worker.
    """


class TransientControlPlaneError(ControlPlaneError):
    """A transient control-plane failure that the retry policy retries."""


class ActorCrashedError(SubstrateError):
    """The actor is CRASHED: its workload is gone until RevertActor (`lifecycle.on_crash`)."""

    def __init__(self, message: str, *, crash_message: str = "") -> None:
        super().__init__(message)
        self.crash_message = crash_message


class AgentError(SubstrateError):
    """An HTTP call to the sandbox agent (through the router) failed."""


class AgentTransportError(AgentError, ConnectionError):
    """The connection failed or broke before a full response arrived."""


class RouterError(AgentError):
    """The router answered instead of the agent (5xx or 404): the actor was not reached."""

    def __init__(self, message: str, *, status: int, body: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.body = body


class ActorUnavailableError(RouterError):
    """Router 503: the actor has no worker right now (it must be resumed)."""


class AgentResponseError(AgentError):
    """The agent answered with an error object `{"error": {"code", "message"}}`."""

    def __init__(self, message: str, *, status: int, code: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class ActorMismatchError(AgentResponseError):
    """The request reached a sandbox other than the one the handle names."""


class AgentProtocolError(AgentResponseError):
    """The agent answered a success status its endpoint does not declare, or a body that breaks
    the endpoint's declaration in `sandbox_agent.endpoints` (a missing field, a wrong value): the
    message names the endpoint and the field. `code` is `bad_reply`; never retried, as the same
    agent answers the same way again."""


class TransferError(SubstrateError, OSError):
    """A file upload or download failed or did not verify; no partial target is left."""


class RetryError(SubstrateError):
    """Retries ran out before the operation succeeded; `__cause__` is the last failure."""

    def __init__(self, message: str, cause: BaseException | None) -> None:
        super().__init__(message)
        self.cause = cause

    def __str__(self) -> str:
        base = super().__str__()
        return f"{base}; last exception: {self.cause}" if self.cause is not None else base


class CloseError(SubstrateError, RuntimeError):
    """`close()` could not bring the actor to deletion (recorded in the ledger)."""


class SnapshotError(SubstrateError):
    """A snapshot could not be taken, found, used or deleted; the message says which and why."""


class SnapshotBusyError(SnapshotError):
    """Commands, transfers or PTY calls were in flight in the sandbox: no snapshot was taken."""


class SnapshotInUseError(SnapshotError):
    """Live sandboxes were created from the snapshot and have not suspended away from it yet:
    deleting it would strand them. `borrowers` names them (`atespace/name`)."""

    def __init__(self, message: str, *, borrowers: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.borrowers = borrowers


class SubstrateCreateError(SubstrateError, SandboxCreateError):
    """`create()` failed; any actor it made was cleaned up (or logged as possibly leaked)."""


class SubstrateCreateVerificationError(SubstrateCreateError, SandboxCreateVerificationError):
    """The actor started but its agent never answered `/readyz` in time."""


_TRANSIENT_CODES = frozenset({"UNAVAILABLE", "ABORTED", "DEADLINE_EXCEEDED"})


def translate_grpc_error(exc: grpc.RpcError, method: str) -> ControlPlaneError:
    """Map a grpc error to the most specific `ControlPlaneError` (the gRPC crossing point)."""
    import grpc

    code_fn: Any = getattr(exc, "code", None)
    details_fn: Any = getattr(exc, "details", None)
    code: grpc.StatusCode | None = code_fn() if callable(code_fn) else None
    details: str = (details_fn() if callable(details_fn) else "") or ""
    name = code.name if code is not None else "UNKNOWN"
    message = f"{method}: {name}: {details}" if details else f"{method}: {name}"
    cls: type[ControlPlaneError] = ControlPlaneError
    if code == grpc.StatusCode.NOT_FOUND:
        cls = ActorNotFoundError
    elif code == grpc.StatusCode.ALREADY_EXISTS:
        cls = AlreadyExistsError
    elif code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        cls = NoFreeWorkersError
    elif name in _TRANSIENT_CODES:
        cls = TransientControlPlaneError
    return cls(message, code=code, method=method, details=details)


@contextlib.contextmanager
def translate_http_errors(what: str) -> Iterator[None]:
    """Turn aiohttp/OS/timeout errors raised inside the block into `AgentTransportError`."""
    import aiohttp

    try:
        yield
    except SubstrateError:
        raise
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        detail = str(exc) or type(exc).__name__
        raise AgentTransportError(f"{what}: {detail}") from exc
