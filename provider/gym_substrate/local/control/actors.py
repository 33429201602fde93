"""Actors as records: Create, Get, Update, Delete and List (controlapi/actor.go,
workflow_delete.go).

A new actor is SUSPENDED on its source: an explicit `source_tag`, else its template's golden
tag, borrowed as generation 1 (owner TAG) until its first suspend writes its own; with neither
(a template whose golden build has not ended, as the golden actor's own) its first resume
cold-boots, and a golden tag the template names but that is gone is `Tag not found`. The
checks on a source tag, in upstream's order, all answer FAILED_PRECONDITION. Update replaces
the spec (uid and version are preconditions; a missing one is INVALID_ARGUMENT, a stale one
ABORTED). Delete takes the actor's lease, checks DeleteOptions before the state, needs
SUSPENDED or CRASHED unless `any_state`, marks DELETING, stops what runs, removes the actor's
own snapshots (never a tag's) and answers the record as deleted.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from typing import TYPE_CHECKING

import grpc

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.local.control.atespaces import check_preconditions
from gym_substrate.local.control.paging import check_page_request, page
from gym_substrate.local.control.records import (
    CRASHED,
    DELETING,
    SUSPENDED,
    ActorRecord,
    SnapshotRecord,
    TemplateRecord,
    new_meta,
)
from gym_substrate.local.control.store import StateFolderFull
from gym_substrate.local.control.transitions import guard
from gym_substrate.local.control.validation import (
    FieldErrors,
    check_ref,
    check_selector,
    check_short_name,
    validated_ref,
)
from gym_substrate.local.errors import AteapiError
from gym_substrate.local.runtimes.base import RuntimeFailure
from gym_substrate.local.snapshots import remove_snapshot

if TYPE_CHECKING:
    from gym_substrate.local.control.crashes import Crashes
    from gym_substrate.local.control.shared import Shared

__all__ = ["Actors"]

log = logging.getLogger(__name__)


class Actors:
    def __init__(self, shared: Shared, crashes: Crashes) -> None:
        self.shared = shared
        self.crashes = crashes

    # ---------------------------------------------------------------- RPCs
    def get(self, request: pb.GetActorRequest) -> ActorRecord:
        return self.shared.state.actor(validated_ref(request, "actor"))

    def create(self, request: pb.CreateActorRequest) -> ActorRecord:
        errors = FieldErrors()
        actor = request.actor
        if not request.HasField("actor"):
            errors.required("actor")
            errors.raise_if_any()
        if not actor.HasField("metadata"):
            errors.required("actor.metadata")
        else:
            check_short_name(errors, "actor.metadata.atespace", actor.metadata.atespace)
            check_short_name(errors, "actor.metadata.name", actor.metadata.name)
        check_ref(
            errors, "actor.actor_template", actor.actor_template, actor.HasField("actor_template")
        )
        if actor.HasField("source_tag"):
            check_ref(errors, "actor.source_tag", actor.source_tag, True)
        if actor.HasField("worker_selector"):
            check_selector(
                errors, "actor.worker_selector", dict(actor.worker_selector.match_labels)
            )
        errors.raise_if_any()
        template_key = f"{actor.actor_template.atespace}/{actor.actor_template.name}"
        template = self.shared.state.templates.get(template_key)
        if template is None:
            raise AteapiError(
                grpc.StatusCode.FAILED_PRECONDITION,
                "actor template not found",
            )
        source = (
            f"{actor.source_tag.atespace}/{actor.source_tag.name}"
            if actor.HasField("source_tag")
            else None
        )
        return self.insert(
            actor.metadata.atespace,
            actor.metadata.name,
            template,
            source=source,
            selector=dict(actor.worker_selector.match_labels),
        )

    def update(self, request: pb.UpdateActorRequest) -> ActorRecord:
        errors = FieldErrors()
        if not request.HasField("actor"):
            errors.required("actor")
            errors.raise_if_any()
        actor = request.actor
        if not actor.HasField("metadata"):
            errors.required("actor.metadata")
            errors.raise_if_any()
        check_short_name(errors, "actor.metadata.atespace", actor.metadata.atespace)
        check_short_name(errors, "actor.metadata.name", actor.metadata.name)
        if actor.HasField("worker_selector"):
            check_selector(
                errors, "actor.worker_selector", dict(actor.worker_selector.match_labels)
            )
        errors.raise_if_any()
        key = f"{actor.metadata.atespace}/{actor.metadata.name}"
        for precondition in ("uid", "version"):
            if not getattr(actor.metadata, precondition):
                raise AteapiError(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"while updating actor {key}: persistence: precondition required: "
                    f"{precondition}",
                )
        record = self.shared.state.actors.get(key)
        if record is None:
            raise AteapiError(grpc.StatusCode.NOT_FOUND, f"actor {key} not found")
        if actor.metadata.uid != record.meta.uid or actor.metadata.version != record.meta.version:
            raise AteapiError(grpc.StatusCode.ABORTED, "concurrent update conflict, please retry")
        source = (
            f"{actor.source_tag.atespace}/{actor.source_tag.name}"
            if actor.HasField("source_tag")
            else ""
        )
        if source != record.source_tag:
            raise AteapiError(
                grpc.StatusCode.INVALID_ARGUMENT, "source_tag: Invalid value: field is immutable"
            )
        changes: dict[str, object] = {"worker_selector": dict(actor.worker_selector.match_labels)}
        template_key = f"{actor.actor_template.atespace}/{actor.actor_template.name}"
        if template_key != record.template:
            changes.update(self._repoint(record, template_key))
        return self.shared.state.save(record, **changes)

    def _repoint(self, record: ActorRecord, template_key: str) -> dict[str, object]:
        """A new template for a SUSPENDED actor: same sandbox config and storage location."""
        if record.state != SUSPENDED:
            raise AteapiError(
                grpc.StatusCode.FAILED_PRECONDITION,
                "actor must be ACTOR_STATE_SUSPENDED to change its actor template "
                f"(got: ACTOR_STATE_{record.state})",
            )
        new = self.shared.state.templates.get(template_key)
        if new is None:
            raise AteapiError(
                grpc.StatusCode.FAILED_PRECONDITION,
                "actor template not found",
            )
        old = self.shared.state.templates.get(record.template)
        if old is not None:
            before, after = (pb.ActorTemplate.FromString(t.message) for t in (old, new))
            if list(before.volumes) != list(after.volumes):
                raise AteapiError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    "volumes differ between the current and the new actor template; volumes "
                    "must be identical to repoint an actor",
                )
            owns = any(s.owner == "ACTOR" for s in record.snapshots)
            location = before.snapshot_config.storage_location
            if owns and location != after.snapshot_config.storage_location:
                raise AteapiError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f'the actor\'s snapshots are stored under "{location}" but the new actor '
                    f'template stores them under "{after.snapshot_config.storage_location}": the '
                    "storage location must be identical to repoint an actor that owns a snapshot",
                )
        return {"template": template_key, "template_uid": new.meta.uid}

    def list(self, request: pb.ListActorsRequest) -> tuple[list[ActorRecord], str]:
        errors = FieldErrors()
        check_short_name(errors, "atespace", request.atespace, required=False)
        check_page_request(errors, request.page_size, request.page_token)
        errors.raise_if_any()
        rows = [
            r
            for r in self.shared.state.actors.values()
            if not request.atespace or r.atespace == request.atespace
        ]
        return page(
            rows,
            lambda r: (r.atespace, r.name),
            kind="actor",
            scope=request.atespace,
            page_size=request.page_size,
            page_token=request.page_token,
        )

    async def delete(self, request: pb.DeleteActorRequest) -> ActorRecord:
        key = validated_ref(request, "actor")
        async with (
            self.shared.locks.lock(key),
            guard(self.shared.state, self.crashes, key, "delete"),
        ):
            record = self.shared.state.actor(key)
            check_preconditions("Actor", key, record.meta.uid, record.meta.version, request.options)
            if record.state not in (SUSPENDED, CRASHED, DELETING) and not request.any_state:
                raise AteapiError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"Actor {key} is not in a deletable state (state: ACTOR_STATE_{record.state})",
                )
            return await self.remove(record)

    # ---------------------------------------------------------------- internal
    def insert(
        self,
        atespace: str,
        name: str,
        template: TemplateRecord,
        *,
        source: str | None,
        selector: dict[str, str] | None = None,
    ) -> ActorRecord:
        """A new SUSPENDED actor on its source tag (explicit, else the golden one)."""
        borrowed = self._source(atespace, template, source)
        state = self.shared.state
        key = f"{atespace}/{name}"
        if key in state.actors:
            raise AteapiError(grpc.StatusCode.ALREADY_EXISTS, f"Actor {name} already exists")
        if atespace not in state.atespaces:
            raise AteapiError(grpc.StatusCode.FAILED_PRECONDITION, f"Atespace {atespace} not found")
        return state.insert(
            ActorRecord(
                meta=new_meta(atespace, name, self.shared.clock()),
                template=template.meta.key,
                template_uid=template.meta.uid,
                worker_selector=dict(selector or {}),
                source_tag=source or "",
                snapshots=(borrowed,) if borrowed is not None else (),
                last_generation=1 if borrowed is not None else 0,
            )
        )

    def _source(
        self, atespace: str, template: TemplateRecord, source: str | None
    ) -> SnapshotRecord | None:
        """The snapshot a new actor borrows; upstream's checks on the tag, in its order."""
        fail = grpc.StatusCode.FAILED_PRECONDITION
        key = source or template.golden_tag
        if not key:
            return None
        tag = self.shared.state.tags.get(key)
        if tag is None:
            # the template names a golden tag that is gone: refused as a missing source tag
            # is (resolveTagSource; only a template with no golden tag yet, as the golden
            # builder's own actor, boots cold)
            raise AteapiError(fail, "Tag not found")
        if tag.scope == "ATESPACE" and tag.meta.atespace != atespace:
            raise AteapiError(fail, "Tag is not published outside its Atespace")
        stored = tag.snapshot.completed("DURABLE") if tag.snapshot is not None else None
        if tag.snapshot is None or stored is None:
            raise AteapiError(fail, "source Tag is still being created or failed creation")
        if tag.template_uid != template.meta.uid:
            raise AteapiError(
                fail,
                "source Tag must be taken from an actor with ActorTemplate uid "
                f'"{tag.template_uid}"',
            )
        return SnapshotRecord(1, "TAG", tag.template_uid, (stored,))

    async def remove(self, record: ActorRecord) -> ActorRecord:
        """Mark DELETING, stop what runs, free the worker and the actor's own snapshots."""
        shared = self.shared
        try:
            deleting = shared.state.save(record, state=DELETING)
        except StateFolderFull as exc:
            # a full state folder must not keep what fills it: free the actor first (a crash
            # before its row goes leaves it as it was stored, its sandbox gone: CRASHED at start)
            log.warning("actor %s: deleting without marking it DELETING: %s", record.key, exc)
            deleting = shared.state.mark(record, state=DELETING)
        for handle in (record.handle, record.retained_handle):
            await shared.stop_sandbox(handle)
        shared.pool.release(record.slot, record.key)
        for snapshot in record.snapshots:
            if snapshot.owner == "ACTOR":
                for stored in snapshot.storage:
                    await asyncio.to_thread(remove_snapshot, stored.path)
        template = shared.state.templates.get(record.template)
        if template is not None:
            with contextlib.suppress(RuntimeFailure, ValueError):
                spec = shared.spec(record, template)
                await shared.runtime.forget_actor(spec)
        shared.state.remove(deleting)
        return dataclasses.replace(deleting, handle="", slot=None, worker="")
