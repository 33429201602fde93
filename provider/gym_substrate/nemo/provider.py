"""`SubstrateProvider`: NeMo Gym's `SandboxProvider` backed by Agent Substrate actors.

This module is the Gym-facing protocol only, with its optional capabilities (pause/resume,
connect, endpoint, PTY sessions, background services); each method checks its arguments and
delegates to `_managed.ManagedActor` (one per sandbox: resume, park, the idle policy, recovery
after a router 503, delete), `_create` (spec checks; the actor id is chosen here and reused on
every retry, and any failure after CreateActor deletes the actor), `_exec` (commands as agent jobs
with client-chosen ids, so a command never runs twice), `_transfer` (chunked, sha256-checked
files) and `_pty` (terminals over the agent's `/v1/pty`). The Compose-era capabilities Substrate
cannot honour come from `_capabilities.ComposeCapabilities`, which answers them with the reason.
Clients come from `_shared` (one channel and HTTP pool per event loop) or from the constructor's
`control` and `http` arguments (in-memory fakes in tests).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import uuid
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.core.names import TARGET_ACTOR_HEADER
from gym_substrate.core.states import PARKED_STATES
from gym_substrate.nemo import _capabilities, _create, _exec, _shared, _transfer
from gym_substrate.nemo._actor import (
    DELETED,
    Descriptor,
    SubstrateActor,
    gym_status,
)
from gym_substrate.nemo._exec import SANDBOX_RUNTIME_RETURN_CODE
from gym_substrate.nemo._forks import SnapshotMethods
from gym_substrate.nemo._managed import ActorServices, ManagedActor
from gym_substrate.nemo._metrics import METRICS, serve_metrics
from gym_substrate.nemo._pty import SubstratePtySession
from gym_substrate.nemo._pty_methods import PtyMethods
from gym_substrate.nemo._retry import (
    REAL_PACE,
    RECONNECT_RETRY,
    Pacer,
    RetryPolicy,
    through_reconnect,
)
from gym_substrate.nemo.agent_client import HttpTransport
from gym_substrate.nemo.config import (
    ConnectionConfig,
    CreateConfig,
    ExecConfig,
    LifecycleConfig,
    MetricsConfig,
    PauseMode,
    coerce_section,
)
from gym_substrate.nemo.control_client import ControlAPI, actor_state, template_of, worker_address
from gym_substrate.nemo.errors import (
    ActorNotFoundError,
    CloseError,
    ConfigError,
    ControlPlaneError,
    ProviderClosedError,
    SubstrateCreateError,
    SubstrateError,
)
from gym_substrate.nemo.ledger import Ledger, LedgerRecorder
from gym_substrate.nemo.snapshot import SandboxSnapshot
from gym_substrate.nemo.types import (
    SandboxEndpoint,
    SandboxExecResult,
    SandboxHandle,
    SandboxSpec,
    SandboxStatus,
)

__all__ = ["SANDBOX_RUNTIME_RETURN_CODE", "SubstrateActor", "SubstrateProvider"]

log = logging.getLogger("gym_substrate.provider")

T = TypeVar("T")


class SubstrateProvider(SnapshotMethods, PtyMethods, _capabilities.ComposeCapabilities):
    """NeMo Gym sandbox provider `substrate` (entry point `nemo_gym.sandbox_providers`).

    Keywords are the sub-keys of the YAML `substrate:` block: `connection`, `create`, `exec`,
    `lifecycle`, `pause_mode` and `metrics`. Construction validates them (reading the files they
    name, such as a CA bundle) and opens no connection. `control` and `http` replace the real
    ateapi client and HTTP transport, e.g. with in-memory fakes; by default both are made on
    first use and shared by every provider on the same event loop and connection. `pacer` is
    the clock and sleep its retries and capacity waits run on (`_retry.Pacer`; by default the
    event loop's), e.g. a fake pair that counts backoffs without waiting them out.
    """

    name: ClassVar[str] = "substrate"

    def __init__(
        self,
        *,
        connection: ConnectionConfig | Mapping[str, Any] | None = None,
        create: CreateConfig | Mapping[str, Any] | None = None,
        exec: ExecConfig | Mapping[str, Any] | None = None,  # noqa: A002 - the YAML key
        lifecycle: LifecycleConfig | Mapping[str, Any] | None = None,
        pause_mode: PauseMode = "pause",
        metrics: MetricsConfig | Mapping[str, Any] | None = None,
        control: ControlAPI | None = None,
        http: HttpTransport | None = None,
        pacer: Pacer | None = None,
        **unknown: Any,
    ) -> None:
        if unknown:
            raise ConfigError(
                f"unknown key(s) {', '.join(sorted(unknown))} in the substrate block; allowed "
                "keys: connection, create, exec, lifecycle, pause_mode, metrics"
            )
        if connection is None:
            raise ConfigError(
                "connection: required (api: host:port of ateapi, router: URL of the router)"
            )
        self.connection = coerce_section(ConnectionConfig, connection, "connection")
        self.create_config = coerce_section(CreateConfig, create, "create")
        self.exec_config = coerce_section(ExecConfig, exec, "exec")
        self.lifecycle = coerce_section(LifecycleConfig, lifecycle, "lifecycle")
        self.metrics_config = coerce_section(MetricsConfig, metrics, "metrics")
        if pause_mode not in ("pause", "suspend"):
            raise ConfigError(f"pause_mode: must be one of pause, suspend; got {pause_mode!r}")
        self.pause_mode: PauseMode = pause_mode
        retry = self.create_config.retry
        # the clock and sleep of every retry and capacity wait (a test injects a fake pair)
        self._retry = RetryPolicy(
            retry.initial, retry.maximum, retry.multiplier, retry.deadline, pacer or REAL_PACE
        )
        ledger = Ledger(self.lifecycle.ledger) if self.lifecycle.ledger else None
        self._record = LedgerRecorder(ledger, self.connection.api)
        self._injected = (control, http)
        self._files = _transfer.FileMover(self.exec_config.transfer_chunk_bytes, self._run_in)
        self._lease = _shared.Lease(self._open, idle=lambda: not self._actors)
        self._services: ActorServices | None = None
        self._actors: dict[tuple[str, str], ManagedActor] = {}
        # PTY sessions by sandbox, so that pause() can detach them.
        self._ptys: dict[tuple[str, str], weakref.WeakSet[SubstratePtySession]] = {}
        self._init_snapshots()
        self._closed = False

    def __repr__(self) -> str:
        return (
            f"SubstrateProvider(api={self.connection.api!r}, "
            f"router={self.connection.router!r}, atespace={self.connection.atespace!r})"
        )

    # ------------------------------------------------------------------ plumbing

    async def __aenter__(self) -> SubstrateProvider:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def _resources(self) -> _shared.SharedResources:
        if self._closed:
            raise ProviderClosedError("this SubstrateProvider was closed with aclose()")
        return self._lease.get()

    def _open(self) -> _shared.SharedResources:
        if self.metrics_config.port is not None:
            serve_metrics(self.metrics_config.host, self.metrics_config.port)
        control, http = self._injected
        concurrency = self.exec_config.concurrency
        if control is None and http is None:
            return _shared.acquire(self.connection, concurrency)
        return _shared.private(self.connection, concurrency, control=control, transport=http)

    @property
    def control(self) -> ControlAPI:
        """The control-plane client for the running event loop."""
        return self._resources().control

    def _shared_services(self) -> ActorServices:
        res = self._resources()
        if self._services is None or self._services.control is not res.control:
            self._services = ActorServices(
                control=res.control,
                transport=res.transport,
                router=self.connection.router,
                retry=self._retry,
                ready_timeout_s=self.create_config.ready_timeout_s,
                close_timeout_s=self.lifecycle.close_timeout_s,
                idle_policy=self.lifecycle.idle_policy,
                idle_after_s=self.lifecycle.idle_after_s,
                record=self._record,
                on_crash=self.lifecycle.on_crash,
            )
        return self._services

    @staticmethod
    def _actor(handle: SandboxHandle) -> SubstrateActor:
        actor = handle.raw
        if not isinstance(actor, SubstrateActor):
            raise TypeError(
                f"handle {handle.sandbox_id!r} was not made by the substrate provider "
                f"(raw is {type(actor).__name__})"
            )
        return actor

    def _managed(self, handle: SandboxHandle) -> ManagedActor:
        """The sandbox behind `handle`: the one lookup every call makes."""
        actor = self._actor(handle)
        if actor.status == DELETED:
            raise SubstrateError(f"sandbox {actor.actor_id} was closed")
        key = (actor.atespace, actor.actor_id)
        managed = self._actors.get(key)
        if managed is None:  # a handle made by another provider instance
            managed = ManagedActor(
                actor, self._shared_services(), parked=actor.status in PARKED_STATES
            )
            self._actors[key] = managed
        managed.attach(handle)
        return managed

    def _forget(self, managed: ManagedActor) -> None:
        # A provider serving a whole training run would otherwise keep one entry per sandbox.
        self._actors.pop((managed.actor.atespace, managed.actor.actor_id), None)
        self._ptys.pop((managed.actor.atespace, managed.actor.actor_id), None)

    # ------------------------------------------------------------------ create

    @_shared.holding
    async def create(
        self, spec: SandboxSpec, *, snapshot: SandboxSnapshot | str | None = None
    ) -> SandboxHandle:
        """Create an actor, resume it onto a worker, wait for its agent, record workdir and env.

        All within the ready timeout (no free capacity is waited out until then). `spec.files`
        are left to the caller (Gym's facade uploads them after `create()`). A June-era server
        is refused with `UnsupportedServerError` before anything is made.

        With `snapshot` (or `provider_options` `snapshot_id`, Gym's key, or `from_snapshot`:
        an id `snapshot()` returned) the sandbox starts from that snapshot: its files,
        processes and memory, and the workdir and env of the sandbox it was taken from
        (`spec.workdir`/`spec.env` are applied on top). `spec.image` may be None then.
        """
        started = time.monotonic()
        options = _create.validate_spec(spec)
        wanted = _create.snapshot_wanted(spec, snapshot)
        atespace = options.atespace or self.connection.atespace
        ready_timeout = float(spec.ready_timeout_s or self.create_config.ready_timeout_s)
        deadline = self._retry.pacer.clock() + ready_timeout  # the retries' clock
        res = self._resources()  # fail fast (ProviderClosedError) before anything is allocated
        try:
            origin = None if wanted is None else await self._snapshot_source(wanted, atespace)
            template = await _create.check_target(
                res,
                spec,
                options,
                self.create_config,
                snapshot_template=origin.template if origin else "",
                atespace=atespace,
                policy=self._retry,
                deadline=deadline,
            )
        except (SubstrateCreateError, ConfigError):
            METRICS.failures.labels("create").inc()
            raise
        defaults, workdir, env = _create.defaults_for(spec, origin)
        actor = SubstrateActor(
            actor_id=f"gym-{uuid.uuid4().hex}",
            atespace=atespace,
            template=template,
            workdir=workdir,
            env=env,
            snapshot=origin.ref if origin else None,
        )
        managed = ManagedActor(actor, self._shared_services())
        handle = SandboxHandle(sandbox_id=actor.actor_id, provider_name=self.name, raw=actor)
        managed.attach(handle)
        await self._record_created(actor, spec)
        self._actors[(atespace, actor.actor_id)] = managed
        try:
            await _create.prepare(
                managed,
                res.control,
                self._retry,
                deadline=deadline,
                ready_timeout_s=ready_timeout,
                shell=self.exec_config.shell,
                defaults=defaults,
                base=(origin.workdir, origin.env) if origin and origin.env is not None else None,
            )
        except BaseException as exc:
            await self._abandon(managed)
            if isinstance(exc, (SubstrateError, OSError)) and not isinstance(
                exc, (SubstrateCreateError, ConfigError)
            ):
                raise SubstrateCreateError(
                    f"could not prepare actor {actor.actor_id}: {exc}"
                ) from exc
            raise
        if origin is not None and defaults == "keep" and origin.env is None:
            managed.defaults_known = False  # the sandbox's own record says (read on first use)
        managed.mark_created()
        managed.schedule_idle()  # the model may think before its first command, too
        METRICS.creates.inc()
        METRICS.create_latency.observe(time.monotonic() - started)
        return handle

    async def _record_created(self, actor: SubstrateActor, spec: SandboxSpec) -> None:
        """The ledger's `created`, before CreateActor: a reply lost on the way back still leaves
        an entry that `sweep` can act on, even if this process dies right after."""
        await self._record(
            "created",
            actor,
            ttl_s=spec.ttl_s if spec.ttl_s is not None else self.lifecycle.ttl_s,
            template=actor.template,
            metadata=dict(spec.metadata or {}),
            **({"snapshot": actor.snapshot} if actor.snapshot else {}),
        )

    async def _abandon(self, managed: ManagedActor) -> None:
        """A create that failed after CreateActor: its actor goes, whatever stopped it."""
        METRICS.failures.labels("create").inc()
        with contextlib.suppress(BaseException):
            await asyncio.shield(managed.discard())
        self._forget(managed)

    # ------------------------------------------------------------------ exec

    @_shared.holding
    async def exec(
        self,
        handle: SandboxHandle,
        command: str,
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_s: int | float | None = None,
        user: str | int | None = None,
    ) -> SandboxExecResult:
        """Run `command` with `exec.shell -c`; never raises for the command's own failure.

        A relative `cwd` is taken from the sandbox's workdir (else `/`); `timeout_s <= 0` is a
        timeout result without running anything, as in Gym's local provider.
        """
        return await self._run(handle, command, cwd=cwd, env=env, timeout_s=timeout_s, user=user)

    @_shared.holding
    async def exec_with_background_services(
        self,
        handle: SandboxHandle,
        command: str,
        *,
        cwd: str | None = None,
        timeout_s: int | float | None = None,
    ) -> SandboxExecResult:
        """As `exec()`, for a command that starts services later commands need (Gym's
        `exec(preserve_background_services=True)`).

        The result comes when the command exits; the services it leaves running keep going,
        even while they still write to the stdout or stderr they inherited (the agent drains
        those pipes), until they exit, the sandbox is closed, or the command times out (its
        whole process group is killed then). They survive pause and resume.
        """
        return await self._run(
            handle, command, cwd=cwd, env=None, timeout_s=timeout_s, user=None, services=True
        )

    async def _run(
        self,
        handle: SandboxHandle,
        command: str,
        *,
        cwd: str | None,
        env: dict[str, str] | None,
        timeout_s: int | float | None,
        user: str | int | None,
        services: bool = False,
    ) -> SandboxExecResult:
        self._actor(handle)
        timeout = float(self.exec_config.default_timeout_s if timeout_s is None else timeout_s)
        if math.isnan(timeout):
            raise ValueError(f"timeout_s must be a number of seconds, got {timeout_s!r}")
        if timeout <= 0:
            METRICS.failures.labels("exec_timeout").inc()
            return _exec.timed_out_before_start(timeout)
        started = time.monotonic()
        METRICS.execs.inc()
        try:
            managed = self._managed(handle)
            async with self._resources().exec_slots, managed.active():
                actor = await self._with_defaults(managed)
                job = _exec.build_job(
                    command,
                    shell=self.exec_config.shell,
                    cwd=_exec.resolve_path(cwd, actor.workdir) if cwd else actor.workdir,
                    env={**actor.env, **(env or {})},
                    timeout_s=timeout,
                    user=user,
                    max_output_bytes=self.exec_config.max_output_bytes,
                    background_services=services,
                )
                # The timeout is the command's: time queued for a slot or spent resuming a parked
                # actor must not use it up before the command was even submitted.
                deadline = time.monotonic() + timeout + self.exec_config.timeout_margin_s
                result = await _exec.run_job(
                    managed, job, deadline=deadline, poll_wait_s=self.exec_config.poll_wait_s
                )
        except ProviderClosedError:
            raise
        except (SubstrateError, OSError) as exc:
            result = _exec.sandbox_failure(f"sandbox failure before the command ran: {exc}")
        else:
            result = _exec.with_notice(result, managed.take_notice())
        METRICS.exec_latency.observe(time.monotonic() - started)
        if result.error_type is not None:
            METRICS.failures.labels(f"exec_{result.error_type}").inc()
        return result

    async def _with_defaults(self, managed: ManagedActor) -> SubstrateActor:
        """The actor with its workdir and env, read from the sandbox once after `connect()`."""
        if not managed.defaults_known:
            workdir, env = await _exec.load_defaults(managed, shell=self.exec_config.shell)
            managed.remember_defaults(workdir, env)
        return managed.actor

    # ------------------------------------------------------------------ files

    @_shared.holding
    async def upload_file(self, handle: SandboxHandle, source_path: Path, target_path: str) -> None:
        """Stream a local file into the sandbox in chunks; sha256-verified, atomic on the agent."""
        managed = self._managed(handle)
        target = str(target_path)
        if not target.startswith("/"):  # as Gym's local provider: under the sandbox's workdir
            async with managed.active():
                target = _exec.resolve_path(target, (await self._with_defaults(managed)).workdir)
        source = Path(source_path)
        mode = (await asyncio.to_thread(source.stat)).st_mode & 0o777
        fh = await asyncio.to_thread(source.open, "rb")
        try:
            await self._files.upload(managed, _transfer.FileSource(fh), target, mode)
        finally:
            await asyncio.to_thread(fh.close)

    @_shared.holding
    async def download_file(
        self, handle: SandboxHandle, source_path: str, target_path: Path
    ) -> None:
        """Fetch a sandbox file in ranged chunks into a temp file, then rename it into place."""
        managed = self._managed(handle)
        if not source_path.startswith("/"):  # as Gym's local provider: under the workdir
            async with managed.active():
                workdir = (await self._with_defaults(managed)).workdir
            source_path = _exec.resolve_path(source_path, workdir)
        await self._files.download(managed, source_path, Path(target_path))

    async def _run_in(self, managed: ManagedActor, command: str) -> SandboxExecResult:
        handle = SandboxHandle(managed.actor.actor_id, self.name, managed.actor)
        return await self.exec(handle, command, timeout_s=120)

    # ------------------------------------------------------------------ status / pause / resume

    @_shared.holding
    async def status(self, handle: SandboxHandle) -> SandboxStatus:
        """Control-plane status from GetActor only: asking never wakes a parked actor.

        CRASHED is ERROR (`_actor.gym_status` has the whole mapping), and so is an actor still
        RUNNING where an exec of this provider found its workload dead. PAUSED means parked, by
        `pause()` or by the idle policy at any idle moment: the next call resumes it and its
        state moves on, so it is never a checkpoint (`snapshot()` is; see
        `snapshot_capabilities().paused_means`).
        """
        actor = self._actor(handle)
        try:
            got = await self._get_actor(actor.atespace, actor.actor_id)
        except ActorNotFoundError:
            return SandboxStatus.STOPPED
        except ControlPlaneError as exc:
            log.info("status of %s unknown: %s", actor.actor_id, exc)
            return SandboxStatus.UNKNOWN
        managed = self._actors.get((actor.atespace, actor.actor_id))
        seen = (worker_address(got), got.metadata.version)
        if managed is not None and managed.lost_workload == seen:
            return SandboxStatus.ERROR  # RUNNING on paper, but its workload died (exec saw it)
        return gym_status(actor_state(got))

    async def _get_actor(self, atespace: str, name: str) -> pb.Actor:
        """GetActor through UNAVAILABLE (a control plane restarting) for up to
        `connection.connect_timeout_s`: the channel reconnects within about a second."""
        control, policy = self.control, RECONNECT_RETRY.paced(self._retry.pacer)
        return await through_reconnect(
            lambda: control.get_actor(atespace, name),
            policy.with_deadline(self.connection.connect_timeout_s),
            what=f"GetActor {atespace}/{name}",
        )

    @_shared.holding
    async def pause(self, handle: SandboxHandle) -> None:
        """Park the actor (PauseActor or SuspendActor per `pause_mode`), freeing its worker.

        Open PTY sessions of the sandbox are detached first (Gym's `AsyncSandbox.pause()`
        contract); after `resume()` they are reattached with `reattach()` or `attach_pty()`.
        """
        managed = self._managed(handle)
        for session in list(self._ptys.get(self._key(managed), ())):
            session.detach()
        await managed.park(self.pause_mode)

    @_shared.holding
    async def resume(self, handle: SandboxHandle) -> None:
        """ResumeActor, wait for the agent, and refresh `handle.raw` in place."""
        await self._managed(handle).resume()

    # ------------------------------------------------------------------ PTY sessions

    @staticmethod
    def _key(managed: ManagedActor) -> tuple[str, str]:
        return (managed.actor.atespace, managed.actor.actor_id)

    async def _check_in_sandbox(self, handle: SandboxHandle, script: str) -> SandboxExecResult:
        return await self.exec(handle, script, timeout_s=60)

    # ------------------------------------------------------------------ connect / endpoint

    @_shared.holding
    async def serialize_handle(
        self, handle: SandboxHandle, *, scope: str | None = None
    ) -> dict[str, Any]:
        """A JSON descriptor `connect()` rebuilds the handle from (`scope` is ignored)."""
        del scope
        return Descriptor.of(self._managed(handle).actor)

    @_shared.holding
    async def connect(self, descriptor: Mapping[str, Any]) -> SandboxHandle:
        """Rebuild a handle from `serialize_handle()` output; checks the actor exists."""
        wanted = Descriptor.parse(descriptor, self.connection.atespace)
        got = await self._get_actor(wanted.atespace, wanted.sandbox_id)
        actor = SubstrateActor(
            actor_id=got.metadata.name or wanted.sandbox_id,
            atespace=wanted.atespace,
            template=template_of(got),
            workdir=wanted.workdir,
            env=wanted.env,
            status=actor_state(got),
            pod_ip=worker_address(got),
        )
        handle = SandboxHandle(sandbox_id=actor.actor_id, provider_name=self.name, raw=actor)
        managed = self._actors.pop((actor.atespace, actor.actor_id), None)
        if managed is not None:  # connected again: forget what we believed, take the fresh view
            managed.cancel_idle()
        managed = self._managed(handle)
        # Gym's sandboxed agents reattach by id alone: then the sandbox's own record says.
        managed.defaults_known = "workdir" in descriptor or "env" in descriptor
        return handle

    @_shared.holding
    async def endpoint(self, handle: SandboxHandle, port: int) -> SandboxEndpoint:
        """Port 80 of the sandbox: the router URL plus the `ate-target-actor` header."""
        actor = self._managed(handle).actor
        if port != 80:
            raise ValueError(
                f"port {port} is not reachable: the Substrate router forwards only "
                "to port 80 inside an actor"
            )
        return SandboxEndpoint(
            endpoint=self.connection.router + "/", headers={TARGET_ACTOR_HEADER: actor.target}
        )

    # ------------------------------------------------------------------ close

    @_shared.holding
    async def close(self, handle: SandboxHandle) -> None:
        """DeleteActor with `any_state` (no suspend first). Idempotent; NOT_FOUND is done."""
        if self._actor(handle).status == DELETED:
            return
        managed = self._managed(handle)
        try:
            await managed.close()
        except SubstrateError as exc:
            raise CloseError(f"could not delete actor {managed.actor.actor_id}: {exc}") from exc
        self._forget(managed)
        await self._after_close(managed.actor)

    async def delete_actor(self, actor_id: str, atespace: str | None = None) -> None:
        """Delete an actor by id (one a crashed trainer left, say) the way `close()` does."""
        actor = SubstrateActor(actor_id, atespace or self.connection.atespace, template="")
        await self.close(SandboxHandle(sandbox_id=actor_id, provider_name=self.name, raw=actor))

    async def aclose(self) -> None:
        """Release this provider's share of the channel and HTTP pool. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for managed in self._actors.values():
            managed.cancel_idle()
        await self._lease.release()
