"""`Shared`: what every part of the control plane works with, and nothing of the parts.

The parts (`atespaces`, `templates`, `golden`, `tags`, `actors`, `resume`, `parking`, `revert`,
`crashes`, `recovery`) each receive this and the few other parts they call, never the whole
`ControlPlane`: a part's collaborators are its constructor's arguments, and no part imports the
plane back (the layer test forbids the circle). It holds the state mirror and its store, the
worker pool, the leases, the sandbox runtime, the metrics, the clock, and the few steps several
workflows take: find an actor's template, build what the runtime runs, stop a sandbox, keep a
background step alive until the plane stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.local.control.locks import Workflows
from gym_substrate.local.control.records import ActorRecord, TemplateRecord
from gym_substrate.local.control.state import Clock, State
from gym_substrate.local.control.workers import WorkerPool
from gym_substrate.local.errors import AteapiError
from gym_substrate.local.images import ImageCatalogue
from gym_substrate.local.metrics import Metrics
from gym_substrate.local.runtimes.base import (
    ActorSpec,
    RuntimeFailure,
    SandboxRuntime,
    TemplateSpec,
)
from gym_substrate.local.templates import resolve, template_from_json, template_to_json

__all__ = ["HOST_ROOTFS_REFUSED", "Shared"]

log = logging.getLogger(__name__)

HOST_ROOTFS_REFUSED = (
    "template {template} runs on the host's own root filesystem (image local/host), which this "
    "backend refuses: a sandbox on it sees the host's files. The operator allows it with "
    "`gym-substrate local up --allow-host-rootfs` (or `--rootfs host`); otherwise use the "
    "Debian image (local/debian-bookworm) or one added with `gym-substrate local images add`"
)


class Shared:
    """The collaborators and steps the control plane's parts share (see the module docstring)."""

    def __init__(
        self,
        *,
        state: State,
        pool: WorkerPool,
        locks: Workflows,
        runtime: SandboxRuntime,
        metrics: Metrics,
        images: ImageCatalogue,
        state_dir: Path,
        clock: Clock,
        allow_host_rootfs: bool,
    ) -> None:
        self.state = state
        self.pool = pool
        self.locks = locks
        self.runtime = runtime
        self.metrics = metrics
        self.images = images
        self.state_dir = state_dir
        self.clock = clock
        # templates on the host's `/` (the image local/host): only with the operator's opt-in
        self.allow_host_rootfs = allow_host_rootfs
        # called with a sandbox handle before it is checkpointed or stopped, so the router can
        # drop its pooled connections into it (a checkpoint with open connections fails, and a
        # pooled connection into a restored sandbox hangs)
        self.sandbox_listeners: list[Callable[[str], Awaitable[None]]] = []
        self._tasks: set[asyncio.Task[object]] = set()

    # ---------------------------------------------------------------- templates
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

    def template_spec(self, record: TemplateRecord) -> TemplateSpec:
        """What the runtime runs; resolved now if its images were missing until now."""
        if record.runtime_spec:
            return template_from_json(record.runtime_spec)
        spec = resolve(pb.ActorTemplate.FromString(record.message), self.images)
        self.state.save(record, runtime_spec=template_to_json(spec))
        return spec

    def spec(self, record: ActorRecord, template: TemplateRecord) -> ActorSpec:
        """What the runtime runs for ``record``; ValueError when the template's images are not
        on this machine or a template on the host's `/` is no longer allowed."""
        spec = self.template_spec(template)
        if spec.rootfs.kind == "host" and not self.allow_host_rootfs:
            raise ValueError(HOST_ROOTFS_REFUSED.format(template=template.meta.key))
        return ActorSpec(record.atespace, record.name, spec)

    # ---------------------------------------------------------------- sandboxes
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

    # ---------------------------------------------------------------- background steps
    def track(self, task: asyncio.Task[object] | asyncio.Task[None]) -> None:
        """Keep a background step alive until it ends (and wait for it at stop)."""
        self._tasks.add(task)  # type: ignore[arg-type]
        task.add_done_callback(self._tasks.discard)  # type: ignore[arg-type]

    async def settle(self) -> None:
        """Wait for the background steps, those they start included."""
        while self._tasks:
            await asyncio.wait(list(self._tasks), timeout=15)
