"""The local control plane: Substrate's ateapi semantics over one machine's worker slots.

`ControlPlane` holds the lifecycle logic and raises `ApiError(code, message)` with the exact gRPC
status codes Substrate's ateapi uses (reference/substrate.md §1.2-1.5); `ControlServicer` only
translates it to gRPC, and the router calls `ControlPlane` in-process, so both front doors share
one state machine. Resume, pause and suspend run as detached tasks (like Substrate's workflows):
a client that disconnects mid-restore does not leave a half-started sandbox behind.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import dataclasses
import logging
import secrets
import shutil
import socket
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import grpc

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.ateapi import ateapi_pb2_grpc as pb_grpc
from gym_substrate.local.errors import ApiError, check_label, check_selector
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
from gym_substrate.local.store import ActorRecord, GoldenRecord, Store, WorkerRecord

__all__ = ["ControlPlane", "ControlServicer", "WORKER_POOL"]

log = logging.getLogger(__name__)

WORKER_POOL = "local"
WORKER_NAMESPACE = "local"

RUNNING = "STATUS_RUNNING"
RESUMING = "STATUS_RESUMING"
SUSPENDED = "STATUS_SUSPENDED"
SUSPENDING = "STATUS_SUSPENDING"
PAUSED = "STATUS_PAUSED"
PAUSING = "STATUS_PAUSING"
_HOLDS_SLOT = {RUNNING, RESUMING, PAUSING, SUSPENDING}

T = TypeVar("T")


def _ts() -> str:
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H-%M-%S")
    return f"{now}Z-{secrets.token_hex(3)}"


def _snapshot_dest(parent: Path, prefix: str = "") -> Path:
    """A fresh snapshot folder name under ``parent`` (created); the folder itself is not."""
    parent.mkdir(parents=True, exist_ok=True)
    return parent / f"{prefix}{_ts()}"


def _is_dir(path: str) -> bool:
    return Path(path).is_dir()


def _remove_tree(path: str | Path) -> None:
    if not path:
        return
    target = Path(path)
    shutil.rmtree(target, ignore_errors=True)
    # drop `<location>/<actor_id>/` once its last snapshot is gone
    with contextlib.suppress(OSError):
        target.parent.rmdir()


def template_changes(old: TemplateSpec, new: TemplateSpec) -> str:
    """What differs between two specs of one template, for messages (env values stay out)."""
    changes = []
    if old.command != new.command:
        changes.append(f"command {list(old.command)} -> {list(new.command)}")
    if old.env != new.env:
        before, after = dict(old.env), dict(new.env)
        names = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
        changes.append(f"env {', '.join(names) or '(order)'}")
    if (old.readyz_path, old.readyz_port) != (new.readyz_path, new.readyz_port):
        changes.append(
            f"readyz {old.readyz_path}:{old.readyz_port} -> {new.readyz_path}:{new.readyz_port}"
        )
    if old.snapshot_location != new.snapshot_location:
        changes.append(
            f"snapshotsConfig.location {old.snapshot_location} -> {new.snapshot_location}"
        )
    if old.rootfs != new.rootfs:
        changes.append(
            f"rootfs {old.rootfs.kind}:{old.rootfs.path or ''} -> "
            f"{new.rootfs.kind}:{new.rootfs.path or ''}"
        )
    return "; ".join(changes) or "spec"


def template_in_use_message(old: TemplateSpec, new: TemplateSpec, actors: int) -> str:
    return (
        f"ActorTemplate {new.key} is used by {actors} actor(s) and cannot be changed while they "
        f"exist (their snapshots were taken under the current spec; changed: "
        f"{template_changes(old, new)}). Delete those actors first, or register the changed "
        "template under a new metadata.name"
    )


class ControlPlane:
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
        if workers < 1:
            raise ValueError("workers must be at least 1")
        self.store = store
        self.runtime = runtime
        self.state_dir = state_dir
        self.instance = instance
        self.workers = workers
        self.metrics = metrics
        self.start_timeout_s = start_timeout_s
        self.pool_labels = {"ate.dev/worker-pool": WORKER_POOL, "runtime": runtime.name}
        self.node_name = socket.gethostname()
        self._actors: dict[str, ActorRecord] = {}
        self._atespaces: set[str] = set()
        self._templates: dict[str, TemplateSpec] = {}
        self._golden: dict[str, GoldenRecord] = {}
        self._slots: list[str | None] = [None] * workers
        self._workers: list[WorkerRecord] = []
        self._busy: set[str] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._inflight: dict[str, asyncio.Task[Any]] = {}
        # called with a sandbox handle before it is checkpointed or stopped, so the router can
        # drop its pooled connections into it (a checkpoint with open connections fails, and a
        # pooled connection into a restored sandbox hangs)
        self.sandbox_listeners: list[Callable[[str], Awaitable[None]]] = []
        metrics.watch_state(self._status_counts, self._worker_counts)

    # ---------------------------------------------------------------- start / stop
    async def start(self, templates: list[TemplateSpec]) -> None:
        """Load state, adopt or recover actors, register templates and their golden snapshots."""
        self._atespaces = set(self.store.atespaces())
        for template, golden in self.store.templates():
            self._templates[template.key] = template
            if golden is not None:
                self._golden[template.key] = golden
        self._workers = self.store.workers(self.workers)
        self._actors = {record.key: record for record in self.store.actors()}
        await self.runtime.open()
        await self._recover()
        added = set()
        for template in templates:
            await self.add_template(template, keep_if_in_use=True)
            added.add(template.key)
        for key in list(self._templates):
            if key not in added:
                await self._ensure_golden(self._templates[key])

    async def _recover(self) -> None:
        keep: set[str] = set()
        for record in list(self._actors.values()):
            if record.status in (PAUSED, SUSPENDED):
                if record.retained_handle:
                    keep.add(record.retained_handle)
                continue
            template = self._templates.get(f"{record.template_namespace}/{record.template_name}")
            if (
                record.status == RUNNING
                and record.handle
                and record.slot is not None
                and record.slot < self.workers
                and self._slots[record.slot] is None
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
                    self._slots[record.slot] = record.key
                    keep.add(adopted.handle)
                    if adopted.address != record.address or adopted.handle != record.handle:
                        self._write(record, handle=adopted.handle, address=adopted.address)
                    log.info("adopted running actor %s at %s", record.key, adopted.address)
                    continue
            if record.handle:
                with contextlib.suppress(RuntimeFailure):
                    await self.runtime.stop(record.handle)
            if record.in_progress_snapshot:
                _remove_tree(record.in_progress_snapshot)
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
            self._write(
                record,
                status=SUSPENDED,
                slot=None,
                handle="",
                address="",
                pod_uid="",
                in_progress_snapshot="",
            )
        swept = await self.runtime.sweep(keep)
        for line in swept:
            log.warning("removed a sandbox no actor claims: %s", line)

    async def shutdown(self, *, suspend: bool = False, timeout_s: float = 120.0) -> None:
        """Wait for in-flight operations, then stop every sandbox (``local down``).

        With ``suspend`` every RUNNING actor is suspended first, so nothing it did is lost (with
        gVisor not even its memory); an actor whose suspend fails or overruns is killed and falls
        back to its last snapshot at the next start.
        """
        await self._drain_tasks()
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
                await self._drain_tasks()
        for record in list(self._actors.values()):
            for handle in (record.handle, record.retained_handle):
                await self._stop(handle)
        await self.runtime.cleanup()
        await self.runtime.close()

    async def detach(self) -> None:
        """Leave sandboxes running for the next start to adopt (control-plane restart)."""
        await self._drain_tasks()
        await self.runtime.close()

    async def _drain_tasks(self, timeout_s: float = 15.0) -> None:
        """Let in-flight workflows finish; cancel what is still running after ``timeout_s``."""
        if not self._tasks:
            return
        _, pending = await asyncio.wait(list(self._tasks), timeout=timeout_s)
        for task in pending:
            task.cancel()
        if pending:
            log.warning("cancelled %d lifecycle operations still running at shutdown", len(pending))
            await asyncio.wait(pending, timeout=5)

    # ---------------------------------------------------------------- templates
    @property
    def templates(self) -> dict[str, TemplateSpec]:
        return dict(self._templates)

    def golden(self, key: str) -> GoldenRecord | None:
        return self._golden.get(key)

    async def add_template(self, template: TemplateSpec, *, keep_if_in_use: bool = False) -> bool:
        """Register a template; returns True when it changed anything.

        Templates are immutable while actors use them (as Substrate's ActorTemplates are): an
        actor's own snapshot was taken under the old spec and may not restore under a new one,
        so a changed spec under a name some actor uses is refused (``ApiError``), or with
        ``keep_if_in_use`` (``local up`` re-registering the built-in template) kept as stored
        with a warning. A changed template no actor uses is replaced and its golden snapshot
        re-taken.
        """
        old = self._templates.get(template.key)
        if old == template:
            await self._ensure_golden(template)  # e.g. its golden snapshot folder was removed
            return False
        if old is not None:
            users = sum(
                1
                for record in self._actors.values()
                if f"{record.template_namespace}/{record.template_name}" == template.key
            )
            if users and keep_if_in_use:
                log.warning(
                    "template %s differs from the stored one (%s) but %d actor(s) use it; "
                    "keeping the stored template. Delete those actors (or use a fresh "
                    "--state-dir) to pick up the new one",
                    template.key,
                    template_changes(old, template),
                    users,
                )
                await self._ensure_golden(old)
                return False
            if users:
                raise ApiError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    template_in_use_message(old, template, users),
                )
        template.snapshot_location.mkdir(parents=True, exist_ok=True)
        self.store.put_template(template)
        self._templates[template.key] = template
        stale = self._golden.pop(template.key, None)
        if stale is not None:
            _remove_tree(stale.path)
            self.store.set_golden(template.namespace, template.name, None)
        await self._ensure_golden(template)
        return True

    async def _ensure_golden(self, template: TemplateSpec) -> None:
        golden = self._golden.get(template.key)
        if golden and golden.digest == template.digest() and _is_dir(golden.path):
            return
        if golden is not None:
            _remove_tree(golden.path)
            self._golden.pop(template.key, None)
            self.store.set_golden(template.namespace, template.name, None)
        try:
            slot = self._take_slot(f"golden:{template.key}")
        except ApiError:
            log.warning(
                "no free worker to take %s's golden snapshot; its actors cold-boot", template.key
            )
            return
        dest = _snapshot_dest(template.snapshot_location / f"ate-golden-{template.name}")
        try:
            result = await self.runtime.prepare_template(template, Slot(slot), dest)
        except RuntimeFailure as exc:
            _remove_tree(dest)
            log.warning(
                "golden snapshot of %s failed (%s); its actors cold-boot", template.key, exc
            )
            return
        finally:
            self._free_slot(slot)
        if result is None:
            return
        record = GoldenRecord(str(result.snapshot.path), template.digest())
        self._golden[template.key] = record
        self.store.set_golden(template.namespace, template.name, record)
        for kind, size in result.files:
            self.metrics.snapshot_size.labels(kind, template.namespace, template.name).observe(size)
        log.info("golden snapshot of %s: %s", template.key, record.path)

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

    def _status_counts(self) -> Mapping[str, int]:
        counts = Counter(record.status for record in self._actors.values())
        for name in (RUNNING, RESUMING, SUSPENDED, SUSPENDING, PAUSED, PAUSING):
            counts.setdefault(name, 0)
        return counts

    def _worker_counts(self) -> tuple[int, int]:
        busy = sum(1 for slot in self._slots if slot is not None)
        return busy, self.workers - busy

    def _take_slot(self, owner: str) -> int:
        for index, holder in enumerate(self._slots):
            if holder is None:
                self._slots[index] = owner
                self._bump_worker(index)
                return index
        raise ApiError(grpc.StatusCode.FAILED_PRECONDITION, "no free workers available")

    def _free_slot(self, index: int | None) -> None:
        if index is not None and 0 <= index < self.workers and self._slots[index] is not None:
            self._slots[index] = None
            self._bump_worker(index)

    def _bump_worker(self, index: int) -> None:
        version = self.store.bump_worker(index)
        self._workers[index] = dataclasses.replace(self._workers[index], version=version)

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
        key = f"{record.template_namespace}/{record.template_name}"
        template = self._templates.get(key)
        if template is None:
            raise ApiError(
                grpc.StatusCode.INTERNAL,
                f"while getting ActorTemplate {key}: not found (was the template removed?)",
            )
        return ActorSpec(record.atespace, record.actor_id, template)

    @contextlib.asynccontextmanager
    async def _lock(self, key: str) -> AsyncIterator[None]:
        if key in self._busy:
            raise ApiError(
                grpc.StatusCode.ABORTED, "another operation is in progress for this actor"
            )
        self._busy.add(key)
        try:
            yield
        finally:
            self._busy.discard(key)

    async def _detached(self, key: str, work: Callable[[], Awaitable[T]]) -> T:
        """Run a lifecycle workflow to completion even if the caller goes away.

        The actor is marked busy before the task is created, not when it first runs: a second
        call in the same loop turn is refused here instead of replacing this task's `_inflight`
        entry (which `wait_idle` relies on). Busy and `_inflight` are released together by the
        task's own done-callback, which runs before the caller sees the result.
        """
        if key in self._busy:
            raise ApiError(
                grpc.StatusCode.ABORTED, "another operation is in progress for this actor"
            )
        self._busy.add(key)

        async def run() -> T:
            return await work()

        try:
            task = asyncio.get_running_loop().create_task(run())
        except BaseException:
            self._busy.discard(key)
            raise
        self._tasks.add(task)
        self._inflight[key] = task

        def finished(done: asyncio.Task[T]) -> None:
            self._tasks.discard(done)
            if self._inflight.get(key) is done:
                del self._inflight[key]
                self._busy.discard(key)

        task.add_done_callback(finished)
        return await asyncio.shield(task)

    async def wait_idle(self, key: str, timeout_s: float) -> bool:
        """Wait until the operation in flight on ``key`` (if any) ends; True if one was waited."""
        task = self._inflight.get(key)
        if task is None:
            return False
        await asyncio.wait([task], timeout=timeout_s)
        return True

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
        if template_key not in self._templates:
            raise ApiError(
                grpc.StatusCode.FAILED_PRECONDITION, f"ActorTemplate {template_key} not found"
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
        if key in self._busy:
            raise ApiError(grpc.StatusCode.ABORTED, "concurrent update conflict, please retry")
        return self._write(record, worker_selector=dict(selector))

    def list_actors(
        self, page_size: int, page_token: str, atespace: str
    ) -> tuple[list[ActorRecord], str]:
        if page_size < 0 or page_size > 1000:
            raise ApiError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"page_size must be between 0 and 1000, got {page_size}",
            )
        size = page_size or 1000
        after = ""
        if page_token:
            try:
                after = base64.urlsafe_b64decode(page_token.encode()).decode()
            except (binascii.Error, UnicodeDecodeError, ValueError):
                raise ApiError(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "page_token is not one this server issued; pass next_page_token unchanged",
                ) from None
        keys = sorted(
            key
            for key, record in self._actors.items()
            if (not atespace or record.atespace == atespace) and key > after
        )
        page = [self._actors[key] for key in keys[:size]]
        token = ""
        if len(keys) > size:
            token = base64.urlsafe_b64encode(keys[size - 1].encode()).decode()
        return page, token

    def workers_list(self) -> list[tuple[WorkerRecord, ActorRecord | None]]:
        out: list[tuple[WorkerRecord, ActorRecord | None]] = []
        for index, worker in enumerate(self._workers):
            holder = self._slots[index]
            out.append((worker, self._actors.get(holder) if holder else None))
        return out

    def worker_pod(self, slot: int) -> str:
        return f"{self.instance}-{Slot(slot).name}"

    async def sandbox_gone(self, key: str, handle: str) -> bool:
        """Called when the agent of a RUNNING actor cannot be reached.

        If its sandbox really is gone, the actor falls back to SUSPENDED from its last snapshot
        (as after a crash) and True is returned, so the caller may resume it.
        """
        record = self._actors.get(key)
        if record is None or record.status != RUNNING or record.handle != handle:
            return record is not None and record.status != RUNNING
        if key in self._busy or await self.runtime.is_alive(handle):
            return False
        async with self._lock(key):
            record = self._get(key)
            if record.status != RUNNING or record.handle != handle:
                return True
            await self._stop(handle)
            self._free_slot(record.slot)
            self._write(
                record,
                status=SUSPENDED,
                slot=None,
                handle="",
                address="",
                pod_uid="",
                in_progress_snapshot="",
            )
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
        if record.status == RUNNING and key not in self._busy:
            return record
        return await self._detached(key, lambda: self._resume(key, boot))

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
        slot = self._take_slot(key)
        previous = record
        started_at = time.perf_counter()
        record = self._write(
            record,
            status=RESUMING,
            slot=slot,
            pod_uid=self._workers[slot].uid,
        )
        source, source_name = self._pick_source(record, spec.template, boot)
        try:
            started = await self.runtime.start(
                spec, Slot(slot), source, timeout_s=self.start_timeout_s
            )
        except (RuntimeFailure, OSError) as exc:
            self._free_slot(slot)
            self._write(record, status=previous.status, slot=None, pod_uid="")
            raise ApiError(
                grpc.StatusCode.INTERNAL, f"workflow failed at step CallAteletRestore: {exc}"
            ) from exc
        except BaseException:
            self._free_slot(slot)
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
            if _is_dir(record.snapshot_path):
                kind = SnapshotKind(record.snapshot_kind or "external")
                return SnapshotRef(kind, Path(record.snapshot_path)), kind.value
            log.warning(
                "actor %s: its snapshot %s is missing; starting it from its template instead",
                record.key,
                record.snapshot_path,
            )
        golden = self._golden.get(template.key)
        if not boot and golden and golden.digest == template.digest() and _is_dir(golden.path):
            return SnapshotRef(SnapshotKind.GOLDEN, Path(golden.path)), "golden"
        return None, "boot"

    async def pause_actor(self, atespace: str, actor_id: str) -> ActorRecord:
        key = self._ref(atespace, actor_id)
        self._get(key)
        return await self._detached(key, lambda: self._checkpoint(key, SnapshotKind.LOCAL))

    async def suspend_actor(self, atespace: str, actor_id: str) -> ActorRecord:
        key = self._ref(atespace, actor_id)
        self._get(key)
        return await self._detached(key, lambda: self._checkpoint(key, SnapshotKind.EXTERNAL))

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
            dest = _snapshot_dest(self.state_dir / "snapshots" / "local", f"{record.actor_id}-")
        else:
            dest = _snapshot_dest(spec.template.snapshot_location / record.actor_id)
        started_at = time.perf_counter()
        record = self._write(record, status=transit, in_progress_snapshot=str(dest))
        await self._release(record.handle)
        try:
            result = await self.runtime.checkpoint(spec, record.handle, kind, dest)
        except (RuntimeFailure, OSError) as exc:
            _remove_tree(dest)
            lost = getattr(exc, "sandbox_lost", False) or not await self.runtime.is_alive(
                record.handle
            )
            if lost:
                await self._stop(record.handle)
                self._free_slot(record.slot)
                self._write(
                    record,
                    status=SUSPENDED,
                    slot=None,
                    handle="",
                    address="",
                    pod_uid="",
                    in_progress_snapshot="",
                )
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
        self._free_slot(record.slot)
        record = self._write(
            record,
            status=target,
            slot=None,
            handle="",
            address="",
            pod_uid="",
            in_progress_snapshot="",
            snapshot_kind=result.snapshot.kind.value,
            snapshot_path=str(result.snapshot.path),
            retained_handle=result.retained_handle or "",
        )
        if old_snapshot and old_snapshot != record.snapshot_path:
            _remove_tree(old_snapshot)
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

        await self._detached(key, work)

    async def _forget(self, record: ActorRecord) -> None:
        for handle in (record.handle, record.retained_handle):
            await self._stop(handle)
        self._free_slot(record.slot)
        _remove_tree(record.snapshot_path)
        _remove_tree(record.in_progress_snapshot)
        template = self._templates.get(f"{record.template_namespace}/{record.template_name}")
        if template is not None:
            with contextlib.suppress(RuntimeFailure):
                await self.runtime.forget_actor(
                    ActorSpec(record.atespace, record.actor_id, template)
                )
        self.store.delete_actor(record.atespace, record.actor_id)
        self._actors.pop(record.key, None)

    async def debug_clear(self) -> None:
        if self._busy:
            raise ApiError(grpc.StatusCode.ABORTED, "operations are in progress; retry")
        for record in list(self._actors.values()):
            await self._forget(record)
        self.store.clear()
        self._atespaces.clear()

    # ---------------------------------------------------------------- protobuf views
    def actor_pb(self, record: ActorRecord) -> pb.Actor:
        actor = pb.Actor(
            actor_id=record.actor_id,
            version=record.version,
            actor_template_namespace=record.template_namespace,
            actor_template_name=record.template_name,
            status=pb.Actor.Status.Value(record.status),  # type: ignore[arg-type]
            in_progress_snapshot=record.in_progress_snapshot,
            atespace=record.atespace,
            worker_selector=pb.Selector(match_labels=record.worker_selector),
        )
        if record.slot is not None:
            actor.ateom_pod_namespace = WORKER_NAMESPACE
            actor.ateom_pod_name = self.worker_pod(record.slot)
            actor.ateom_pod_uid = record.pod_uid
            actor.worker_pool_name = WORKER_POOL
            actor.ateom_pod_ip = record.address
        if record.snapshot_kind == "local":
            actor.latest_snapshot_info.CopyFrom(
                pb.SnapshotInfo(
                    type=pb.SNAPSHOT_TYPE_LOCAL,
                    local=pb.LocalSnapshotInfo(
                        snapshot_prefix=record.snapshot_path,
                        node_vms_with_local_snapshots=[self.node_name],
                    ),
                )
            )
        elif record.snapshot_kind == "external":
            actor.latest_snapshot_info.CopyFrom(
                pb.SnapshotInfo(
                    type=pb.SNAPSHOT_TYPE_EXTERNAL,
                    external=pb.ExternalSnapshotInfo(
                        snapshot_uri_prefix=Path(record.snapshot_path).as_uri()
                    ),
                )
            )
        return actor

    def worker_pb(self, worker: WorkerRecord, actor: ActorRecord | None) -> pb.Worker:
        out = pb.Worker(
            worker_namespace=WORKER_NAMESPACE,
            worker_pool=WORKER_POOL,
            worker_pod=self.worker_pod(worker.slot),
            version=worker.version,
            worker_pod_uid=worker.uid,
            node_name=self.node_name,
        )
        if actor is not None:
            out.actor_namespace = actor.template_namespace
            out.actor_template = actor.template_name
            out.actor_id = actor.actor_id
            out.actor_atespace = actor.atespace
            out.ip = actor.address.rpartition(":")[0] if actor.address else ""
        return out


def _selector(message: pb.Selector) -> dict[str, str]:
    return dict(message.match_labels)


class ControlServicer(pb_grpc.ControlServicer):
    """gRPC front door: translate requests, time them, map ApiError to status codes."""

    def __init__(self, plane: ControlPlane) -> None:
        self.plane = plane

    async def _call(
        self,
        method: str,
        context: grpc.aio.ServicerContext[Any, Any],
        work: Callable[[], Awaitable[T]],
    ) -> T:
        started = time.perf_counter()
        code = grpc.StatusCode.OK
        try:
            return await work()
        except ApiError as exc:
            code = exc.code
            await context.abort(exc.code, exc.message)
            raise  # unreachable: abort raises
        except asyncio.CancelledError:
            code = grpc.StatusCode.CANCELLED
            raise
        except Exception as exc:
            if isinstance(exc, grpc.aio.AbortError):
                raise
            code = grpc.StatusCode.INTERNAL
            log.exception("%s failed", method)
            await context.abort(grpc.StatusCode.INTERNAL, f"internal server error: {exc}")
            raise
        finally:
            elapsed = time.perf_counter() - started
            self.plane.metrics.rpc_duration.labels(f"ateapi.Control/{method}", code.name).observe(
                elapsed
            )
            context.set_trailing_metadata((("x-server-elapsed-us", str(int(elapsed * 1e6))),))

    async def GetActor(self, request: pb.GetActorRequest, context: Any) -> pb.GetActorResponse:
        async def work() -> pb.GetActorResponse:
            ref = request.actor_ref
            record = self.plane.get_actor(ref.atespace, ref.name)
            return pb.GetActorResponse(actor=self.plane.actor_pb(record))

        return await self._call("GetActor", context, work)

    async def CreateActor(
        self, request: pb.CreateActorRequest, context: Any
    ) -> pb.CreateActorResponse:
        async def work() -> pb.CreateActorResponse:
            ref = request.actor_ref
            record = self.plane.create_actor(
                ref.atespace,
                ref.name,
                request.actor_template_namespace,
                request.actor_template_name,
                _selector(request.worker_selector),
            )
            return pb.CreateActorResponse(actor=self.plane.actor_pb(record))

        return await self._call("CreateActor", context, work)

    async def UpdateActor(
        self, request: pb.UpdateActorRequest, context: Any
    ) -> pb.UpdateActorResponse:
        async def work() -> pb.UpdateActorResponse:
            ref = request.actor_ref
            record = self.plane.update_actor(
                ref.atespace, ref.name, _selector(request.worker_selector)
            )
            return pb.UpdateActorResponse(actor=self.plane.actor_pb(record))

        return await self._call("UpdateActor", context, work)

    async def SuspendActor(
        self, request: pb.SuspendActorRequest, context: Any
    ) -> pb.SuspendActorResponse:
        async def work() -> pb.SuspendActorResponse:
            ref = request.actor_ref
            record = await self.plane.suspend_actor(ref.atespace, ref.name)
            return pb.SuspendActorResponse(actor=self.plane.actor_pb(record))

        return await self._call("SuspendActor", context, work)

    async def PauseActor(
        self, request: pb.PauseActorRequest, context: Any
    ) -> pb.PauseActorResponse:
        async def work() -> pb.PauseActorResponse:
            ref = request.actor_ref
            record = await self.plane.pause_actor(ref.atespace, ref.name)
            return pb.PauseActorResponse(actor=self.plane.actor_pb(record))

        return await self._call("PauseActor", context, work)

    async def ResumeActor(
        self, request: pb.ResumeActorRequest, context: Any
    ) -> pb.ResumeActorResponse:
        async def work() -> pb.ResumeActorResponse:
            ref = request.actor_ref
            record = await self.plane.resume_actor(ref.atespace, ref.name, request.boot)
            return pb.ResumeActorResponse(actor=self.plane.actor_pb(record))

        return await self._call("ResumeActor", context, work)

    async def DeleteActor(
        self, request: pb.DeleteActorRequest, context: Any
    ) -> pb.DeleteActorResponse:
        async def work() -> pb.DeleteActorResponse:
            ref = request.actor_ref
            await self.plane.delete_actor(ref.atespace, ref.name)
            return pb.DeleteActorResponse()

        return await self._call("DeleteActor", context, work)

    async def ListWorkers(
        self, request: pb.ListWorkersRequest, context: Any
    ) -> pb.ListWorkersResponse:
        async def work() -> pb.ListWorkersResponse:
            workers = [self.plane.worker_pb(w, a) for w, a in self.plane.workers_list()]
            return pb.ListWorkersResponse(workers=workers)

        return await self._call("ListWorkers", context, work)

    async def ListActors(
        self, request: pb.ListActorsRequest, context: Any
    ) -> pb.ListActorsResponse:
        async def work() -> pb.ListActorsResponse:
            if request.atespace:
                check_label(request.atespace, "atespace")
            records, token = self.plane.list_actors(
                request.page_size, request.page_token, request.atespace
            )
            return pb.ListActorsResponse(
                actors=[self.plane.actor_pb(r) for r in records], next_page_token=token
            )

        return await self._call("ListActors", context, work)

    async def CreateAtespace(
        self, request: pb.CreateAtespaceRequest, context: Any
    ) -> pb.CreateAtespaceResponse:
        async def work() -> pb.CreateAtespaceResponse:
            name = self.plane.create_atespace(request.name)
            return pb.CreateAtespaceResponse(atespace=pb.Atespace(name=name))

        return await self._call("CreateAtespace", context, work)

    async def GetAtespace(
        self, request: pb.GetAtespaceRequest, context: Any
    ) -> pb.GetAtespaceResponse:
        async def work() -> pb.GetAtespaceResponse:
            name = self.plane.get_atespace(request.name)
            return pb.GetAtespaceResponse(atespace=pb.Atespace(name=name))

        return await self._call("GetAtespace", context, work)

    async def ListAtespaces(
        self, request: pb.ListAtespacesRequest, context: Any
    ) -> pb.ListAtespacesResponse:
        async def work() -> pb.ListAtespacesResponse:
            names = self.plane.list_atespaces()
            return pb.ListAtespacesResponse(atespaces=[pb.Atespace(name=n) for n in names])

        return await self._call("ListAtespaces", context, work)

    async def DeleteAtespace(
        self, request: pb.DeleteAtespaceRequest, context: Any
    ) -> pb.DeleteAtespaceResponse:
        async def work() -> pb.DeleteAtespaceResponse:
            self.plane.delete_atespace(request.name)
            return pb.DeleteAtespaceResponse()

        return await self._call("DeleteAtespace", context, work)

    async def DebugClear(
        self, request: pb.DebugClearRequest, context: Any
    ) -> pb.DebugClearResponse:
        async def work() -> pb.DebugClearResponse:
            await self.plane.debug_clear()
            return pb.DebugClearResponse()

        return await self._call("DebugClear", context, work)


class SessionIdentityServicer(pb_grpc.SessionIdentityServicer):
    async def MintJWT(self, request: pb.MintJWTRequest, context: Any) -> pb.MintJWTResponse:
        await context.abort(
            grpc.StatusCode.UNIMPLEMENTED,
            "SessionIdentity is not available in the local backend (no cluster identity)",
        )
        raise AssertionError("unreachable")

    async def MintCert(self, request: pb.MintCertRequest, context: Any) -> pb.MintCertResponse:
        await context.abort(
            grpc.StatusCode.UNIMPLEMENTED,
            "SessionIdentity is not available in the local backend (no cluster identity)",
        )
        raise AssertionError("unreachable")
