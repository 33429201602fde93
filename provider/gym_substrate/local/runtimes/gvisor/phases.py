"""Where the gVisor runtime's time goes, step by step (issue 22 item 4).

Each lifecycle call (start/restore, checkpoint, the background tail after a park) records the
wall time of its steps here: a few floats per call, kept in memory (the newest ``_KEEP`` per
step), read by ``gym-substrate local bench --phases`` and logged at debug level
(``gym_substrate.local.runtimes.gvisor.phases``). The clock is injectable for tests.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Iterator

__all__ = ["Phases"]

log = logging.getLogger(__name__)

_KEEP = 1000


class Phases:
    """Per-step durations (ms), newest ``_KEEP`` per step name."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._samples: dict[str, deque[float]] = {}

    def add(self, name: str, ms: float) -> None:
        self._samples.setdefault(name, deque(maxlen=_KEEP)).append(ms)
        log.debug("phase %s: %.2f ms", name, ms)

    @contextlib.contextmanager
    def timed(self, name: str) -> Iterator[None]:
        """Record the time the ``with`` body took under ``name`` (also when it raises)."""
        started = self._clock()
        try:
            yield
        finally:
            self.add(name, (self._clock() - started) * 1000)

    def samples(self) -> dict[str, list[float]]:
        """A copy: step name -> durations in ms, oldest first."""
        return {name: list(values) for name, values in self._samples.items()}

    def clear(self) -> None:
        self._samples.clear()
