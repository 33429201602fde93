"""`ControlPlane`: the local ateapi, put together from one part per resource and per workflow.

This module owns what every part shares: the state mirror and its store, the worker pool, the
leases, the sandbox runtime, and the few steps several workflows take (find an actor's
template, build what the runtime runs, stop a sandbox, crash an actor). The parts hold the
behaviour: `atespaces`, `templates` (+ `golden`), `tags`, `actors` (records), and the
workflows `resume`, `parking` (pause, suspend), `revert` (+ crash) and `recovery` (start-up
adoption, the sandbox watchdog). The gRPC servicer calls the parts; the router calls
`lookup` and `sandbox_gone` in-process.
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

import grpc

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.local.control.actors import Actors
from gym_substrate.local.control.atespaces import Atespaces
from gym_substrate.local.control.golden import GoldenBuilder
from gym_substrate.local.control.locks import Workflows
from gym_substrate.local.control.parking import Parking
from gym_substrate.local.control.records import (
    CRASHED,
    STATES,
    ActorRecord,
    TemplateRecord,
)
from gym_substrate.local.control.recovery import Recovery
from gym_substrate.local.control.resume import Resume
from gym_substrate.local.control.revert import Revert
from gym_substrate.local.control.state import Clock, State
from gym_substrate.local.control.store import Store
from gym_substrate.local.control.tags import Tags
from gym_substrate.local.control.templates import HOST_ROOTFS_REFUSED, Templates
from gym_substrate.local.control.views import Views
from gym_substrate.local.control.warm_targets import attach_warm_pool
from gym_substrate.local.control.workers import WorkerPool
from gym_substrate.local.errors import AteapiError
from gym_substrate.local.images import ImageCatalogue
from gym_substrate.local.metrics import Metrics
from gym_substrate.local.runtimes.base import ActorSpec, RuntimeFailure, SandboxRuntime

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
        self.runtime = runtime
        # templates on the host's `/` (the image local/host): only with the operator's opt-in
        self.allow_host_rootfs = allow_host_rootfs
        self.state_dir = state_dir
        self.instance = instance
        self.metrics = metrics
        self.images = images
        self.clock = clock
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
        self.views = Views(self.pool)
        self.locks = Workflows()
        # called with a sandbox handle before it is checkpointed or stopped, so the router can
        # drop its pooled connections into it (a checkpoint with open connections fails, and a
        # pooled connection into a restored sandbox hangs)
        self.sandbox_listeners: list[Callable[[str], Awaitable[None]]] = []
        self.atespaces = Atespaces(self)
        self.templates = Templates(self)
        self.golden = GoldenBuilder(self)
        self.tags = Tags(self)
        self.actors = Actors(self)
        self.resume = Resume(self)
        self.parking = Parking(self)
        self.revert = Revert(self)
        self.recovery = Recovery(self)
        self.pool.on_epoch.append(self.revert.crash_for_epoch)
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
        attach_warm_pool(self)  # golden sandboxes kept ready (runtimes with a warm pool)

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

    # ---------------------------------------------------------------- shared steps
    def template_of(self, record: ActorRecord) -> TemplateRecord:
        """The actor's template, or FAILED_PRECONDITION as ateapi's template resolution.

        Upstream wraps its status (`%w; ObjectRef: <ref> `), but ateapi's ServerUnaryInterceptor
        answers the wrapped status itself (errors.As, internal/ateinterceptors/
        ateinterceptors.go@2e3e300a): the client reads `actor template not found`.
        """
        template = self.state.templates.get(record.template)
        if template is None:
            raise AteapiError(
                grpc.StatusCode.FAILED_PRECONDITION,
                "actor template not found",
            )
        return template

    def spec(self, record: ActorRecord, template: TemplateRecord) -> ActorSpec:
        """What the runtime runs for ``record``; ValueError when the template's images are not
        on this machine or a template on the host's `/` is no longer allowed."""
        spec = self.templates.spec(template)
        if spec.rootfs.kind == "host" and not self.allow_host_rootfs:
            raise ValueError(HOST_ROOTFS_REFUSED.format(template=template.meta.key))
        return ActorSpec(record.atespace, record.name, spec)

    async def release_connections(self, handle: str) -> None:
        for listener in self.sandbox_listeners:
            try:
                await listener(handle)
            except Exception:
                log.exception("a sandbox listener failed for %s", handle)

    async def stop_sandbox(self, handle: str) -> None:
        if handle:
            await self.release_connections(handle)
            with contextlib.suppress(RuntimeFailure):
                await self.runtime.stop(handle)

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
        await self.revert.crash_dead_sandbox(record)
        return True

    async def wait_idle(self, key: str, timeout_s: float) -> bool:
        """Wait until the operation holding actor ``key``'s lease ends; True if one was."""
        return await self.locks.wait_idle(key, timeout_s)
