"""What `ManagedActor` (`_managed.py`) is made of besides itself: the services every sandbox of
a provider shares, its lifecycle states, its own errors, and how a control-plane error is read
when resuming and deleting.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Protocol

from gym_substrate.nemo._actor import SubstrateActor
from gym_substrate.nemo._retry import RetryPolicy, is_transient_control
from gym_substrate.nemo.agent_client import AgentClient, HttpTransport
from gym_substrate.nemo.config import CrashPolicy, IdlePolicy
from gym_substrate.nemo.control_client import ControlAPI
from gym_substrate.nemo.errors import (
    ActorNotFoundError,
    ControlPlaneError,
    NoFreeWorkersError,
    SubstrateError,
    TransientControlPlaneError,
)

__all__ = [
    "ActorServices",
    "Lifecycle",
    "Recorder",
    "ResumeFailedError",
    "WorkloadLostError",
    "is_code",
    "may_be_crashed",
    "teardown_may_retry",
]


class Lifecycle(enum.Enum):
    """Where a sandbox is, as this process knows it."""

    ACTIVE = "active"  # on a worker, or believed to be: the next request finds out
    PARKED = "parked"  # paused or suspended (by us or before connect); the next call resumes it
    CRASHED = "crashed"  # found CRASHED with on_crash: fail; calls fail until close()
    CLOSED = "closed"  # deleted by close(); every later call is refused


class Recorder(Protocol):
    async def __call__(self, event: str, actor: SubstrateActor, **extra: Any) -> None: ...


@dataclass(frozen=True)
class ActorServices:
    """What every sandbox of one provider shares: clients, policies and the ledger."""

    control: ControlAPI
    transport: HttpTransport
    router: str
    retry: RetryPolicy
    ready_timeout_s: float
    close_timeout_s: float
    idle_policy: IdlePolicy
    idle_after_s: float
    record: Recorder
    on_crash: CrashPolicy = "fail"

    def agent(self, actor: SubstrateActor) -> AgentClient:
        return AgentClient(self.transport, self.router, actor.actor_id, actor.atespace)


class ResumeFailedError(SubstrateError):
    """The actor lost its worker (router 503) and could not be resumed; chained to why."""


class WorkloadLostError(SubstrateError):
    """The actor is RUNNING but its workload does not answer: it died (router 503)."""


# Errors that another look cannot fix: the request itself is wrong, or we may not make it.
_FINAL_FOR_TEARDOWN = frozenset({"INVALID_ARGUMENT", "PERMISSION_DENIED", "UNAUTHENTICATED"})


def is_code(exc: BaseException, name: str) -> bool:
    return isinstance(exc, ControlPlaneError) and exc.code is not None and exc.code.name == name


def may_be_crashed(exc: BaseException) -> bool:
    """A refused ResumeActor (not a transient or capacity answer): GetActor says if CRASHED."""
    return (
        isinstance(exc, ControlPlaneError)
        and not isinstance(exc, (ActorNotFoundError, NoFreeWorkersError))
        and not is_transient_control(exc)
    )


def teardown_may_retry(exc: BaseException) -> bool:
    """Teardown looks again after anything but a request the server can never accept.

    A delete that raced another operation (ABORTED, FAILED_PRECONDITION), transient codes, an
    INTERNAL from a workflow that failed halfway: each is over at the next look.
    """
    if isinstance(exc, (NoFreeWorkersError, TransientControlPlaneError)):
        return True
    if isinstance(exc, ActorNotFoundError):  # gone: teardown is done, not retried
        return False
    return isinstance(exc, ControlPlaneError) and not (
        exc.code is not None and exc.code.name in _FINAL_FOR_TEARDOWN
    )
