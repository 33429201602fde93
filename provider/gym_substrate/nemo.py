"""`SubstrateProvider`: NeMo Gym's `SandboxProvider` backed by Agent Substrate actors.

Design choices, each a reaction to how Substrate and Gym behave:

* Control plane over gRPC, commands and files over HTTP through the router. The router cuts
  every request at 10 s, so commands run as agent *jobs*: submit with a client-chosen id, then
  long-poll. A lost response is recovered by resubmitting the *same* id, which the agent
  deduplicates, so a command never runs twice.
* Every agent request carries `X-Sandbox-Actor-Id`; a request that reaches another sandbox (an
  IP reused after a resume) is refused by the agent instead of running there.
* Creation is client-driven forward recovery: the actor id is chosen here and reused on every
  retry (ALREADY_EXISTS means an earlier attempt landed), ResumeActor is retried through
  "no free workers" until `ready_timeout_s`, and any failure after CreateActor tears the actor
  down before `SandboxCreateError` is raised.
* The idle policy parks an actor (PauseActor/SuspendActor) when no call arrived for
  `idle_after_s`, giving its worker to another rollout while the model thinks; the next call
  resumes it over gRPC first. Router 503 (the actor lost its worker) is handled the same way.
* Channels, HTTP pools and the exec semaphore are shared per event loop (`_shared`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import hashlib
import logging
import os
import shlex
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, ClassVar

from gym_substrate import _shared
from gym_substrate._agent_client import AgentClient
from gym_substrate._config import (
    ConnectionConfig,
    CreateConfig,
    ExecConfig,
    LifecycleConfig,
    MetricsConfig,
    PauseMode,
    ProviderOptions,
    coerce_section,
)
from gym_substrate._errors import (
    ActorNotFoundError,
    ActorUnavailableError,
    AgentError,
    AgentResponseError,
    AgentTransportError,
    AlreadyExistsError,
    CloseError,
    ConfigError,
    ControlPlaneError,
    NoFreeWorkersError,
    ProviderClosedError,
    RetryError,
    RouterError,
    SubstrateCreateError,
    SubstrateCreateVerificationError,
    SubstrateError,
    TransferError,
    TransientControlPlaneError,
)
from gym_substrate._grpc import ControlPlane, status_name
from gym_substrate._ledger import Ledger
from gym_substrate._metrics import METRICS, serve_metrics
from gym_substrate._names import actor_host
from gym_substrate._retry import RetryPolicy, retry_target
from gym_substrate.types import (
    HAS_PAUSED_STATUS,
    SandboxEndpoint,
    SandboxExecResult,
    SandboxHandle,
    SandboxSpec,
    SandboxStatus,
)

__all__ = ["SANDBOX_RUNTIME_RETURN_CODE", "SubstrateActor", "SubstrateProvider"]

log = logging.getLogger("gym_substrate.provider")

SANDBOX_RUNTIME_RETURN_CODE = 125
_PARKED_STATES = frozenset({"PAUSING", "PAUSED", "SUSPENDING", "SUSPENDED"})
_TRANSITIONAL = frozenset({"RESUMING", "PAUSING", "SUSPENDING"})
_AGENT_MAX_TIMEOUT_S = 1e8  # the sandbox agent's upper bound for an exec's timeout_s
_DELETED = "DELETED"  # `SubstrateActor.status` once `close()` deleted the actor
_DESCRIPTOR_KEYS = frozenset({"sandbox_id", "atespace", "template", "workdir", "env", "ports"})


@dataclass(frozen=True)
class SubstrateActor:
    """`SandboxHandle.raw` for this provider: where the actor is and how to run commands in it.

    Replaced (never mutated) on resume, so a caller holding the old value sees a consistent one.
    """

    actor_id: str
    atespace: str
    template: str
    workdir: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    status: str = "UNKNOWN"
    pod_ip: str = ""
    boot_id: str | None = None

    @property
    def host(self) -> str:
        """The router Host header for this actor."""
        return actor_host(self.actor_id, self.atespace)


@dataclass(eq=False)
class _State:
    """Per-sandbox runtime state kept by the provider (not serialisable, not in the handle)."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    inflight: int = 0
    parked: bool = False
    closed: bool = False
    counted: bool = False  # created here, so it is in the `running` gauge
    idle_task: asyncio.Task[None] | None = None


def _is_resumable_error(exc: BaseException) -> bool:
    return isinstance(exc, (TransientControlPlaneError, NoFreeWorkersError))


def _is_transient_cp(exc: BaseException) -> bool:
    return isinstance(exc, TransientControlPlaneError)


def _is_transient_http(exc: BaseException) -> bool:
    return isinstance(exc, AgentTransportError) or (
        isinstance(exc, RouterError) and exc.status in (502, 503, 504)
    )


