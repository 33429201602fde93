"""No actor stays in a transitional state once the operation that put it there has ended.

RESUMING, PAUSING, SUSPENDING, REVERTING and DELETING each belong to one operation holding the
actor's lease. Issue 29 found a resume that raised an error of a class nobody expected (an `ip`
failure): it left its actor RESUMING on its worker slot for good, and four of them held every
slot of the backend. Two guards keep that from happening again, whatever the cause:

* ``guard``: around every workflow. An error that escapes while the actor is still in the state
  the workflow put it in CRASHES the actor with the reason (as upstream does for a failed
  resume or checkpoint), which frees its slot and stops its sandbox, and the caller gets the
  error as INTERNAL. A cancellation (a client deadline on a resume) is left alone: upstream
  leaves the actor RESUMING for the next ResumeActor to finish.
* ``Orphans``: the watchdog's part. An actor seen in a transitional state with no lease holder
  for ``grace_s`` (on the plane's clock) has no operation behind it; it is logged, counted
  (``gym_substrate_local_orphaned_transitions_total``) and crashed the same way.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

import grpc

from gym_substrate.core.states import TRANSITIONAL_STATES
from gym_substrate.local.control.records import (
    DELETING,
    PAUSING,
    RESUMING,
    REVERTING,
    SUSPENDING,
)
from gym_substrate.local.errors import AteapiError

if TYPE_CHECKING:
    from gym_substrate.local.control.crashes import Crashes
    from gym_substrate.local.control.locks import Workflows
    from gym_substrate.local.control.state import State
    from gym_substrate.local.metrics import Metrics

__all__ = ["ORPHAN_GRACE_S", "Orphans", "guard"]

log = logging.getLogger(__name__)

ORPHAN_GRACE_S = 30.0
_OPERATION = {
    RESUMING: "resume",
    PAUSING: "pause",
    SUSPENDING: "suspend",
    REVERTING: "revert",
    DELETING: "delete",
}


@contextlib.asynccontextmanager
async def guard(state: State, crashes: Crashes, key: str, operation: str) -> AsyncIterator[None]:
    """Run a workflow on actor ``key``; crash the actor if it escapes mid-transition."""
    try:
        yield
    except Exception as exc:
        record = state.actors.get(key)
        if record is None or record.state not in TRANSITIONAL_STATES:
            raise
        reason = f"{type(exc).__name__}: {exc}"
        log.error("actor %s: %s failed in %s: %s", key, operation, record.state, reason)
        try:
            await crashes.crash(record, operation, f"internal error: {reason}")
        except Exception:  # noqa: BLE001 - the original error is the one to report
            log.exception("actor %s: crashing it after a failed %s failed too", key, operation)
        if isinstance(exc, AteapiError):
            raise
        raise AteapiError(
            grpc.StatusCode.INTERNAL, f"actor {key} crashed: {operation} failed: {reason}"
        ) from exc


class Orphans:
    """Transitional actors with no operation behind them, repaired after ``grace_s``."""

    def __init__(
        self,
        state: State,
        locks: Workflows,
        metrics: Metrics,
        crashes: Crashes,
        clock: Callable[[], float],
        grace_s: float = ORPHAN_GRACE_S,
    ) -> None:
        self.state = state
        self.locks = locks
        self.metrics = metrics
        self.crashes = crashes
        self.clock = clock
        self.grace_s = grace_s
        self._seen: dict[str, float] = {}  # actor key -> when first seen orphaned

    async def sweep(self) -> list[str]:
        """One look at every actor; the keys repaired this time."""
        now = self.clock()
        orphaned = {
            key
            for key, record in self.state.actors.items()
            if record.state in TRANSITIONAL_STATES and not self.locks.busy(key)
        }
        self._seen = {key: self._seen.get(key, now) for key in orphaned}
        repaired = []
        for key, since in list(self._seen.items()):
            if now - since >= self.grace_s and await self._repair(key):
                repaired.append(key)
                del self._seen[key]
        return repaired

    async def _repair(self, key: str) -> bool:
        try:
            async with self.locks.lock(key):
                record = self.state.actors.get(key)
                if record is None or record.state not in TRANSITIONAL_STATES:
                    return False
                state = record.state
                log.error(
                    "actor %s was %s with no operation behind it for %.0f s: crashing it",
                    key,
                    state,
                    self.grace_s,
                )
                self.metrics.orphaned_transitions.labels(state).inc()
                await self.crashes.crash(
                    record,
                    _OPERATION[state],
                    f"left {state} with no operation behind it (repaired by the watchdog)",
                )
                return True
        except AteapiError:  # an operation took the lease meanwhile: not an orphan any more
            return False
