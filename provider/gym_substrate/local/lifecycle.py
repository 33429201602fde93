"""The local control plane: Substrate's ateapi semantics over one machine's worker slots.

`ControlPlane` is the one state machine behind both front doors: the gRPC servicer
(`servicer.py`) and the router call it in-process, and it raises `ApiError(code, message)` with
the gRPC status codes and messages Substrate's ateapi uses (`errors.py`). It owns every actor
record and every transition between statuses; the worker slots (`slots.py`), the templates with
their golden snapshots (`template_registry.py`) and the sandboxes (a `SandboxRuntime`) are its
parts. Resume, pause and suspend are workflows under a per-actor lock and a 28 s deadline
(`workflows.py`), with ateapi's failure modes: a failed resume leaves the actor RESUMING on its
worker, a workload that died leaves it RUNNING at a dead address.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import dataclasses
import logging
import re
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import grpc

from gym_substrate._names import is_dns_label
from gym_substrate.local.errors import (
    ApiError,
    internal,
    quote,
    require,
    validate_actor_id,
    validate_atespace,
    validate_selector,
)
from gym_substrate.local.metrics import Metrics
from gym_substrate.local.runtimes.base import (
    ActorSpec,
    RuntimeFailure,
    SandboxRuntime,
    Slot,
    SnapshotKind,
    SnapshotRef,
    TemplateSpec,
)
from gym_substrate.local.slots import WORKER_POOL, SlotPool
from gym_substrate.local.snapshots import is_dir, new_snapshot_dir, remove_snapshot
from gym_substrate.local.store import ActorRecord, GoldenRecord, Store, WorkerRecord
from gym_substrate.local.template_registry import TemplateRegistry
from gym_substrate.local.workflows import WORKFLOW_DEADLINE_S, Workflows

__all__ = [
    "GOLDEN_ATESPACE",
    "PAUSED",
    "PAUSING",
    "RESUMING",
    "RUNNING",
    "SUSPENDED",
    "SUSPENDING",
    "ControlPlane",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

# internal/resources/actor.go: the reserved atespace of the per-template golden actors
GOLDEN_ATESPACE = "ate-golden"

# ateapi Actor.Status names, as stored in ActorRecord.status
RUNNING = "STATUS_RUNNING"
RESUMING = "STATUS_RESUMING"
SUSPENDED = "STATUS_SUSPENDED"
SUSPENDING = "STATUS_SUSPENDING"
PAUSED = "STATUS_PAUSED"
PAUSING = "STATUS_PAUSING"


# the fields of a record whose sandbox is no longer running (it holds no slot)
_NO_SANDBOX: dict[str, Any] = {
    "slot": None,
    "handle": "",
    "address": "",
    "pod_uid": "",
    "in_progress_snapshot": "",
}


# A runtime failure that means the workload never answered its readyz. atelet keeps polling
# readyz for 30 s whatever the workload does (internal/readyz/readyz.go), so on a cluster such a
# resume fails only when the workflow's deadline ends it.
_NOT_READY = re.compile(r"readyz|became ready")


def _never_ready(exc: BaseException) -> bool:
    return _NOT_READY.search(str(exc)) is not None


_TOKEN_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_=")


def _encode_page_token(last_key: str) -> str:
    return base64.urlsafe_b64encode(last_key.encode()).decode()


def _decode_page_token(token: str) -> str:
    """The last key of the previous page, from a token `_encode_page_token` made.

    Anything else fails as Substrate's ateredis.go `ListActors` does: INTERNAL "internal server
    error: while listing actors in db: invalid page token: ...", never a silent restart from
    page 1.
    """
    try:
        raw = base64.b64decode(token, altchars=b"-_", validate=True)
        after = raw.decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        bad = next((i for i, c in enumerate(token) if c not in _TOKEN_CHARS), len(token))
        reason = f"illegal base64 data at input byte {bad}"
    else:
        atespace, _, actor_id = after.partition("/")
        if _encode_page_token(after) == token and is_dns_label(atespace) and is_dns_label(actor_id):
            return after
        reason = "not a token this server issued"
    raise internal(f"while listing actors in db: invalid page token: {reason}")


def _template_key(record: ActorRecord) -> str:
    return f"{record.template_namespace}/{record.template_name}"


class ControlPlane:
    """Actors, atespaces and their transitions, write-through to the `Store` (see the module)."""

    def __init__(
        self,
        store: Store,
        runtime: SandboxRuntime,
        *,
        state_dir: Path,
        instance: str,
        workers: int,
        metrics: Metrics,
        workflow_timeout_s: float = WORKFLOW_DEADLINE_S,
    ) -> None:
        if workflow_timeout_s <= 0:
            raise ValueError(f"workflow_timeout_s must be > 0, got {workflow_timeout_s}")
        self.store = store
        self.runtime = runtime
        self.state_dir = state_dir
        self.instance = instance
        self.workers = workers
        self.slots = SlotPool(store, workers, instance)
        self.registry = TemplateRegistry(store, runtime, self.slots, metrics)
        self.metrics = metrics
        self.workflow_timeout_s = workflow_timeout_s
        self.pool_labels = {"ate.dev/worker-pool": WORKER_POOL, "runtime": runtime.name}
        self._actors: dict[str, ActorRecord] = {}
        self._atespaces: set[str] = set()
        self.workflows = Workflows()
        # runtime clean-up of deleted actors still under way, by key: a namesake created
        # meanwhile waits for it before its sandbox starts (it would remove the new files)
        self._forgetting: dict[str, asyncio.Task[None]] = {}
        # sandboxes already reported dead (the router asks on every failed request)
        self._reported_dead: set[str] = set()
        # called with a sandbox handle before it is checkpointed or stopped, so the router can
        # drop its pooled connections into it (a checkpoint with open connections fails, and a
        # pooled connection into a restored sandbox hangs)
        self.sandbox_listeners: list[Callable[[str], Awaitable[None]]] = []
        metrics.watch_state(self._status_counts, self.slots.counts)

    # ---------------------------------------------------------------- start / stop
    async def start(self, templates: list[TemplateSpec]) -> None:
        """Load state, adopt or recover actors, register templates and their golden snapshots."""
        self._atespaces = set(self.store.atespaces())
        self.registry.load()
        self.slots.load()
        self._actors = {record.key: record for record in self.store.actors()}
        await self.runtime.open()
        await self._recover()
        added = set()
        for template in templates:
            await self.add_template(template, keep_if_in_use=True)
            added.add(template.key)
        for key, template in self.registry.templates.items():
            if key not in added:
                await self.registry.ensure_golden(template)
                self._sync_golden_actor(template)

    async def _recover(self) -> None:
        keep: set[str] = set()
        for record in list(self._actors.values()):
            if record.status in (PAUSED, SUSPENDED):
                if record.retained_handle:
                    keep.add(record.retained_handle)
                continue
            template = self.registry.get(_template_key(record))
            if (
                record.status == RUNNING
                and record.handle
                and record.slot is not None
                and self.slots.is_free(record.slot)
                and template is not None
            ):
                spec = ActorSpec(record.atespace, record.actor_id, template)
                adopted = None
                try:
                    adopted = await self.runtime.adopt(
                        spec, Slot(record.slot), record.handle, record.address
                    )
                except RuntimeFailure as exc:
                    log.warning("adopting %s failed: %s", record.key, exc)
                if adopted is not None:
                    self.slots.adopt(record.slot, record.key)
                    keep.add(adopted.handle)
                    if adopted.address != record.address or adopted.handle != record.handle:
                        self._write(record, handle=adopted.handle, address=adopted.address)
                    log.info("adopted running actor %s at %s", record.key, adopted.address)
                    continue
            if record.handle:
                with contextlib.suppress(RuntimeFailure):
                    await self.runtime.stop(record.handle)
            if record.in_progress_snapshot:
                remove_snapshot(record.in_progress_snapshot)
            if record.snapshot_path:
                log.warning(
                    "actor %s was %s but its sandbox is gone; it is SUSPENDED again from its "
                    "last snapshot %s: everything since that snapshot is lost",
                    record.key,
                    record.status,
                    record.snapshot_path,
                )
            else:
                log.warning(
                    "actor %s was %s but its sandbox is gone and it has no snapshot; it is "
                    "SUSPENDED again and its next resume starts from the template: everything "
                    "it did is lost",
                    record.key,
                    record.status,
                )
            self._fall_back(record)
        swept = await self.runtime.sweep(keep)
        for line in swept:
            log.warning("removed a sandbox no actor claims: %s", line)

    async def shutdown(self, *, suspend: bool = False, timeout_s: float = 120.0) -> None:
        """Wait for in-flight operations, then stop every sandbox (``local down``).

        With ``suspend`` every RUNNING actor is suspended first, so nothing it did is lost (with
        gVisor not even its memory); an actor whose suspend fails or overruns is killed and falls
        back to its last snapshot at the next start.
        """
        await self.workflows.drain()
        if suspend:
            running = [r for r in self._actors.values() if r.status == RUNNING]
            if running:
                log.info("suspending %d running actors before stopping", len(running))
                results = await asyncio.wait(
                    [
                        asyncio.ensure_future(self.suspend_actor(r.atespace, r.actor_id))
                        for r in running
                    ],
                    timeout=timeout_s,
                )
                for task in results[1]:
                    task.cancel()
                for task in results[0]:
                    if task.exception() is not None:
                        log.warning("suspend at shutdown failed: %s", task.exception())
                await self.workflows.drain()
        for record in list(self._actors.values()):
            for handle in (record.handle, record.retained_handle):
                await self._stop(handle)
        await self._finish_clean_ups()
        await self.runtime.cleanup()
        await self.runtime.close()

    async def detach(self) -> None:
        """Leave sandboxes running for the next start to adopt (control-plane restart)."""
        await self.workflows.drain()
        await self._finish_clean_ups()
        await self.runtime.close()

    async def _finish_clean_ups(self) -> None:
        """Wait for the clean-up of deleted actors (a DeleteActor cancelled mid-way included)."""
        if self._forgetting:
            await asyncio.wait(list(self._forgetting.values()), timeout=15)

    # ---------------------------------------------------------------- templates
    @property
    def templates(self) -> dict[str, TemplateSpec]:
        return self.registry.templates

    def golden(self, key: str) -> GoldenRecord | None:
        return self.registry.golden(key)

    async def add_template(self, template: TemplateSpec, *, keep_if_in_use: bool = False) -> bool:
        """Register a template; returns True when it changed anything.

        Templates are immutable while actors use them (as Substrate's ActorTemplates are): an
        actor's own snapshot was taken under the old spec and may not restore under a new one,
        so a changed spec under a name some actor uses is refused (``ApiError``), or with
        ``keep_if_in_use`` (``local up`` re-registering the built-in template) kept as stored
        with a warning. A changed template no actor uses is replaced and its golden snapshot
        re-taken. The template's golden actor does not count as a user.
        """
        users = sum(
            1
            for record in self._actors.values()
            if _template_key(record) == template.key and record.atespace != GOLDEN_ATESPACE
        )
        changed = await self.registry.add(template, users=users, keep_if_in_use=keep_if_in_use)
        stored = self.registry.get(template.key)
        if stored is not None:
            self._sync_golden_actor(stored)
        return changed

    def _sync_golden_actor(self, template: TemplateSpec) -> None:
        """Keep the template's golden actor, as Substrate's template controller makes one.

        It lives in the ``ate-golden`` atespace under a random UUID, is SUSPENDED, and its
        latest snapshot is the template's golden snapshot once there is one (internal/resources/
        actor.go, atecontroller's actortemplate_controller.go). Nothing here depends on it: the
        golden snapshot belongs to the template, so deleting the actor deletes only the record.
        """
        if GOLDEN_ATESPACE not in self._atespaces:
            self.store.add_atespace(GOLDEN_ATESPACE)
            self._atespaces.add(GOLDEN_ATESPACE)
        record = next(
            (
                r
                for r in self._actors.values()
                if r.atespace == GOLDEN_ATESPACE and _template_key(r) == template.key
            ),
            None,
        )
        if record is None:
            record = ActorRecord(
                atespace=GOLDEN_ATESPACE,
                actor_id=str(uuid.uuid4()),
                template_namespace=template.namespace,
                template_name=template.name,
                status=SUSPENDED,
                created_at=time.time(),
            )
            self.store.insert_actor(record)
            self._actors[record.key] = record
        golden = self.registry.usable_golden(template)
        if (
            golden is not None
            and record.status == SUSPENDED
            and record.snapshot_path != golden.path
            and not (record.snapshot_path and is_dir(record.snapshot_path))
        ):
            self._write(record, snapshot_kind="external", snapshot_path=golden.path)

    # ---------------------------------------------------------------- state helpers
    async def _release(self, handle: str) -> None:
        for listener in self.sandbox_listeners:
            try:
                await listener(handle)
            except Exception:
                log.exception("a sandbox listener failed for %s", handle)

    async def _stop(self, handle: str) -> None:
        if handle:
            await self._release(handle)
            with contextlib.suppress(RuntimeFailure):
                await self.runtime.stop(handle)

    def _write(self, record: ActorRecord, **changes: Any) -> ActorRecord:
        """Apply ``changes`` to the actor's current record (not to ``record``, which may be an
        older copy: an UpdateActor may have run meanwhile), bump its version and store it."""
        current = self._actors.get(record.key, record)
        updated = dataclasses.replace(current, version=current.version + 1, **changes)
        self.store.update_actor(updated)
        self._actors[updated.key] = updated
        return updated

    def _fall_back(self, record: ActorRecord) -> ActorRecord:
        """Record that the actor's sandbox is gone: SUSPENDED, resumable from its last snapshot."""
        return self._write(record, status=SUSPENDED, **_NO_SANDBOX)

    def _remove_snapshot(self, path: str) -> None:
        """Remove an actor's snapshot folder, never a template's golden one (its golden actor's)."""
        if path and not self.registry.is_golden_path(path):
            remove_snapshot(path)

    def _status_counts(self) -> Mapping[str, int]:
        counts = Counter(record.status for record in self._actors.values())
        for name in (RUNNING, RESUMING, SUSPENDED, SUSPENDING, PAUSED, PAUSING):
            counts.setdefault(name, 0)
        return counts

    def _get(self, key: str) -> ActorRecord:
        record = self._actors.get(key)
        if record is None:
            actor_id = key.partition("/")[2]
            raise ApiError(
                grpc.StatusCode.NOT_FOUND, f"Actor {quote(actor_id, bare=True)} not found"
            )
        return record

    def _spec(self, record: ActorRecord, step: str) -> ActorSpec:
        template = self.registry.get(_template_key(record))
        if template is None:
            raise internal(
                f"workflow failed at step {step}: while getting ActorTemplate: "
                f'actortemplate.ate.dev "{record.template_name}" not found'
            )
        return ActorSpec(record.atespace, record.actor_id, template)

    async def _under_deadline(self, work: Awaitable[T]) -> T:
        """Await ``work`` under the workflow deadline: DEADLINE_EXCEEDED when it ends it.

        The message is what a cluster sends when the deadline cuts its call to atelet.
        """
        scope = asyncio.timeout(self.workflow_timeout_s)
        try:
            async with scope:
                return await work
        except TimeoutError:
            if scope.expired():
                raise ApiError(
                    grpc.StatusCode.DEADLINE_EXCEEDED, "context deadline exceeded"
                ) from None
            raise

    async def wait_idle(self, key: str, timeout_s: float) -> bool:
        """Wait until the operation holding actor ``key``'s lock ends; True if one was waited.

        ``key`` is ``atespace/actor_id``; the lock is the actor id's, as ateapi's.
        """
        return await self.workflows.wait_idle(key.rpartition("/")[2], timeout_s)

    # ---------------------------------------------------------------- atespaces
    def create_atespace(self, name: str) -> str:
        require(name, "name is required")
        validate_atespace(name)
        if name in self._atespaces:
            raise ApiError(grpc.StatusCode.ALREADY_EXISTS, f"Atespace {name} already exists")
        self.store.add_atespace(name)
        self._atespaces.add(name)
        return name

    def get_atespace(self, name: str) -> str:
        require(name, "name is required")
        validate_atespace(name)
        if name not in self._atespaces:
            raise ApiError(grpc.StatusCode.NOT_FOUND, f"Atespace {name} not found")
        return name

    def list_atespaces(self) -> list[str]:
        return sorted(self._atespaces)

    def delete_atespace(self, name: str) -> None:
        self.get_atespace(name)
        if any(record.atespace == name for record in self._actors.values()):
            raise ApiError(grpc.StatusCode.FAILED_PRECONDITION, f"Atespace {name} is not empty")
        self.store.delete_atespace(name)
        self._atespaces.discard(name)

    # ---------------------------------------------------------------- actors: records
    def get_actor(self, atespace: str, actor_id: str) -> ActorRecord:
        """GetActor. As get_actor.go, only emptiness is checked: any other name is NOT_FOUND."""
        require(actor_id, "id is required")
        require(atespace, "atespace is required")
        return self._get(f"{atespace}/{actor_id}")

    def lookup(self, atespace: str, actor_id: str) -> ActorRecord | None:
        """Router fast path: no validation, no copy."""
        return self._actors.get(f"{atespace}/{actor_id}")

    def create_actor(
        self,
        atespace: str,
        actor_id: str,
        template_namespace: str,
        template_name: str,
        selector: Mapping[str, str],
    ) -> ActorRecord:
        # create_actor.go's order: the request's fields, then the template, then the atespace
        require(template_namespace, "actor_template_namespace is required")
        require(template_name, "actor_template_name is required")
        require(actor_id, "actor_id is required")
        validate_actor_id(actor_id)
        require(atespace, "atespace is required")
        validate_atespace(atespace)
        validate_selector(selector)
        template_key = f"{template_namespace}/{template_name}"
        if self.registry.get(template_key) is None:
            raise ApiError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"ActorTemplate {quote(template_key, bare=True)} not found",
            )
        if atespace not in self._atespaces:
            raise ApiError(grpc.StatusCode.FAILED_PRECONDITION, f"Atespace {atespace} not found")
        key = f"{atespace}/{actor_id}"
        if key in self._actors:
            raise ApiError(grpc.StatusCode.ALREADY_EXISTS, f"Actor {actor_id} already exists")
        record = ActorRecord(
            atespace=atespace,
            actor_id=actor_id,
            template_namespace=template_namespace,
            template_name=template_name,
            status=SUSPENDED,
            version=1,
            worker_selector=dict(selector),
            created_at=time.time(),
        )
        self.store.insert_actor(record)
        self._actors[key] = record
        return record

    def update_actor(
        self, atespace: str, actor_id: str, selector: Mapping[str, str]
    ) -> ActorRecord:
        """UpdateActor: allowed in any state and under no lock, as update_actor.go."""
        require(actor_id, "actor_id is required")
        require(atespace, "atespace is required")
        validate_atespace(atespace)
        validate_selector(selector)
        record = self._get(f"{atespace}/{actor_id}")
        return self._write(record, worker_selector=dict(selector))

    def list_actors(
        self, page_size: int, page_token: str, atespace: str
    ) -> tuple[list[ActorRecord], str]:
        """One page, in key order. A real server pages a Redis SCAN (see docs/local.md)."""
        if atespace:
            validate_atespace(atespace)
        if page_size < 0:
            raise ApiError(grpc.StatusCode.INVALID_ARGUMENT, "page_size cannot be negative")
        if page_size > 1000:
            raise ApiError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"page_size {page_size} exceeds maximum page size 1000",
            )
        size = page_size or 1000
        after = _decode_page_token(page_token) if page_token else ""
        keys = sorted(
            key
            for key, record in self._actors.items()
            if (not atespace or record.atespace == atespace) and key > after
        )
        page = [self._actors[key] for key in keys[:size]]
        token = ""
        if len(keys) > size:
            token = _encode_page_token(keys[size - 1])
        return page, token

    def workers_list(self) -> list[tuple[WorkerRecord, ActorRecord | None]]:
        out: list[tuple[WorkerRecord, ActorRecord | None]] = []
        for worker, holder in self.slots.entries():
            actor = None
            if holder is not None and holder.startswith("golden:"):
                # taking a golden snapshot: the worker runs the template's golden actor
                template_key = holder.removeprefix("golden:")
                actor = next(
                    (
                        r
                        for r in self._actors.values()
                        if r.atespace == GOLDEN_ATESPACE and _template_key(r) == template_key
                    ),
                    None,
                )
            elif holder is not None:
                actor = self._actors.get(holder)
            out.append((worker, actor))
        return out

    def worker_pod(self, slot: int) -> str:
        return self.slots.pod_name(slot)

    async def sandbox_gone(self, key: str, handle: str) -> bool:
        """Called when the agent of a RUNNING actor cannot be reached; never restarts it.

        True when the actor's record changed meanwhile (the caller may look again); False when
        it is still RUNNING on that sandbox. A workload that died stays RUNNING at its dead
        address, as on a cluster, where requests then get 503 until its worker pod is deleted
        (syncer.go): a user must notice. SuspendActor is this backend's way back (it fails, and
        the actor returns to SUSPENDED from its last snapshot).
        """
        record = self._actors.get(key)
        if record is None:
            return False
        if record.status != RUNNING or record.handle != handle:
            return True
        if handle not in self._reported_dead and not await self.runtime.is_alive(handle):
            self._reported_dead.add(handle)
            log.warning(
                "actor %s: its workload at %s is gone; it stays RUNNING and its requests get "
                "503, as on a cluster. SuspendActor returns it to SUSPENDED from %s (everything "
                "since is lost)",
                key,
                record.address,
                record.snapshot_path or "its template (it has no snapshot)",
            )
        return False

    # ---------------------------------------------------------------- actors: lifecycle
    async def resume_actor(self, atespace: str, actor_id: str, boot: bool = False) -> ActorRecord:
        """ResumeActor: under the actor's lock and the workflow deadline, even when RUNNING.

        It runs in the caller's task: a caller that goes away (a gRPC client deadline) stops it
        part-way, and the actor keeps whatever state it had reached (docs/local.md).
        """
        require(actor_id, "id is required")
        require(atespace, "atespace is required")
        async with self.workflows.lock(actor_id):
            deadline = time.monotonic() + self.workflow_timeout_s
            return await self._under_deadline(
                self._resume(f"{atespace}/{actor_id}", boot, deadline)
            )

    async def _resume(self, key: str, boot: bool, deadline: float) -> ActorRecord:
        # LoadActorForResume reads the store with the lock held, so a concurrent call can meet
        # the lock (as ateapi's read of Redis does). The mirror holds the same record
        # (write-through) and is what counts if a DeleteActor ran meanwhile.
        atespace, _, actor_id = key.partition("/")
        await asyncio.to_thread(self.store.get_actor, atespace, actor_id)
        record = self._get(key)
        spec = self._spec(record, "LoadActorForResume")
        if record.status == RUNNING:
            return record
        if record.status not in (SUSPENDED, PAUSED, RESUMING):
            raise ApiError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"Actor {record.actor_id} is {record.status}; suspend it to finish that first",
            )
        # AssignWorker
        if any(self.pool_labels.get(k) != v for k, v in record.worker_selector.items()):
            raise ApiError(
                grpc.StatusCode.FAILED_PRECONDITION,
                "no worker pool matches the template's sandboxClass and the template/actor "
                "selectors",
            )
        slot = record.slot
        if slot is None or self.slots.holder(slot) != key:
            # a worker kept by an earlier attempt that failed is reused, as AssignWorker does
            slot = self.slots.take(key)
            record = self._write(
                record,
                status=RESUMING,
                slot=slot,
                pod_uid=self.slots.uid(slot),
                # a resuming actor already carries its worker's IP (real: workflow_resume.go)
                address=self.runtime.worker_ip(Slot(slot)),
            )
        # CallAteletRestore
        source, source_name = self._pick_source(record, spec.template, boot)
        step = {
            "golden": "while creating workload from golden snapshot",
            "boot": "while creating workload from spec",
        }.get(source_name, "while restoring workload")
        pending = self._forgetting.get(key)
        if pending is not None:
            await asyncio.shield(pending)
        started_at = time.perf_counter()
        try:
            started = await self.runtime.start(
                spec, Slot(slot), source, timeout_s=max(0.1, deadline - time.monotonic())
            )
        except (RuntimeFailure, OSError) as exc:
            # the actor stays RESUMING on its worker: the next ResumeActor tries again there
            if not _never_ready(exc):
                raise ApiError(
                    grpc.StatusCode.INTERNAL,
                    f"workflow failed at step CallAteletRestore: {step}: {exc}",
                ) from exc
            log.warning(
                "actor %s: its workload did not become ready (%s); as atelet keeps polling "
                "readyz, the resume holds its worker until the workflow deadline, then fails "
                "with DEADLINE_EXCEEDED and leaves the actor RESUMING",
                key,
                exc,
            )
            # ended by the deadline (or by the caller going away). Slept out here rather than
            # left to the deadline's cancellation alone: one swallowed on the way (a subprocess
            # ending just then) would otherwise hold the actor's lock for ever.
            await asyncio.sleep(max(0.0, deadline - time.monotonic()))
            raise ApiError(grpc.StatusCode.DEADLINE_EXCEEDED, "context deadline exceeded") from exc
        # FinalizeRunning
        record = self._write(
            record,
            status=RUNNING,
            handle=started.handle,
            address=started.address,
            retained_handle="",
        )
        self.metrics.operation_duration.labels("resume", source_name).observe(
            time.perf_counter() - started_at
        )
        return record

    def _pick_source(
        self, record: ActorRecord, template: TemplateSpec, boot: bool
    ) -> tuple[SnapshotRef | None, str]:
        if record.snapshot_path:
            if self.registry.is_golden_path(record.snapshot_path):  # a golden actor's
                return SnapshotRef(SnapshotKind.GOLDEN, Path(record.snapshot_path)), "golden"
            if is_dir(record.snapshot_path):
                kind = SnapshotKind(record.snapshot_kind or "external")
                return SnapshotRef(kind, Path(record.snapshot_path)), kind.value
            log.warning(
                "actor %s: its snapshot %s is missing; starting it from its template instead",
                record.key,
                record.snapshot_path,
            )
        golden = self.registry.usable_golden(template)
        if not boot and golden is not None:
            return SnapshotRef(SnapshotKind.GOLDEN, Path(golden.path)), "golden"
        return None, "boot"

    async def pause_actor(self, atespace: str, actor_id: str) -> ActorRecord:
        require(actor_id, "id is required")
        require(atespace, "atespace is required")
        return await self._run_checkpoint(atespace, actor_id, SnapshotKind.LOCAL)

    async def suspend_actor(self, atespace: str, actor_id: str) -> ActorRecord:
        require(actor_id, "id is required")
        require(atespace, "atespace is required")
        return await self._run_checkpoint(atespace, actor_id, SnapshotKind.EXTERNAL)

    async def _run_checkpoint(
        self, atespace: str, actor_id: str, kind: SnapshotKind
    ) -> ActorRecord:
        """A checkpoint workflow: its caller waits under the deadline; the work always finishes.

        A runtime cannot stop a checkpoint half-way without losing the sandbox, so a caller that
        leaves or runs out of time gets its error while the checkpoint completes, holding the
        lock, and its outcome is recorded as usual.
        """
        key = f"{atespace}/{actor_id}"
        task = self.workflows.run_detached(actor_id, lambda: self._checkpoint(key, kind))
        return await self._under_deadline(asyncio.shield(task))

    async def _checkpoint(self, key: str, kind: SnapshotKind) -> ActorRecord:
        record = self._get(key)
        pause = kind is SnapshotKind.LOCAL
        target, transit = (PAUSED, PAUSING) if pause else (SUSPENDED, SUSPENDING)
        step = "CallAteletPause" if pause else "CallAteletSuspend"
        spec = self._spec(record, "LoadActorForPause" if pause else "LoadActorForSuspend")
        if record.slot is None:
            if record.status == target:
                return record  # idempotent, as the workflow's steps all report complete
            # MarkSuspending/MarkPausing change only a RUNNING actor, then the call finds no
            # worker (workflow_suspend.go, workflow_pause.go): a PAUSED actor cannot be
            # suspended, a SUSPENDED one cannot be paused
            raise internal(
                f"workflow failed at step {step}: actor is in {transit.removeprefix('STATUS_')} "
                "state but has no active worker"
            )
        if not record.handle:
            # RESUMING on a worker after a resume that failed: there is no workload to
            # checkpoint. Back to SUSPENDED from the last snapshot, freeing the worker, as a
            # cluster does once that worker pod is deleted.
            self.slots.free(record.slot)
            self._fall_back(record)
            raise ApiError(
                grpc.StatusCode.INTERNAL,
                f"workflow failed at step {step}: while checkpointing workload: actor "
                f"{record.actor_id} has no running workload (its resume did not finish); it is "
                "SUSPENDED again from its last snapshot",
            )
        if pause:
            dest = new_snapshot_dir(self.state_dir / "snapshots" / "local", f"{record.actor_id}-")
        else:
            dest = new_snapshot_dir(spec.template.snapshot_location / record.actor_id)
        started_at = time.perf_counter()
        record = self._write(record, status=transit, in_progress_snapshot=str(dest))
        await self._release(record.handle)
        try:
            result = await self.runtime.checkpoint(spec, record.handle, kind, dest)
        except (RuntimeFailure, OSError) as exc:
            remove_snapshot(dest)
            lost = getattr(exc, "sandbox_lost", False) or not await self.runtime.is_alive(
                record.handle
            )
            if lost:
                # a cluster keeps such an actor SUSPENDING until its worker pod is deleted;
                # here that step is implied: back to SUSPENDED from the last snapshot
                await self._stop(record.handle)
                self.slots.free(record.slot)
                self._fall_back(record)
                log.warning(
                    "actor %s: checkpoint failed and the sandbox is gone; SUSPENDED from its "
                    "last snapshot %s",
                    record.key,
                    record.snapshot_path or "(none: next resume starts from the template)",
                )
            else:
                self._write(record, status=RUNNING, in_progress_snapshot="")
            raise ApiError(
                grpc.StatusCode.INTERNAL,
                f"workflow failed at step {step}: while checkpointing workload: {exc}",
            ) from exc
        old_snapshot = record.snapshot_path
        self.slots.free(record.slot)
        record = self._write(
            record,
            status=target,
            **_NO_SANDBOX,
            snapshot_kind=result.snapshot.kind.value,
            snapshot_path=str(result.snapshot.path),
            retained_handle=result.retained_handle or "",
        )
        if old_snapshot != record.snapshot_path:
            self._remove_snapshot(old_snapshot)
        template = spec.template
        for file_kind, size in result.files:
            self.metrics.snapshot_size.labels(file_kind, template.namespace, template.name).observe(
                size
            )
        self.metrics.operation_duration.labels("pause" if pause else "suspend", "").observe(
            time.perf_counter() - started_at
        )
        return record

    async def delete_actor(self, atespace: str, actor_id: str) -> None:
        """DeleteActor: no lock, as delete_actor.go; the answer depends on the status alone.

        The record goes at once (so a ResumeActor after this finds nothing); the sandbox's
        files are cleaned up after, and a namesake created meanwhile waits for that.
        """
        require(actor_id, "actor_id is required")
        validate_actor_id(actor_id)
        require(atespace, "atespace is required")
        key = f"{atespace}/{actor_id}"
        record = self._get(key)
        if record.status != SUSPENDED:
            raise ApiError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"Actor {actor_id} is not suspended (status: {record.status})",
            )
        self.store.delete_actor(atespace, actor_id)
        self._actors.pop(key, None)
        previous = self._forgetting.get(key)
        cleanup = asyncio.get_running_loop().create_task(self._clean_up(record, previous))
        self._forgetting[key] = cleanup

        def done(task: asyncio.Task[None]) -> None:
            if self._forgetting.get(key) is task:
                del self._forgetting[key]

        cleanup.add_done_callback(done)
        await asyncio.shield(cleanup)

    async def _clean_up(self, record: ActorRecord, previous: asyncio.Task[None] | None) -> None:
        """What a deleted actor leaves: sandboxes, its worker, snapshots, runtime files."""
        if previous is not None:
            with contextlib.suppress(Exception):
                await previous
        for handle in (record.handle, record.retained_handle):
            await self._stop(handle)
        if record.slot is not None and self.slots.holder(record.slot) == record.key:
            self.slots.free(record.slot)
        self._remove_snapshot(record.snapshot_path)
        remove_snapshot(record.in_progress_snapshot)
        template = self.registry.get(_template_key(record))
        if template is not None:
            with contextlib.suppress(RuntimeFailure):
                await self.runtime.forget_actor(
                    ActorSpec(record.atespace, record.actor_id, template)
                )

    async def debug_clear(self) -> None:
        """DebugClear: every actor and atespace goes, the golden actors and ``ate-golden`` too
        (a real one flushes Redis). Refused while an operation runs (a real one is not)."""
        if self.workflows.busy():
            raise ApiError(grpc.StatusCode.ABORTED, "operations are in progress; retry")
        records = list(self._actors.values())
        self.store.clear()
        self._actors.clear()
        self._atespaces.clear()
        for record in records:
            await self._clean_up(record, self._forgetting.get(record.key))