class SubstrateProvider:
    """NeMo Gym sandbox provider `substrate` (entry point `nemo_gym.sandbox_providers`).

    Keywords are the sub-keys of the YAML `substrate:` block: `connection`, `create`, `exec`,
    `lifecycle`, `pause_mode` and `metrics`. Construction validates them and does no I/O.
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
        self._retry = RetryPolicy(
            initial=self.create_config.retry.initial,
            maximum=self.create_config.retry.maximum,
            multiplier=self.create_config.retry.multiplier,
            deadline=self.create_config.retry.deadline,
        )
        self._ledger = Ledger(self.lifecycle.ledger) if self.lifecycle.ledger else None
        self._res: _shared.SharedResources | None = None
        self._states: dict[tuple[str, str], _State] = {}
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
        if self._res is None:
            if self.metrics_config.port is not None:
                serve_metrics(self.metrics_config.host, self.metrics_config.port)
            self._res = _shared.acquire(self.connection, self.exec_config.concurrency)
        return self._res

    @property
    def control(self) -> ControlPlane:
        """The control-plane client (shared channel) for the running event loop."""
        return self._resources().control

    def _agent(self, actor: SubstrateActor) -> AgentClient:
        return AgentClient(
            self._resources().session, self.connection.router, actor.actor_id, actor.atespace
        )

    @staticmethod
    def _actor(handle: SandboxHandle) -> SubstrateActor:
        raw = handle.raw
        if not isinstance(raw, SubstrateActor):
            raise TypeError(
                f"handle {handle.sandbox_id!r} was not made by the substrate provider "
                f"(raw is {type(raw).__name__})"
            )
        return raw

    def _state(self, actor: SubstrateActor) -> _State:
        key = (actor.atespace, actor.actor_id)
        state = self._states.get(key)
        if state is None:
            state = self._states[key] = _State()
        return state

    async def _record(self, event: str, actor: SubstrateActor, **extra: Any) -> None:
        # Off the loop: the append takes an exclusive flock on a file that other trainers (and
        # a network file system) may share, which must not stall every other rollout.
        if self._ledger is not None:
            await asyncio.to_thread(
                self._ledger.append,
                event,
                api=self.connection.api,
                atespace=actor.atespace,
                actor_id=actor.actor_id,
                **extra,
            )

    # ------------------------------------------------------------------ create

    def _choose_template(self, spec: SandboxSpec, options: ProviderOptions) -> str:
        if options.template is not None:
            return options.template
        if spec.image is not None:
            template = self.create_config.image_templates.get(spec.image)
            if template is None:
                configured = ", ".join(sorted(self.create_config.image_templates)) or "(none)"
                raise SubstrateCreateError(
                    f"no ActorTemplate is mapped for image {spec.image!r}; configured images: "
                    f"{configured}. Add it under create.image_templates or pass "
                    "provider_options.template"
                )
            return template
        return self.create_config.template

    def _validate_spec(self, spec: SandboxSpec) -> ProviderOptions:
        try:
            options = ProviderOptions.from_mapping(spec.provider_options)
        except (TypeError, ValueError) as exc:
            raise SubstrateCreateError(str(exc)) from exc
        if spec.entrypoint is not None:
            raise SubstrateCreateError(
                "SandboxSpec.entrypoint is not supported: an actor runs its ActorTemplate's "
                "command (the sandbox agent); bake the entrypoint into the template instead"
            )
        ports = tuple(getattr(spec, "ports", ()) or ())
        if any(p != 80 for p in ports):
            raise SubstrateCreateError(
                f"SandboxSpec.ports {list(ports)} not supported: the Substrate router forwards "
                "only to port 80 inside an actor"
            )
        if spec.workdir is not None and not spec.workdir.startswith("/"):
            raise SubstrateCreateError(
                f"SandboxSpec.workdir must be absolute, got {spec.workdir!r}"
            )
        relative = [p for p in (spec.files or {}) if not str(p).startswith("/")]
        if relative:
            raise SubstrateCreateError(
                f"SandboxSpec.files paths must be absolute, got {relative}; "
                f"e.g. /work/{relative[0]}"
            )
        if spec.resources not in (None, type(spec.resources)()):
            log.warning(
                "SandboxSpec.resources is ignored: an actor gets its worker pool's resources"
            )
        return options

    async def create(self, spec: SandboxSpec) -> SandboxHandle:
        """Create an actor, resume it onto a worker, wait for its agent, upload `spec.files`."""
        started = time.monotonic()
        options = self._validate_spec(spec)
        template = self._choose_template(spec, options)
        atespace = options.atespace or self.connection.atespace
        ready_timeout = float(spec.ready_timeout_s or self.create_config.ready_timeout_s)
        actor = SubstrateActor(
            actor_id=f"gym-{uuid.uuid4().hex}",
            atespace=atespace,
            template=template,
            workdir=spec.workdir,
            env=dict(spec.env or {}),
        )
        handle = SandboxHandle(sandbox_id=actor.actor_id, provider_name=self.name, raw=actor)
        self._resources()  # fail fast (ProviderClosedError) before anything is allocated
        try:
            await self._ensure_atespace(atespace)
        except SubstrateError as exc:
            METRICS.failures.labels("create").inc()
            raise SubstrateCreateError(f"could not create atespace {atespace}: {exc}") from exc
        ttl = spec.ttl_s if spec.ttl_s is not None else self.lifecycle.ttl_s
        # Recorded before CreateActor: a reply lost on the way back still leaves a ledger entry
        # that `sweep` can act on, even if this process dies right after.
        await self._record(
            "created", actor, ttl_s=ttl, template=template, metadata=dict(spec.metadata or {})
        )
        try:
            try:
                await self._create_actor(actor, self._retry)
            except SubstrateCreateError:
                raise
            except SubstrateError as exc:
                raise SubstrateCreateError(
                    f"could not create actor {actor.actor_id}: {exc}"
                ) from exc
            try:
                await self._resume_and_wait(handle, deadline=time.monotonic() + ready_timeout)
            except (RetryError, AgentError) as exc:
                raise SubstrateCreateVerificationError(
                    f"actor {actor.actor_id} did not become ready within {ready_timeout:g} s: {exc}"
                ) from exc
            if spec.workdir:
                result = await self.exec(
                    handle, f"mkdir -p {shlex.quote(spec.workdir)}", cwd="/", timeout_s=30
                )
                if result.return_code != 0:
                    raise SubstrateCreateError(
                        f"could not create workdir {spec.workdir}: {result.stderr}"
                    )
            for target, text in (spec.files or {}).items():
                await self._upload_stream(handle, _BytesSource(text.encode()), target, 0o644)
        except BaseException as exc:
            METRICS.failures.labels("create").inc()
            with contextlib.suppress(BaseException):
                await asyncio.shield(self._cleanup_failed(handle))
            if isinstance(exc, SubstrateCreateError):
                raise
            if isinstance(exc, (SubstrateError, OSError)):
                raise SubstrateCreateError(
                    f"could not prepare actor {actor.actor_id}: {exc}"
                ) from exc
            raise
        self._state(actor).counted = True
        METRICS.creates.inc()
        METRICS.running.inc()
        METRICS.create_latency.observe(time.monotonic() - started)
        return handle

    async def _ensure_atespace(self, atespace: str) -> None:
        res = self._resources()
        if atespace in res.known_atespaces:
            return

        async def attempt() -> None:
            try:
                await res.control.create_atespace(atespace)
            except AlreadyExistsError:
                pass

        await retry_target(attempt, _is_transient_cp, self._retry, what="CreateAtespace")
        res.known_atespaces.add(atespace)

    async def _create_actor(self, actor: SubstrateActor, policy: RetryPolicy) -> None:
        control = self.control

        async def attempt() -> None:
            try:
                await control.create_actor(actor.atespace, actor.actor_id, actor.template)
            except AlreadyExistsError:
                existing = await control.get_actor(actor.atespace, actor.actor_id)
                found = f"{existing.actor_template_namespace}/{existing.actor_template_name}"
                if found != actor.template:
                    raise SubstrateCreateError(
                        f"actor id {actor.actor_id} already exists with template {found}"
                    ) from None

        await retry_target(attempt, _is_transient_cp, policy, what="CreateActor")

    async def _cleanup_failed(self, handle: SandboxHandle) -> None:
        actor = self._actor(handle)
        try:
            await self._teardown(actor)
        except Exception as exc:  # noqa: BLE001 - cleanup must not mask the create error
            log.warning("actor %s may be leaked after a failed create: %s", actor.actor_id, exc)
            await self._record("close_failed", actor, error=str(exc))
        else:
            await self._record("deleted", actor)
        self._states.pop((actor.atespace, actor.actor_id), None)

    # ------------------------------------------------------------------ resume / park

    async def _resume_and_wait(self, handle: SandboxHandle, *, deadline: float) -> None:
        """ResumeActor (retrying through no-free-workers) then `/readyz` through the router."""
        actor = self._actor(handle)
        control = self.control
        started = time.monotonic()
        policy = self._retry.with_deadline(max(0.001, deadline - time.monotonic()))
        resumed = await retry_target(
            lambda: control.resume_actor(actor.atespace, actor.actor_id),
            _is_resumable_error,
            policy,
            what=f"ResumeActor {actor.actor_id}",
        )
        agent = self._agent(actor)
        policy = self._retry.with_deadline(max(0.001, deadline - time.monotonic()))
        ready = await retry_target(
            agent.readyz,
            _is_transient_http,
            RetryPolicy(initial=0.02, maximum=0.5, multiplier=2.0, deadline=policy.deadline),
            what=f"GET /readyz on {actor.actor_id}",
        )
        handle.raw = dataclasses.replace(
            actor,
            status=status_name(resumed.status),
            pod_ip=resumed.ateom_pod_ip,
            boot_id=ready.get("boot_id"),
        )
        METRICS.resume_latency.observe(time.monotonic() - started)

    async def _ensure_active(self, handle: SandboxHandle, state: _State) -> None:
        # A held lock means a park may be under way: wait for it, then resume, rather than
        # racing a request into an actor that is being checkpointed.
        if not state.parked and not state.lock.locked():
            return
        async with state.lock:
            if state.parked:
                deadline = time.monotonic() + self.create_config.ready_timeout_s
                await self._resume_and_wait(handle, deadline=deadline)
                state.parked = False
                METRICS.parked.dec()

    async def _park(self, handle: SandboxHandle, mode: PauseMode) -> None:
        actor = self._actor(handle)
        control = self.control

        async def attempt() -> Any:
            if mode == "pause":
                return await control.pause_actor(actor.atespace, actor.actor_id)
            return await control.suspend_actor(actor.atespace, actor.actor_id)

        parked = await retry_target(
            attempt,
            _is_transient_cp,
            self._retry,
            what=f"{mode.capitalize()}Actor {actor.actor_id}",
        )
        handle.raw = dataclasses.replace(actor, status=status_name(parked.status), pod_ip="")

    def _schedule_idle(self, handle: SandboxHandle, state: _State) -> None:
        if self.lifecycle.idle_policy == "never" or state.inflight or state.closed:
            return
        if state.idle_task is not None:
            state.idle_task.cancel()
        state.idle_task = asyncio.get_running_loop().create_task(self._idle_park(handle, state))

    async def _idle_park(self, handle: SandboxHandle, state: _State) -> None:
        await asyncio.sleep(self.lifecycle.idle_after_s)
        mode: PauseMode = "pause" if self.lifecycle.idle_policy == "pause" else "suspend"
        async with state.lock:
            if state.inflight or state.parked or state.closed:
                return
            state.idle_task = None
            try:
                await self._park(handle, mode)
            except SubstrateError as exc:
                log.warning("idle park of %s failed (it keeps running): %s", handle.sandbox_id, exc)
                return
            state.parked = True
            METRICS.parked.inc()
            log.debug("parked idle sandbox %s (%s)", handle.sandbox_id, mode)

    @contextlib.asynccontextmanager
    async def _active(self, handle: SandboxHandle) -> AsyncIterator[SubstrateActor]:
        """Mark the sandbox busy, resume it if parked, and re-arm the idle timer afterwards."""
        actor = self._actor(handle)
        if actor.status == _DELETED:
            raise SubstrateError(f"sandbox {actor.actor_id} was closed")
        state = self._state(actor)
        if state.closed:
            raise SubstrateError(f"sandbox {actor.actor_id} was closed")
        state.inflight += 1
        if state.idle_task is not None:
            state.idle_task.cancel()
            state.idle_task = None
        try:
            await self._ensure_active(handle, state)
            yield self._actor(handle)
        finally:
            state.inflight -= 1
            self._schedule_idle(handle, state)

    async def _recover(self, handle: SandboxHandle, deadline: float) -> None:
        """The router said 503: the actor lost its worker. Resume it over gRPC with backoff."""
        state = self._state(self._actor(handle))
        async with state.lock:
            await self._resume_and_wait(handle, deadline=deadline)
            if state.parked:
                state.parked = False
                METRICS.parked.dec()

    # ------------------------------------------------------------------ exec

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
        """Run `command` with `exec.shell -c`; never raises for the command's own failure."""
        actor = self._actor(handle)
        timeout = float(self.exec_config.default_timeout_s if timeout_s is None else timeout_s)
        if not timeout > 0:  # NaN too
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        # The agent refuses timeouts above _AGENT_MAX_TIMEOUT_S (and JSON has no Infinity): a
        # longer one means "no practical limit", so it is capped rather than failing the call.
        timeout = min(timeout, _AGENT_MAX_TIMEOUT_S)
        workdir = cwd if cwd is not None else actor.workdir
        if workdir is not None and not workdir.startswith("/"):
            raise ValueError(f"cwd must be an absolute path, got {workdir!r}")
        job: dict[str, Any] = {
            "id": f"gx-{uuid.uuid4().hex}",
            # The agent refuses a blank command string (400); `sh -c ""` is a valid no-op, so
            # send that one as argv and keep its result a result, not a sandbox failure.
            "command": (
                [self.exec_config.shell, "-c", command]
                if isinstance(command, str) and not command.strip()
                else command
            ),
            "shell": self.exec_config.shell,
            "cwd": workdir,
            "env": {**actor.env, **(env or {})},
            "timeout_s": timeout,
            "user": user,
        }
        started = time.monotonic()
        METRICS.execs.inc()
        try:
            async with self._resources().exec_slots, self._active(handle):
                # The timeout is the command's: time queued for a slot or spent resuming a parked
                # actor must not use it up before the command was even submitted.
                result = await self._run_job(
                    handle, job, time.monotonic() + timeout + self.exec_config.timeout_margin_s
                )
        except ProviderClosedError:
            raise
        except (SubstrateError, OSError) as exc:
            result = _sandbox_failure(f"sandbox failure before the command ran: {exc}")
        METRICS.exec_latency.observe(time.monotonic() - started)
        if result.error_type is not None:
            METRICS.failures.labels(f"exec_{result.error_type}").inc()
        return result

    async def _run_job(
        self, handle: SandboxHandle, job: dict[str, Any], deadline: float
    ) -> SandboxExecResult:
        poll_wait = self.exec_config.poll_wait_s
        submitted = False
        backoff = 0.05
        last_error: Exception | None = None
        while True:
            agent = self._agent(self._actor(handle))
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return await self._timeout_result(agent, job, submitted, last_error)
            wait = min(poll_wait, max(0.0, remaining))
            try:
                if submitted:
                    state = await agent.poll(job["id"], wait)
                else:
                    state = await agent.submit(job, wait)
                    submitted = True
            except ActorUnavailableError as exc:
                last_error = exc
                log.info("exec %s: %s; resuming the actor and resubmitting", job["id"], exc)
                try:
                    await self._recover(handle, deadline)
                except (SubstrateError, OSError) as rexc:
                    return _sandbox_failure(
                        f"the actor lost its worker and could not be resumed: {rexc}"
                    )
                continue
            except (AgentTransportError, RouterError) as exc:
                if isinstance(exc, RouterError) and exc.status not in (500, 502, 504):
                    return _sandbox_failure(f"the router could not reach the sandbox: {exc}")
                last_error = exc
                log.info("exec %s: %s; retrying with the same job id", job["id"], exc)
                await asyncio.sleep(min(backoff, max(0.0, deadline - time.monotonic())))
                backoff = min(backoff * 2, 1.0)
                continue
            except AgentResponseError as exc:
                if exc.status == 404 and submitted:
                    return _sandbox_failure(
                        f"the sandbox lost job {job['id']} (its agent restarted); the command "
                        "may have partly run"
                    )
                return _sandbox_failure(str(exc))
            backoff = 0.05
            if state.get("state") != "running":
                return _job_result(state)
            if wait < 0.05:  # poll_wait_s 0: do not spin on the agent
                await asyncio.sleep(0.05)

    async def _timeout_result(
        self, agent: AgentClient, job: dict[str, Any], submitted: bool, last_error: Exception | None
    ) -> SandboxExecResult:
        stdout: str | None = None
        stderr: str | None = None
        if submitted:
            try:
                killed = await agent.kill(job["id"])
                stdout, stderr = killed.get("stdout"), killed.get("stderr")
            except SubstrateError as exc:
                log.warning("could not kill timed-out job %s: %s", job["id"], exc)
        elif last_error is not None:
            return _sandbox_failure(f"could not submit the command: {last_error}")
        note = f"command timed out after {job['timeout_s']:g} s"
        return SandboxExecResult(
            stdout=stdout,
            stderr=f"{stderr or ''}{note}\n",
            return_code=SANDBOX_RUNTIME_RETURN_CODE,
            error_type="timeout",
        )

    # ------------------------------------------------------------------ files

    async def upload_file(self, handle: SandboxHandle, source_path: Path, target_path: str) -> None:
        """Stream a local file into the sandbox in chunks; sha256-verified, atomic on the agent."""
        if not str(target_path).startswith("/"):
            raise ValueError(f"target_path must be absolute, got {target_path!r}")
        source = Path(source_path)
        mode = (await asyncio.to_thread(source.stat)).st_mode & 0o777
        fh = await asyncio.to_thread(source.open, "rb")
        try:
            await self._upload_stream(handle, _FileSource(fh), str(target_path), mode)
        finally:
            await asyncio.to_thread(fh.close)

    async def _upload_stream(
        self, handle: SandboxHandle, source: _Source, target: str, mode: int
    ) -> None:
        chunk_size = self.exec_config.transfer_chunk_bytes
        digest = hashlib.sha256()
        offset = 0
        async with self._active(handle):
            while True:
                data = await source.read(chunk_size)
                final = len(data) < chunk_size
                if not final:
                    final = await source.at_eof()
                await _hash(digest, data)
                try:
                    reply = await self._with_http_retry(
                        handle,
                        lambda agent, d=data, o=offset, f=final: agent.put_chunk(
                            target, o, d, final=f, mode=mode
                        ),
                        what=f"upload {target}",
                    )
                except AgentResponseError as exc:
                    if not (final and offset and exc.code == "offset_mismatch"):
                        raise
                    # A resent final chunk finds no upload in progress when the first attempt
                    # landed and only its reply was lost: accept the file if it is ours.
                    reply = await self._uploaded_already(
                        handle, target, offset + len(data), digest.hexdigest(), exc
                    )
                offset += len(data)
                if final:
                    break
        if reply.get("sha256") != digest.hexdigest() or int(reply.get("size", -1)) != offset:
            raise TransferError(
                f"upload of {target} did not verify: sent {offset} bytes sha256 "
                f"{digest.hexdigest()}, sandbox has {reply.get('size')} bytes sha256 "
                f"{reply.get('sha256')}"
            )

    async def _uploaded_already(
        self, handle: SandboxHandle, target: str, size: int, sha256: str, cause: Exception
    ) -> dict[str, Any]:
        """The agent reply for an upload whose final chunk landed but whose reply was lost."""
        try:
            info = await self._with_http_retry(
                handle, lambda agent: agent.stat(target), what=f"stat {target}"
            )
        except AgentResponseError:
            info = {}
        remote = None
        if info.get("type") == "file" and int(info.get("size", -1)) == size:
            remote = await self._remote_sha256(handle, target)
        if remote != sha256:
            raise TransferError(f"upload of {target} failed: {cause}") from cause
        return {"path": target, "size": size, "sha256": sha256}

    async def download_file(
        self, handle: SandboxHandle, source_path: str, target_path: Path
    ) -> None:
        """Fetch a sandbox file in ranged chunks into a temp file, then rename it into place."""
        target = Path(target_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.part-{uuid.uuid4().hex[:8]}")
        chunk = self.exec_config.transfer_chunk_bytes
        try:
            async with self._active(handle):
                try:
                    info = await self._with_http_retry(
                        handle, lambda agent: agent.stat(source_path), what=f"stat {source_path}"
                    )
                except AgentResponseError as exc:
                    if exc.status == 404:
                        raise TransferError(
                            errno.ENOENT, f"no such file in the sandbox: {source_path}"
                        ) from exc
                    raise TransferError(f"cannot download {source_path}: {exc}") from exc
                if info.get("type") != "file":
                    raise TransferError(
                        f"cannot download {source_path}: it is a {info.get('type')}, not a file"
                    )
                size = int(info["size"])
                digest = hashlib.sha256()
                # The sandbox hashes its copy while we fetch ours.
                remote_task = asyncio.ensure_future(self._remote_sha256(handle, source_path))
                fh = await asyncio.to_thread(tmp.open, "wb")

                def sink(data: bytes) -> None:
                    digest.update(data)
                    fh.write(data)

                def fetch(start: int) -> asyncio.Future[Any]:
                    end = min(start + chunk, size) - 1
                    return asyncio.ensure_future(
                        self._with_http_retry(
                            handle,
                            lambda agent: agent.get_range(source_path, start, end),
                            what=f"download {source_path}",
                        )
                    )

                pending: asyncio.Future[Any] | None = fetch(0) if size else None
                try:
                    offset = 0
                    while pending is not None:
                        data, _ = await pending
                        expected = min(chunk, size - offset)
                        if len(data) != expected:
                            pending = None
                            raise TransferError(
                                f"download of {source_path} got {len(data)} bytes for range "
                                f"{offset}-{offset + expected - 1}; the file changed while it "
                                "was read"
                            )
                        offset += len(data)
                        # Fetch the next range while this one is hashed and written.
                        pending = fetch(offset) if offset < size else None
                        await asyncio.to_thread(sink, data)
                    await asyncio.to_thread(fh.flush)
                except BaseException:
                    remote_task.cancel()
                    if pending is not None:
                        pending.cancel()
                    raise
                finally:
                    await asyncio.to_thread(fh.close)
                after = await self._with_http_retry(
                    handle, lambda agent: agent.stat(source_path), what=f"stat {source_path}"
                )
                if int(after.get("size", -1)) != size or after.get("mtime") != info.get("mtime"):
                    raise TransferError(f"{source_path} changed while it was downloaded")
                remote = await remote_task
                if remote is not None and remote != digest.hexdigest():
                    raise TransferError(
                        f"download of {source_path} did not verify: got sha256 "
                        f"{digest.hexdigest()}, sandbox has {remote}"
                    )
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            raise

    async def _remote_sha256(self, handle: SandboxHandle, path: str) -> str | None:
        """The sandbox-side sha256 of `path` via `sha256sum`, or None if the image lacks it.

        The agent's GET carries no digest, so the end-to-end check asks the sandbox itself;
        without `sha256sum` the size and mtime checks around the transfer still apply.
        """
        result = await self.exec(handle, f"sha256sum -- {shlex.quote(path)}", timeout_s=120)
        if result.return_code != 0 or not result.stdout:
            if result.return_code not in (126, 127):
                log.info("sha256sum of %s failed: %s", path, result.stderr)
            return None
        return result.stdout.split()[0]

    async def _with_http_retry(self, handle: SandboxHandle, call: Any, *, what: str) -> Any:
        """Retry an idempotent agent request through resets, 502/504 and (after resume) 503."""
        deadline = time.monotonic() + self.create_config.ready_timeout_s
        backoff = 0.05
        while True:
            try:
                return await call(self._agent(self._actor(handle)))
            except ActorUnavailableError:
                await self._recover(handle, deadline)
            except (AgentTransportError, RouterError) as exc:
                if isinstance(exc, RouterError) and exc.status not in (500, 502, 504):
                    raise TransferError(f"{what}: {exc}") from exc
                if time.monotonic() + backoff > deadline:
                    raise TransferError(f"{what}: {exc}") from exc
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 1.0)

    # ------------------------------------------------------------------ status / pause / resume

    async def status(self, handle: SandboxHandle) -> SandboxStatus:
        """Control-plane status from GetActor only: asking never wakes a parked actor."""
        actor = self._actor(handle)
        try:
            got = await self.control.get_actor(actor.atespace, actor.actor_id)
        except ActorNotFoundError:
            return SandboxStatus.STOPPED
        except ControlPlaneError as exc:
            log.info("status of %s unknown: %s", actor.actor_id, exc)
            return SandboxStatus.UNKNOWN
        name = status_name(got.status)
        if name == "RUNNING":
            return SandboxStatus.RUNNING
        if name == "RESUMING":
            return SandboxStatus.STARTING
        if name in _PARKED_STATES:
            return SandboxStatus.PAUSED if HAS_PAUSED_STATUS else SandboxStatus.RUNNING
        return SandboxStatus.UNKNOWN

    async def pause(self, handle: SandboxHandle) -> None:
        """Park the actor (PauseActor or SuspendActor per `pause_mode`), freeing its worker."""
        actor = self._actor(handle)
        state = self._state(actor)
        if state.idle_task is not None:
            state.idle_task.cancel()
            state.idle_task = None
        async with state.lock:
            if state.parked:
                return
            await self._park(handle, self.pause_mode)
            state.parked = True
            METRICS.parked.inc()

    async def resume(self, handle: SandboxHandle) -> None:
        """ResumeActor, wait for the agent, and refresh `handle.raw` in place."""
        actor = self._actor(handle)
        state = self._state(actor)
        async with state.lock:
            await self._resume_and_wait(
                handle, deadline=time.monotonic() + self.create_config.ready_timeout_s
            )
            if state.parked:
                state.parked = False
                METRICS.parked.dec()
        self._schedule_idle(handle, state)

    # ------------------------------------------------------------------ connect / endpoint

    async def serialize_handle(
        self, handle: SandboxHandle, *, scope: str | None = None
    ) -> dict[str, Any]:
        """A JSON descriptor `connect()` rebuilds the handle from (`scope` is ignored)."""
        del scope
        actor = self._actor(handle)
        return {
            "sandbox_id": actor.actor_id,
            "atespace": actor.atespace,
            "template": actor.template,
            "workdir": actor.workdir,
            "env": dict(actor.env),
        }

    async def connect(self, descriptor: Mapping[str, Any]) -> SandboxHandle:
        """Rebuild a handle from `serialize_handle()` output; checks the actor exists."""
        if not isinstance(descriptor, Mapping) or not isinstance(descriptor.get("sandbox_id"), str):
            raise ValueError("descriptor must be a mapping with a string 'sandbox_id'")
        unknown = sorted(set(descriptor) - _DESCRIPTOR_KEYS)
        if unknown:
            raise ValueError(
                f"unknown descriptor key(s): {', '.join(unknown)}; "
                f"expected: {', '.join(sorted(_DESCRIPTOR_KEYS))}"
            )
        workdir, env = descriptor.get("workdir"), descriptor.get("env") or {}
        if workdir is not None and not (isinstance(workdir, str) and workdir.startswith("/")):
            raise ValueError(
                f"descriptor 'workdir' must be an absolute path or null, got {workdir!r}"
            )
        if not isinstance(env, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items()
        ):
            raise ValueError(f"descriptor 'env' must map names to string values, got {env!r}")
        atespace = descriptor.get("atespace") or self.connection.atespace
        if not isinstance(atespace, str):
            raise ValueError(f"descriptor 'atespace' must be a string, got {atespace!r}")
        got = await self.control.get_actor(atespace, descriptor["sandbox_id"])
        actor = SubstrateActor(
            actor_id=got.actor_id,
            atespace=atespace,
            template=f"{got.actor_template_namespace}/{got.actor_template_name}",
            workdir=workdir,
            env=dict(env),
            status=status_name(got.status),
            pod_ip=got.ateom_pod_ip,
        )
        state = self._state(actor)
        state.parked = actor.status in _PARKED_STATES
        return SandboxHandle(sandbox_id=actor.actor_id, provider_name=self.name, raw=actor)

    async def endpoint(self, handle: SandboxHandle, port: int) -> SandboxEndpoint:
        """Port 80 of the sandbox, as the router URL plus the Host header that routes to it."""
        actor = self._actor(handle)
        if port != 80:
            raise ValueError(
                f"port {port} is not reachable: the Substrate router forwards only "
                "to port 80 inside an actor"
            )
        return SandboxEndpoint(endpoint=self.connection.router + "/", headers={"Host": actor.host})

    # ------------------------------------------------------------------ close

    async def close(self, handle: SandboxHandle) -> None:
        """Suspend (resuming a paused actor first) then delete. Idempotent; NOT_FOUND is done."""
        actor = self._actor(handle)
        if actor.status == _DELETED:
            return
        state = self._state(actor)
        if state.closed:
            return
        if state.idle_task is not None:
            state.idle_task.cancel()
            state.idle_task = None
        async with state.lock:
            if state.closed:
                return
            try:
                await self._teardown(actor)
            except SubstrateError as exc:
                METRICS.failures.labels("close").inc()
                await self._record("close_failed", actor, error=str(exc))
                raise CloseError(f"could not delete actor {actor.actor_id}: {exc}") from exc
            state.closed = True
            if state.parked:
                METRICS.parked.dec()
            if state.counted:
                METRICS.running.dec()
            await self._record("deleted", actor)
            # The handle remembers the close, so the per-sandbox state can go: a provider that
            # serves a whole training run would otherwise keep one entry per sandbox ever made.
            handle.raw = dataclasses.replace(self._actor(handle), status=_DELETED, pod_ip="")
            self._states.pop((actor.atespace, actor.actor_id), None)

    async def _teardown(self, actor: SubstrateActor) -> None:
        """Drive the actor to SUSPENDED, waiting out transitions, then DeleteActor."""
        control = self.control
        deadline = time.monotonic() + self.lifecycle.close_timeout_s
        backoff = 0.05
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                got = await control.get_actor(actor.atespace, actor.actor_id)
                name = status_name(got.status)
                if name == "SUSPENDED":
                    await control.delete_actor(actor.atespace, actor.actor_id)
                    return
                if name == "RUNNING":
                    await control.suspend_actor(actor.atespace, actor.actor_id)
                    continue
                if name == "PAUSED":
                    await control.resume_actor(actor.atespace, actor.actor_id)
                    continue
                last = None
            except ActorNotFoundError:
                return
            except (TransientControlPlaneError, NoFreeWorkersError) as exc:
                last = exc
            except ControlPlaneError as exc:
                if exc.code is not None and exc.code.name == "FAILED_PRECONDITION":
                    last = exc  # e.g. delete raced a resume; look again
                else:
                    raise
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 0.5)
        raise RetryError(
            f"actor {actor.actor_id} did not reach SUSPENDED within "
            f"{self.lifecycle.close_timeout_s:g} s",
            last,
        )

    async def aclose(self) -> None:
        """Release this provider's share of the channel and HTTP pool. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for state in self._states.values():
            if state.idle_task is not None:
                state.idle_task.cancel()
        res, self._res = self._res, None
        if res is not None:
            await _shared.release(res)


# ---------------------------------------------------------------------- helpers


async def _hash(digest: Any, data: bytes) -> None:
    """Feed `digest`; big chunks off the loop (hashlib releases the GIL for them)."""
    if len(data) >= 1 << 20:
        await asyncio.to_thread(digest.update, data)
    else:
        digest.update(data)


def _sandbox_failure(message: str) -> SandboxExecResult:
    return SandboxExecResult(
        stdout=None, stderr=message, return_code=SANDBOX_RUNTIME_RETURN_CODE, error_type="sandbox"
    )


def _job_result(job: Mapping[str, Any]) -> SandboxExecResult:
    state = job.get("state")
    stdout, stderr = job.get("stdout"), job.get("stderr")
    if state == "exited":
        code = job.get("exit_code")
        if code is None:
            signal = job.get("signal")
            code = 128 + int(signal) if signal else SANDBOX_RUNTIME_RETURN_CODE
        return SandboxExecResult(stdout=stdout, stderr=stderr, return_code=int(code))
    if state == "timeout":
        return SandboxExecResult(
            stdout=stdout,
            stderr=stderr,
            return_code=SANDBOX_RUNTIME_RETURN_CODE,
            error_type="timeout",
        )
    reason = job.get("error") or f"job ended in state {state!r}"
    return SandboxExecResult(
        stdout=stdout,
        stderr=f"{stderr or ''}{reason}",
        return_code=SANDBOX_RUNTIME_RETURN_CODE,
        error_type="sandbox",
    )


class _Source:
    async def read(self, n: int) -> bytes:
        raise NotImplementedError

    async def at_eof(self) -> bool:
        raise NotImplementedError


class _FileSource(_Source):
    def __init__(self, fh: BinaryIO) -> None:
        self._fh = fh

    async def read(self, n: int) -> bytes:
        return await asyncio.to_thread(self._fh.read, n)

    async def at_eof(self) -> bool:
        def peek() -> bool:
            pos = self._fh.tell()
            more = self._fh.read(1)
            self._fh.seek(pos)
            return not more

        return await asyncio.to_thread(peek)


class _BytesSource(_Source):
    def __init__(self, data: bytes) -> None:
        self._data = data
        self._pos = 0

    async def read(self, n: int) -> bytes:
        chunk = self._data[self._pos : self._pos + n]
        self._pos += len(chunk)
        return chunk

    async def at_eof(self) -> bool:
        return self._pos >= len(self._data)
