"""The parking lot: one bounded set of places for requests waiting on a retrying resume.

As atenet's `parkingLot` (`cmd/atenet/internal/router/ingress/parking.go@4558b166`): one lot
per router, not per actor; a waiting caller (not a flight) holds a place, taken only when its
flight meets its first retryable error, so a full lot never slows traffic to running actors.
A caller that finds the lot full is shed at once (503, counted as rejected). Releasing a place
records the wait under its outcome. A lot of size 0 disables parking: everyone is admitted and
nothing is counted.
"""

from __future__ import annotations

import logging
import time

from gym_substrate.local.metrics import Metrics

__all__ = ["DEFAULT_PARKED_REQUEST_MAX", "OUTCOMES", "ParkingLot", "Place"]

log = logging.getLogger(__name__)

DEFAULT_PARKED_REQUEST_MAX = 1024
# parking.wait.duration's `outcome` values (parkOutcome*)
OUTCOMES = ("served", "budget_exhausted", "timeout", "canceled", "error")


class Place:
    """One caller's place; `release` once, with how its wait ended."""

    def __init__(self, lot: ParkingLot | None) -> None:
        self._lot = lot
        self._started = time.monotonic()

    def release(self, outcome: str) -> None:
        lot, self._lot = self._lot, None
        if lot is not None:
            lot._release(outcome, time.monotonic() - self._started)


class ParkingLot:
    def __init__(self, size: int, metrics: Metrics) -> None:
        if size < 0:
            raise ValueError(f"parked_request_max must be >= 0 (0 disables parking), got {size}")
        self.size = size
        self.metrics = metrics
        self.active = 0

    @property
    def enabled(self) -> bool:
        return self.size > 0

    def enter(self) -> Place | None:
        """A place, or None when the lot is full (the caller is shed)."""
        if not self.enabled:
            return Place(None)
        if self.active >= self.size:
            self.metrics.parking_rejected.inc()
            return None
        self.active += 1
        self.metrics.parking_active.inc()
        return Place(self)

    def _release(self, outcome: str, waited_s: float) -> None:
        if outcome not in OUTCOMES:
            raise ValueError(f"unknown parking outcome {outcome!r}")
        if self.active > 0:
            self.active -= 1
        else:  # cannot happen: a place exists only after an admission, released once
            log.error("parking lot place released more times than taken")
        self.metrics.parking_active.dec()
        self.metrics.parking_wait.labels(outcome).observe(waited_s)
