"""`ControlPlane`: the local ateapi, put together from one part per resource and per workflow.

What every part shares (the state mirror and its store, the worker pool, the leases, the
sandbox runtime, the clock, and the few steps several workflows take) is `shared.Shared`. The
parts hold the behaviour: `atespaces`, `templates` (+ `golden`), `tags`, `actors` (records),
and the workflows `resume`, `parking` (pause, suspend), `revert`, `crashes` and `recovery`
(start-up adoption, the sandbox watchdog). Each part is built here from `Shared` and the few
parts it calls, never from the plane, so no part imports this module. The gRPC servicer calls
the parts; the router calls `lookup` and `sandbox_gone` in-process.
"""

from __future__ import annotations

import logging
import random
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.local.control.actors import Actors
from gym_substrate.local.control.atespaces import Atespaces
from gym_substrate.local.control.crashes import Crashes
from gym_substrate.local.control.golden import GoldenBuilder
from gym_substrate.local.control.locks import Workflows
from gym_substrate.local.control.parking import Parking
from gym_substrate.local.control.records import (
    CRASHED,
    STATES,
    ActorRecord,
)
from gym_substrate.local.control.recovery import Recovery
from gym_substrate.local.control.resume import Resume
from gym_substrate.local.control.revert import Revert
from gym_substrate.local.control.shared import Shared
from gym_substrate.local.control.state import Clock, State
from gym_substrate.local.control.store import Store
from gym_substrate.local.control.tags import Tags
from gym_substrate.local.control.templates import Templates
from gym_substrate.local.control.views import Views
from gym_substrate.local.control.warm_targets import attach_warm_pool
from gym_substrate.local.control.workers import WorkerPool
from gym_substrate.local.images import ImageCatalogue
from gym_substrate.local.metrics import Metrics
from gym_substrate.local.runtimes.base import SandboxRuntime

__all__ = ["ControlPlane"]

log = logging.getLogger(__name__)


class ControlPlane:
    """The local ateapi's state and behaviour (see the module docstring)."""

    def __init__(
        self,
        store: Store,
        runtime: SandboxRuntime,
        *,
        state_dir: Path,
        instance: str,
        workers: int,
        actors_per_worker: int,
        metrics: Metrics,
        images: ImageCatalogue,
        clock: Clock = time.time,
        rng: random.Random | None = None,
        allow_host_rootfs: bool = False,
    ) -> None:
        self.instance = instance
        self.state = State(store, clock)
        self.pool = WorkerPool(
            store,
            runtime,
            instance=instance,
            workers=workers,
            per_worker=actors_per_worker,
            clock=clock,
            rng=rng,
        )
        self.shared = Shared(
            state=self.state,
            pool=self.pool,
            locks=Workflows(),
            runtime=runtime,
            metrics=metrics,
            images=images,
            state_dir=state_dir,
            clock=clock,
            allow_host_rootfs=allow_host_rootfs,
        )
        shared = self.shared
        self.runtime = runtime
        self.locks = shared.locks
        self.metrics = metrics
        self.images = images
        self.state_dir = state_dir
        self.clock = clock
        self.sandbox_listeners = shared.sandbox_listeners  # the router drops its connections
        self.views = Views(self.pool)
        # each part gets what it uses: the shared collaborators and the parts it calls
        self.crashes = Crashes(shared)
        self.atespaces = Atespaces(shared)
        self.tags = Tags(shared)
        self.actors = Actors(shared, self.crashes)
        self.resume = Resume(shared, self.crashes)
        self.parking = Parking(shared, self.crashes)
        self.revert = Revert(shared, self.crashes)
        self.golden = GoldenBuilder(
            shared,
            atespaces=self.atespaces,
            actors=self.actors,
            tags=self.tags,
            resume=self.resume,
            parking=self.parking,
        )
        self.templates = Templates(
            shared, atespaces=self.atespaces, actors=self.actors, tags=self.tags, golden=self.golden
        )
        self.recovery = Recovery(
            shared, crashes=self.crashes, actors=self.actors, tags=self.tags, parking=self.parking
        )
        self.pool.on_epoch.append(self.crashes.crash_for_epoch)
        metrics.watch_state(self._state_counts, self.pool.counts)

    # ---------------------------------------------------------------- start / stop
    async def start(self, defaults: list[pb.ActorTemplate]) -> None:
        """Load state, adopt or crash what was running, create the default templates."""
        self.state.load()
        self.pool.load()
        await self.runtime.open()
        await self.recovery.recover()
        for template in defaults:
            await self.templates.ensure(template)
        self.golden.start_all()
        self.recovery.start_watchdog()
        attach_warm_pool(self.shared)  # golden sandboxes kept ready (runtimes with a warm pool)

    async def shutdown(self, *, suspend: bool = False, timeout_s: float = 120.0) -> None:
        """Stop every sandbox (`local down`); running actors are suspended first with
        ``suspend``, else they are CRASHED (their sandboxes go with the workers)."""
        await self.recovery.stop_watchdog()
        await self.golden.stop()
        await self.locks.drain()
        if suspend:
            await self.parking.suspend_all(timeout_s)
        await self.runtime.park_paused()  # frozen sandboxes become images before they go
        await self.recovery.stop_all()
        await self.runtime.cleanup()
        await self.runtime.close()

    async def detach(self) -> None:
        """Leave sandboxes running for the next start to adopt (control-plane restart)."""
        await self.recovery.stop_watchdog()
        await self.golden.stop()
        await self.locks.drain()
        await self.runtime.close()

    def _state_counts(self) -> Mapping[str, int]:
        counts = Counter(record.state for record in self.state.actors.values())
        for name in STATES:
            counts.setdefault(name, 0)
        return counts

    # ---------------------------------------------------------------- the router's fast path
    def lookup(self, atespace: str, name: str) -> ActorRecord | None:
        """The actor's record, no validation, no copy (the router's per-request look-up)."""
        return self.state.actors.get(f"{atespace}/{name}")

    async def sandbox_gone(self, key: str, handle: str) -> bool:
        """The router could not reach a RUNNING actor's agent: crash it if its sandbox died.

        True when the record changed (now CRASHED, or moved on meanwhile); False when the
        sandbox still runs (the agent was merely slow or refused).
        """
        record = self.state.actors.get(key)
        if record is None or record.handle != handle or record.state == CRASHED:
            return True
        if await self.runtime.is_alive(handle):
            return False
        await self.crashes.crash_dead_sandbox(record)
        return True

    async def wait_idle(self, key: str, timeout_s: float) -> bool:
        """Wait until the operation holding actor ``key``'s lease ends; True if one was."""
        return await self.locks.wait_idle(key, timeout_s)
