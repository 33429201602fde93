"""The local control plane: Substrate's ateapi semantics over one machine's worker slots.

`ControlPlane` is the one state machine behind both front doors: the gRPC servicer
(`servicer.py`) and the router call it in-process, and it raises `ApiError(code, message)` with
the exact gRPC status codes Substrate's ateapi uses (`errors.py`). It owns every actor record and
every transition between statuses; the worker slots (`slots.py`), the templates with their golden
snapshots (`template_registry.py`) and the sandboxes (a `SandboxRuntime`) are its parts. Resume,
pause, suspend and delete run as detached workflows (`workflows.py`): a client that disconnects
mid-restore does not leave a half-started sandbox behind.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import grpc

from gym_substrate._names import is_dns_label
from gym_substrate.local.errors import ApiError, check_label, check_selector, quote
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
from gym_substrate.local.workflows import Workflows

__all__ = [
    "PAUSED",
    "PAUSING",
    "RESUMING",
    "RUNNING",
    "SUSPENDED",
    "SUSPENDING",
    "ControlPlane",
]

log = logging.getLogger(__name__)

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


def _encode_page_token(last_key: str) -> str:
    return base64.urlsafe_b64encode(last_key.encode()).decode()


def _decode_page_token(token: str) -> str:
    """The last key of the previous page, from a token `_encode_page_token` made.

    Anything else fails as Substrate's ateredis.go `listPage` does: INTERNAL "invalid page
    token: ..." (its decode error surfaces unmapped), never a silent restart from page 1.
    """
    try:
        raw = base64.b64decode(token, altchars=b"-_", validate=True)
        after = raw.decode()
    except (binascii.Error, UnicodeDecodeError, ValueError) as exc:
        reason = f"illegal base64 data ({exc})"
    else:
        atespace, _, actor_id = after.partition("/")
        if _encode_page_token(after) == token and is_dns_label(atespace) and is_dns_label(actor_id):
            return after
        reason = "not a token this server issued"
    raise ApiError(
        grpc.StatusCode.INTERNAL,
        f"while listing actors in db: invalid page token: {reason}; pass next_page_token unchanged",
    )


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
        start_timeout_s: float = 60.0,
    ) -> None:
        self.store = store
        self.runtime = runtime
        self.state_dir = state_dir
        self.instance = instance
        self.workers = workers
        self.slots = SlotPool(store, workers, instance)
        self.registry = TemplateRegistry(store, runtime, self.slots, metrics)
        self.metrics = metrics
        self.start_timeout_s = start_timeout_s
        self.pool_labels = {"ate.dev/worker-pool": WORKER_POOL, "runtime": runtime.name}
        self._actors: dict[str, ActorRecord] = {}
        self._atespaces: set[str] = set()
        self.workflows = Workflows()
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
        await self.runtime.cleanup()
        await self.runtime.close()

    async def detach(self) -> None:
        """Leave sandboxes running for the next start to adopt (control-plane restart)."""
        await self.workflows.drain()
        await self.runtime.close()

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
        re-taken.
        """
        users = sum(1 for record in self._actors.values() if _template_key(record) == template.key)
        return await self.registry.add(template, users=users, keep_if_in_use=keep_if_in_use)

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
        updated = dataclasses.replace(record, version=record.version + 1, **changes)
        self.store.update_actor(updated)
        self._actors[updated.key] = updated
        return updated

    def _fall_back(self, record: ActorRecord) -> ActorRecord:
        """Record that the actor's sandbox is gone: SUSPENDED, resumable from its last snapshot."""
        return self._write(record, status=SUSPENDED, **_NO_SANDBOX)

    def _status_counts(self) -> Mapping[str, int]:
        counts = Counter(record.status for record in self._actors.values())
        for name in (RUNNING, RESUMING, SUSPENDED, SUSPENDING, PAUSED, PAUSING):
            counts.setdefault(name, 0)
        return counts

    def _ref(self, atespace: str, actor_id: str) -> str:
        check_label(actor_id, "actor id")
        check_label(atespace, "atespace")
        return f"{atespace}/{actor_id}"

    def _get(self, key: str) -> ActorRecord:
        record = self._actors.get(key)
        if record is None:
            atespace, _, actor_id = key.partition("/")
            raise ApiError(
                grpc.StatusCode.NOT_FOUND, f"Actor {actor_id} not found in atespace {atespace}"
            )
        return record

    def _spec(self, record: ActorRecord) -> ActorSpec:
        key = _template_key(record)
        template = self.registry.get(key)
        if template is None:
            raise ApiError(
                grpc.StatusCode.INTERNAL,
                f"while getting ActorTemplate {key}: not found (was the template removed?)",
            )
        return ActorSpec(record.atespace, record.actor_id, template)

    async def wait_idle(self, key: str, timeout_s: float) -> bool:
        """Wait until the operation in flight on ``key`` (if any) ends; True if one was waited."""
        return await self.workflows.wait_idle(key, timeout_s)

    # ---------------------------------------------------------------- atespaces
    def create_atespace(self, name: str) -> str:
        check_label(name, "atespace name")
        if name in self._atespaces:
            raise ApiError(grpc.StatusCode.ALREADY_EXISTS, f"Atespace {name} already exists")
        self.store.add_atespace(name)
        self._atespaces.add(name)
        return name

    def get_atespace(self, name: str) -> str:
        check_label(name, "atespace name")
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
        return self._get(self._ref(atespace, actor_id))

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
        key = self._ref(atespace, actor_id)
        check_selector(selector)
        template_key = f"{template_namespace}/{template_name}"
        if self.registry.get(template_key) is None:
            raise ApiError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"ActorTemplate {quote(template_key, bare=True)} not found",
            )
        if atespace not in self._atespaces:
            raise ApiError(grpc.StatusCode.FAILED_PRECONDITION, f"Atespace {atespace} not found")
        if key in self._actors:
            raise ApiError(
                grpc.StatusCode.ALREADY_EXISTS,
                f"Actor {actor_id} already exists in atespace {atespace}",
            )
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
        key = self._ref(atespace, actor_id)
        record = self._get(key)
        check_selector(selector)
        if self.workflows.busy(key):
            raise ApiError(grpc.StatusCode.ABORTED, "concurrent update conflict, please retry")
        return self._write(record, worker_selector=dict(selector))

    def list_actors(
        self, page_size: int, page_token: str, atespace: str
    ) -> tuple[list[ActorRecord], str]:
        if atespace:
            check_label(atespace, "atespace")
        if page_size < 0 or page_size > 1000:
            raise ApiError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"page_size must be between 0 and 1000, got {page_size}",
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
        return [
            (worker, self._actors.get(holder) if holder else None)
            for worker, holder in self.slots.entries()
        ]

    def worker_pod(self, slot: int) -> str:
        return self.slots.pod_name(slot)

    async def sandbox_gone(self, key: str, handle: str) -> bool:
        """Called when the agent of a RUNNING actor cannot be reached.

        If its sandbox really is gone, the actor falls back to SUSPENDED from its last snapshot
        (as after a crash) and True is returned, so the caller may resume it.
        """
        record = self._actors.get(key)
        if record is None or record.status != RUNNING or record.handle != handle:
            return record is not None and record.status != RUNNING
        if self.workflows.busy(key) or await self.runtime.is_alive(handle):
            return False
        async with self.workflows.lock(key):
            record = self._get(key)
            if record.status != RUNNING or record.handle != handle:
                return True
            await self._stop(handle)
            self.slots.free(record.slot)
            self._fall_back(record)
        log.warning(
            "actor %s: its sandbox died while RUNNING; it is SUSPENDED again from %s: "
            "everything since then is lost",
            key,
            record.snapshot_path or "its template (no snapshot)",
        )
        return True

    # ---------------------------------------------------------------- actors: lifecycle
    async def resume_actor(self, atespace: str, actor_id: str, boot: bool = False) -> ActorRecord:
        key = self._ref(atespace, actor_id)
        record = self._get(key)
        if record.status == RUNNING and not self.workflows.busy(key):
            return record
        return await self.workflows.run_detached(key, lambda: self._resume(key, boot))

    async def _resume(self, key: str, boot: bool) -> ActorRecord:
        record = self._get(key)
        if record.status == RUNNING:
            return record
        if record.status not in (SUSPENDED, PAUSED):
            raise ApiError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"Actor {record.actor_id} cannot be resumed from {record.status}",
            )
        spec = self._spec(record)
        wanted = record.worker_selector
        if any(self.pool_labels.get(k) != v for k, v in wanted.items()):
            raise ApiError(
                grpc.StatusCode.FAILED_PRECONDITION,
                "no worker pool matches the template's sandboxClass and the template/actor "
                f"selectors (pool labels here: {self.pool_labels})",
            )
        slot = self.slots.take(key)
        previous = record
        started_at = time.perf_counter()
        record = self._write(
            record,
            status=RESUMING,
            slot=slot,
            pod_uid=self.slots.uid(slot),
        )
        source, source_name = self._pick_source(record, spec.template, boot)
        try:
            started = await self.runtime.start(
                spec, Slot(slot), source, timeout_s=self.start_timeout_s
            )
        except (RuntimeFailure, OSError) as exc:
            self.slots.free(slot)
            self._write(record, status=previous.status, slot=None, pod_uid="")
            raise ApiError(
                grpc.StatusCode.INTERNAL, f"workflow failed at step CallAteletRestore: {exc}"
            ) from exc
        except BaseException:
            self.slots.free(slot)
            self._write(record, status=previous.status, slot=None, pod_uid="")
            raise
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
        key = self._ref(atespace, actor_id)
        self._get(key)
        return await self.workflows.run_detached(
            key, lambda: self._checkpoint(key, SnapshotKind.LOCAL)
        )

    async def suspend_actor(self, atespace: str, actor_id: str) -> ActorRecord:
        key = self._ref(atespace, actor_id)
        self._get(key)
        return await self.workflows.run_detached(
            key, lambda: self._checkpoint(key, SnapshotKind.EXTERNAL)
        )

    async def _checkpoint(self, key: str, kind: SnapshotKind) -> ActorRecord:
        record = self._get(key)
        pause = kind is SnapshotKind.LOCAL
        target, transit = (PAUSED, PAUSING) if pause else (SUSPENDED, SUSPENDING)
        if record.status == target:
            return record
        if record.status != RUNNING:
            verb = "pause" if pause else "suspend"
            hint = " (resume it first, then suspend it)" if record.status == PAUSED else ""
            raise ApiError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"Actor {record.actor_id} is not running (status: {record.status}); "
                f"cannot {verb} it{hint}",
            )
        spec = self._spec(record)
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
                grpc.StatusCode.INTERNAL, f"workflow failed at step CallAteletCheckpoint: {exc}"
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
        if old_snapshot and old_snapshot != record.snapshot_path:
            remove_snapshot(old_snapshot)
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
        key = self._ref(atespace, actor_id)
        self._get(key)

        async def work() -> None:
            record = self._get(key)
            if record.status != SUSPENDED:
                raise ApiError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"Actor {actor_id} is not suspended (status: {record.status})",
                )
            await self._forget(record)

        await self.workflows.run_detached(key, work)

    async def _forget(self, record: ActorRecord) -> None:
        for handle in (record.handle, record.retained_handle):
            await self._stop(handle)
        self.slots.free(record.slot)
        remove_snapshot(record.snapshot_path)
        remove_snapshot(record.in_progress_snapshot)
        template = self.registry.get(_template_key(record))
        if template is not None:
            with contextlib.suppress(RuntimeFailure):
                await self.runtime.forget_actor(
                    ActorSpec(record.atespace, record.actor_id, template)
                )
        self.store.delete_actor(record.atespace, record.actor_id)
        self._actors.pop(record.key, None)

    async def debug_clear(self) -> None:
        if self.workflows.busy():
            raise ApiError(grpc.StatusCode.ABORTED, "operations are in progress; retry")
        for record in list(self._actors.values()):
            await self._forget(record)
        self.store.clear()
        self._atespaces.clear()
