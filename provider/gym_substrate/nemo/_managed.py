"""One object per sandbox: where its actor is, whether it is parked, and how to get it back.

`ManagedActor` is the only place that resumes, parks, recovers, reverts or deletes an actor, and
the one place that notices a CRASHED actor and applies `lifecycle.on_crash`, so the lock,
the in-flight count, the idle timer and the provider's gauges change together. Its lifecycle is
one value (`Lifecycle`), and every transition goes through `_enter`, which keeps the `parked` and
`running` gauges equal to the number of sandboxes in each state, whatever order calls arrive in.

The current `SubstrateActor` is published to every handle attached to the sandbox, so a caller
holding a handle sees a consistent value (it is replaced, never mutated, on resume and park).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, TypeVar

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.nemo._actor import DELETED, SubstrateActor
from gym_substrate.nemo._actor_services import (
    ActorServices,
    Lifecycle,
    ResumeFailedError,
    WorkloadLostError,
    is_code,
    may_be_crashed,
    teardown_may_retry,
)
from gym_substrate.nemo._capacity import queue_for, wait_in_line
from gym_substrate.nemo._connhints import not_an_agent
from gym_substrate.nemo._metrics import METRICS
from gym_substrate.nemo._retry import (
    HTTP_RETRY,
    RetryPolicy,
    is_lost_worker,
    is_resumable,
    is_router_glitch,
    is_transient_control,
    retry_target,
)
from gym_substrate.nemo.agent_client import AgentClient
from gym_substrate.nemo.config import PauseMode
from gym_substrate.nemo.control_client import (
    Resumed,
    actor_state,
    crash_message,
    worker_address,
)
from gym_substrate.nemo.errors import (
    ActorCrashedError,
    ActorNotFoundError,
    AgentProtocolError,
    ConnectionConfigError,
    ControlPlaneError,
    SnapshotBusyError,
    SubstrateError,
)
from gym_substrate.nemo.types import SandboxHandle

__all__ = [
    "ActorServices",
    "Lifecycle",
    "ManagedActor",
    "ResumeFailedError",
    "WorkloadLostError",
]

log = logging.getLogger("gym_substrate.provider")

T = TypeVar("T")


# How long a router 503 may last after a ResumeActor that found the actor already RUNNING
# (`resumed` false): nothing moved, so the workload is dead (a RUNNING actor whose workload
# died stays RUNNING, and its router answers 503 until the worker pod goes).
_DEAD_WORKLOAD_GRACE_S = 2.0


class ManagedActor:
    """A sandbox's actor and everything this process does to it."""

    def __init__(
        self,
        actor: SubstrateActor,
        services: ActorServices,
        *,
        parked: bool = False,
        counted: bool = False,
    ) -> None:
        self.actor = actor
        self.services = services
        self.lock = asyncio.Lock()
        self.inflight = 0
        self.counted = False  # created by this process: in the `running` gauge until closed
        self._idle_task: asyncio.Task[None] | None = None
        self._handles: list[weakref.ref[SandboxHandle]] = []
        self._state = Lifecycle.ACTIVE
        # (worker address, metadata.version) where this process found the workload dead (it is
        # RUNNING on paper); status() says ERROR while the actor is still there
        self.lost_workload: tuple[str, int] | None = None
        self.crash: str | None = None  # the crash message while the actor is known CRASHED
        self._notice: str | None = None  # said in the next exec result after a revert
        self.reverts = 0  # RevertActor calls made here: a job lost to one is told apart
        self.defaults_known = True  # False after connect() by id alone: read them from the sandbox
        if counted:
            self.mark_created()
        if parked:
            self._enter(Lifecycle.PARKED)

    def __repr__(self) -> str:
        return f"ManagedActor({self.actor.atespace}/{self.actor.actor_id}, {self._state.value})"

    def mark_created(self) -> None:
        """Count this sandbox in the `running` gauge (made here, so ours to close)."""
        self.counted = True
        METRICS.running.inc()

    @property
    def state(self) -> Lifecycle:
        return self._state

    def _enter(self, new: Lifecycle) -> None:
        old, self._state = self._state, new
        if old is new:
            return
        if old is Lifecycle.PARKED:
            METRICS.parked.dec()
        if new is not Lifecycle.CRASHED:
            self.crash = None
        if new is Lifecycle.PARKED:
            METRICS.parked.inc()
        if new is Lifecycle.CLOSED and self.counted:
            METRICS.running.dec()

    def attach(self, handle: SandboxHandle) -> None:
        """Keep `handle.raw` current from now on (weakly: a dropped handle is forgotten)."""
        self._handles = [r for r in self._handles if r() is not None and r() is not handle]
        self._handles.append(weakref.ref(handle))
        handle.raw = self.actor

    def _publish(self, **changes: Any) -> None:
        self.actor = dataclasses.replace(self.actor, **changes)
        for ref in self._handles:
            handle = ref()
            if handle is not None:
                handle.raw = self.actor

    def remember_defaults(self, workdir: str | None, env: Mapping[str, str]) -> None:
        self._publish(workdir=workdir, env=dict(env))
        self.defaults_known = True

    def check_open(self) -> None:
        if self._state is Lifecycle.CLOSED:
            raise SubstrateError(f"sandbox {self.actor.actor_id} was closed")

    def take_notice(self) -> str | None:
        """What the next exec result must say about a revert (once), else None."""
        notice, self._notice = self._notice, None
        return notice

    # ------------------------------------------------------------------ being busy

    @contextlib.asynccontextmanager
    async def active(self) -> AsyncIterator[None]:
        """Mark the sandbox busy, resume it if parked, and re-arm the idle timer afterwards."""
        self.check_open()
        self.inflight += 1
        self.cancel_idle()
        try:
            # A held lock means a park may be under way: wait for it, then resume, rather than
            # racing a request into an actor that is being checkpointed.
            if self._state is not Lifecycle.ACTIVE or self.lock.locked():
                async with self.lock:
                    self.check_open()
                    if self._state is Lifecycle.CRASHED:
                        raise self._crashed_error(self.crash or "")
                    if self._state is Lifecycle.PARKED:
                        await self._resume_or_revert(self._ready_deadline())
            yield
        finally:
            self.inflight -= 1
            self.schedule_idle()

    def _ready_deadline(self) -> float:
        return self.services.retry.pacer.clock() + self.services.ready_timeout_s

    async def call_agent(
        self,
        request: Callable[[AgentClient], Awaitable[T]],
        *,
        what: str,
        deadline: float | None = None,
    ) -> T:
        """An idempotent agent request, retried through resets, router 5xx and lost workers.

        A 503 (the actor lost its worker) resumes it over gRPC before the request is sent
        again; a reset or gateway error asks GetActor whether the actor CRASHED (the router
        cannot resume a crashed actor, so requests to it fail or hang until our timeout), and
        a crash is `ActorCrashedError` or, with `on_crash: revert`, a revert before the request
        is sent again. Other errors, and the deadline running out (`RetryError`), are the
        caller's.
        """
        end = self._ready_deadline() if deadline is None else deadline

        async def on_error(exc: BaseException) -> None:
            if is_lost_worker(exc):
                log.info("%s: %s; resuming the actor", what, exc)
                try:
                    await self.recover(end)
                except ActorCrashedError:
                    raise
                except SubstrateError as rexc:
                    raise ResumeFailedError(f"{what}: {rexc}") from rexc
            else:
                await self._look_for_crash(end)

        return await retry_target(
            lambda: request(self.services.agent(self.actor)),
            lambda exc: is_router_glitch(exc) or is_lost_worker(exc),
            HTTP_RETRY.paced(self.services.retry.pacer).with_deadline(
                max(0.001, end - self.services.retry.pacer.clock())
            ),
            what=what,
            on_error=on_error,
        )

    # ------------------------------------------------------------------ resume

    async def _resume_and_wait(self, deadline: float, *, lost_worker: bool = False) -> None:
        """ResumeActor (waiting out RESOURCE_EXHAUSTED and transient codes) then `/readyz`.

        A refused resume of a CRASHED actor (or one that crashed on the way up) is
        `ActorCrashedError`. With ``lost_worker`` (the router said 503), a ResumeActor that
        found the actor already RUNNING moved nothing: a 503 that outlasts a short grace means
        the workload died, `WorkloadLostError`. Caller holds `self.lock`.
        """
        control, actor = self.services.control, self.actor
        started = time.monotonic()

        async def attempt() -> Resumed:
            try:
                return await control.resume_actor(actor.atespace, actor.actor_id)
            except ControlPlaneError as exc:
                if may_be_crashed(exc):  # refused: a CRASHED actor says so, else re-raise
                    await self._raise_if_crashed()
                raise

        answer = await wait_in_line(
            attempt,
            self.services.retry.with_deadline(
                max(0.001, deadline - self.services.retry.pacer.clock())
            ),
            queue_for(control, "ResumeActor"),
            call="ResumeActor",
            what=f"ResumeActor {actor.actor_id}",
            # FAILED_PRECONDITION that is not a crash: another transition is under way
            predicate=lambda exc: is_resumable(exc) or is_code(exc, "FAILED_PRECONDITION"),
            transient_s=self.services.retry.deadline,
            first=lost_worker,  # believed running: its resume may need no worker at all
        )
        resumed = answer.actor
        if actor_state(resumed) == "CRASHED":  # the wakeup probe gave up on the way up
            raise self._crashed_error(crash_message(resumed))
        agent = self.services.agent(actor)
        unmoved = lost_worker and not answer.resumed
        if unmoved:
            deadline = min(deadline, self.services.retry.pacer.clock() + _DEAD_WORKLOAD_GRACE_S)
        # Right after a resume the router may still answer 503 or reset: wait those out.
        try:
            ready = await retry_target(
                agent.readyz,
                lambda exc: is_router_glitch(exc) or is_lost_worker(exc),
                RetryPolicy(
                    initial=0.02,
                    maximum=0.5,
                    multiplier=2.0,
                    deadline=max(0.001, deadline - self.services.retry.pacer.clock()),
                    pacer=self.services.retry.pacer,
                ),
                what=f"GET /readyz on {actor.actor_id}",
            )
        except AgentProtocolError as exc:  # answered, but not as a sandbox agent does
            hint = not_an_agent(self.services.router)
            message = f"GET /readyz on {actor.actor_id}: {hint.text} ({exc})"
            raise ConnectionConfigError(message, key=hint.key) from exc
        except SubstrateError as exc:
            if not unmoved:
                raise
            address = worker_address(resumed)
            self.lost_workload = (address, resumed.metadata.version)
            raise WorkloadLostError(
                f"actor {actor.actor_id} is RUNNING at {address or 'its worker'} but its "
                f"workload does not answer (its router answers 503): the workload died, and "
                f"nothing restarts it; close() or pause() the sandbox ({exc})"
            ) from exc
        self.lost_workload = None
        self._publish(
            status=actor_state(resumed),
            pod_ip=worker_address(resumed),
            boot_id=ready.get("boot_id"),
        )
        self._enter(Lifecycle.ACTIVE)
        METRICS.resume_latency.observe(time.monotonic() - started)

    async def _resume_or_revert(self, deadline: float, *, lost_worker: bool = False) -> None:
        """Resume, applying `lifecycle.on_crash` to a crash. Caller holds `self.lock`."""
        try:
            await self._resume_and_wait(deadline, lost_worker=lost_worker)
        except ActorCrashedError as exc:
            await self._after_crash(exc, deadline)

    async def start(self, deadline: float) -> None:
        """The first resume after CreateActor (a crash here fails the create, never reverts)."""
        async with self.lock:
            await self._resume_and_wait(deadline)

    async def resume(self) -> None:
        """Resume now (an explicit `resume()` call), whatever this process believes."""
        async with self.lock:
            self.check_open()
            await self._resume_or_revert(self._ready_deadline())
        self.schedule_idle()

    async def recover(self, deadline: float) -> None:
        """The router said 503: the actor lost its worker. Resume it over gRPC with backoff."""
        async with self.lock:
            self.check_open()
            if self._state is Lifecycle.CRASHED:
                raise self._crashed_error(self.crash or "")
            await self._resume_or_revert(deadline, lost_worker=True)

    # ------------------------------------------------------------------ crash

    def _crashed_error(self, message: str) -> ActorCrashedError:
        return ActorCrashedError(
            f"sandbox {self.actor.actor_id} crashed: {message}; its processes and memory are "
            "gone. close() it, or set lifecycle.on_crash: revert to take it back to its last "
            "durable snapshot",
            crash_message=message,
        )

    async def _raise_if_crashed(self) -> None:
        """GetActor; `ActorCrashedError` when the actor is CRASHED."""
        got = await self.services.control.get_actor(self.actor.atespace, self.actor.actor_id)
        if actor_state(got) == "CRASHED":
            raise self._crashed_error(crash_message(got))

    async def _look_for_crash(self, deadline: float) -> None:
        """After a failed agent request: a CRASHED actor is handled now, not at the deadline."""
        try:
            await self._raise_if_crashed()
        except ActorCrashedError as exc:
            async with self.lock:
                self.check_open()
                try:  # another caller may have reverted it meanwhile
                    await self._raise_if_crashed()
                except ActorCrashedError as again:
                    await self._after_crash(again, deadline)
                else:
                    log.debug("%s: %s, handled by another call", self.actor.actor_id, exc)
        except ControlPlaneError as exc:  # the request's own retry decides; this was a look
            log.debug("could not look for a crash of %s: %s", self.actor.actor_id, exc)

    async def _after_crash(self, exc: ActorCrashedError, deadline: float) -> None:
        """`on_crash: fail`: remember and raise. `revert`: RevertActor, resume, and say so once
        in the next exec result. Caller holds `self.lock`."""
        actor = self.actor
        METRICS.crashes.labels(self.services.on_crash).inc()
        if self.services.on_crash == "fail":
            self._publish(status="CRASHED", pod_ip="")
            self._enter(Lifecycle.CRASHED)
            self.crash = exc.crash_message
            raise exc
        log.warning("sandbox %s crashed (%s); reverting it", actor.actor_id, exc.crash_message)
        control = self.services.control

        async def revert() -> pb.Actor:
            try:
                return await control.revert_actor(actor.atespace, actor.actor_id)
            except ControlPlaneError as rexc:
                if not is_code(rexc, "FAILED_PRECONDITION"):
                    raise
                got = await control.get_actor(actor.atespace, actor.actor_id)
                if actor_state(got) != "SUSPENDED":
                    raise
                return got  # another caller reverted it first

        reverted = await retry_target(
            revert,
            is_transient_control,
            self.services.retry.with_deadline(
                max(0.001, deadline - self.services.retry.pacer.clock())
            ),
            what=f"RevertActor {actor.actor_id}",
        )
        self._publish(status=actor_state(reverted), pod_ip="")
        self.reverts += 1
        self._notice = (
            f"[gym-substrate: sandbox {actor.actor_id} crashed ({exc.crash_message}) and was "
            "reverted to its last durable snapshot: files, processes and memory changed since "
            "then are gone]\n"
        )
        await self._resume_and_wait(deadline)  # a second crash right away is the caller's

    # ------------------------------------------------------------------ park

    async def _park(self, mode: PauseMode) -> pb.Actor:
        """PauseActor or SuspendActor through transient codes; a refusal from a CRASHED actor
        is `ActorCrashedError` (with `on_crash: fail` the sandbox is then known CRASHED)."""
        control, actor = self.services.control, self.actor

        async def attempt() -> pb.Actor:
            try:
                if mode == "pause":
                    return await control.pause_actor(actor.atespace, actor.actor_id)
                return await control.suspend_actor(actor.atespace, actor.actor_id)
            except ControlPlaneError as exc:
                if may_be_crashed(exc):
                    await self._raise_if_crashed()
                raise

        try:
            parked = await retry_target(
                attempt,
                is_transient_control,
                self.services.retry,
                what=f"{mode.capitalize()}Actor {actor.actor_id}",
            )
        except ActorCrashedError as exc:
            if self.services.on_crash == "fail":  # with revert, the next call reverts it
                self._publish(status="CRASHED", pod_ip="")
                self._enter(Lifecycle.CRASHED)
                self.crash = exc.crash_message
            raise
        self.lost_workload = None
        self._publish(status=actor_state(parked), pod_ip="")
        self._enter(Lifecycle.PARKED)
        queue_for(control, "ResumeActor").freed()  # a worker is free: the line asks now
        return parked

    async def park(self, mode: PauseMode) -> None:
        """Pause or suspend now (an explicit `pause()` call), freeing the worker."""
        self.cancel_idle()
        async with self.lock:
            self.check_open()
            if self._state is not Lifecycle.PARKED:
                await self._park(mode)

    @contextlib.asynccontextmanager
    async def suspended(self, before: Callable[[], None] | None = None) -> AsyncIterator[pb.Actor]:
        """Suspend the actor (a paused one has its node-local snapshot uploaded, without waking)
        and keep it SUSPENDED while the block runs: calls that arrive meanwhile wait, then resume
        it as they would after an idle park.

        A call in flight (a command, a transfer, a PTY request) is `SnapshotBusyError`: nothing
        is suspended, so no snapshot can catch a command half-way. `before` runs once the
        sandbox is known to be idle, under the lock (the provider detaches PTY sessions there).
        """
        self.cancel_idle()
        async with self.lock:
            self.check_open()
            if self._state is Lifecycle.CRASHED:
                raise self._crashed_error(self.crash or "")
            if self.inflight:
                raise SnapshotBusyError(
                    f"sandbox {self.actor.actor_id} has {self.inflight} call(s) in flight "
                    "(commands, file transfers or PTY requests): a snapshot now would catch them "
                    "half-way. Wait for them to finish, then snapshot it"
                )
            if before is not None:
                before()
            parked = await self._park("suspend")
            yield parked

    def cancel_idle(self) -> None:
        if self._idle_task is not None:
            self._idle_task.cancel()
            self._idle_task = None

    def schedule_idle(self) -> None:
        """Park after `idle_after_s` without a call, as the idle policy says."""
        if (
            self.services.idle_policy == "never"
            or self.inflight
            or self._state is not Lifecycle.ACTIVE
        ):
            return
        self.cancel_idle()
        self._idle_task = asyncio.get_running_loop().create_task(self._idle_park())

    async def _idle_park(self) -> None:
        await asyncio.sleep(self.services.idle_after_s)
        mode: PauseMode = "pause" if self.services.idle_policy == "pause" else "suspend"
        async with self.lock:
            if self.inflight or self._state is not Lifecycle.ACTIVE:
                return
            self._idle_task = None
            try:
                await self._park(mode)
            except ActorCrashedError as exc:
                # the park lost the sandbox: never "keeps running" (issue 24); with on_crash:
                # fail the sandbox is CRASHED now, with revert the next call reverts it
                log.warning(
                    "idle park of %s crashed the sandbox (%s): %s",
                    self.actor.actor_id,
                    "reported as CRASHED"
                    if self.services.on_crash == "fail"
                    else "reverted at the next call",
                    exc.crash_message,
                )
                return
            except SubstrateError as exc:
                log.warning(
                    "idle park of %s failed (it keeps running): %s", self.actor.actor_id, exc
                )
                return
            log.debug("parked idle sandbox %s (%s)", self.actor.actor_id, mode)

    # ------------------------------------------------------------------ delete

    async def teardown(self) -> None:
        """DeleteActor with `any_state`: one call whatever state the actor is in.

        NOT_FOUND means someone else deleted it: done. The server may still be DELETING it
        when this returns; it will run nothing more.
        """
        control, actor = self.services.control, self.actor
        try:
            await retry_target(
                lambda: control.delete_actor(actor.atespace, actor.actor_id, any_state=True),
                teardown_may_retry,
                RetryPolicy(
                    initial=0.05,
                    maximum=0.5,
                    multiplier=2.0,
                    deadline=self.services.close_timeout_s,
                    pacer=self.services.retry.pacer,
                ),
                what=f"deleting actor {actor.actor_id}",
            )
        except ActorNotFoundError:
            pass
        queue_for(control, "ResumeActor").freed()  # its worker, if it had one, is free

    async def close(self) -> None:
        """Tear down and record it; idempotent. A failure leaves the sandbox open to retry."""
        self.cancel_idle()
        async with self.lock:
            if self._state is Lifecycle.CLOSED:
                return
            try:
                await self.teardown()
            except SubstrateError as exc:
                METRICS.failures.labels("close").inc()
                await self.services.record("close_failed", self.actor, error=str(exc))
                raise
            self._enter(Lifecycle.CLOSED)
            self._publish(status=DELETED, pod_ip="")
            await self.services.record("deleted", self.actor)

    async def discard(self) -> None:
        """Best-effort delete after a failed create: never raises, logs what may be leaked."""
        self.cancel_idle()
        try:
            await self.teardown()
        except Exception as exc:  # noqa: BLE001 - cleanup must not mask the create error
            log.warning(
                "actor %s may be leaked after a failed create: %s", self.actor.actor_id, exc
            )
            await self.services.record("close_failed", self.actor, error=str(exc))
        else:
            await self.services.record("deleted", self.actor)
        self._enter(Lifecycle.CLOSED)
        self._publish(status=DELETED, pod_ip="")
