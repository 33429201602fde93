"""Tags: a named copy of a SUSPENDED actor's durable snapshot, to create actors from.

CreateTag (controlapi/workflow_tag.go, tag.go) takes the source actor's lease, needs it
SUSPENDED and holding a durable snapshot (its own, or the one it borrowed from a tag), reserves
the tag with its storage IN_PROGRESS, copies the snapshot's files into the tag's own folder
(`<storage>/atespaces/<atespace>/tags/<tag uid>/`; hard links where the file system allows,
since snapshot files are never written again), marks it COMPLETED and answers. The tag's
snapshot belongs to the tag: suspending or deleting the actor does not touch it, and DeleteTag
removes it even while actors created from it still borrow it (they are stranded, as upstream's
proto says). UpdateTag changes the scope only.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import grpc

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.local.control.atespaces import check_preconditions
from gym_substrate.local.control.paging import check_page_request, page
from gym_substrate.local.control.records import (
    SUSPENDED,
    SnapshotRecord,
    Storage,
    TagRecord,
    new_meta,
)
from gym_substrate.local.control.validation import (
    FieldErrors,
    check_ref,
    check_short_name,
    validated_ref,
)
from gym_substrate.local.crashpoint import crash_point
from gym_substrate.local.errors import AteapiError
from gym_substrate.local.snapshots import commit_snapshot, partial_path, remove_snapshot

if TYPE_CHECKING:
    from gym_substrate.local.control.shared import Shared

__all__ = ["Tags", "copy_snapshot"]

log = logging.getLogger(__name__)

_SCOPES: dict[int, str] = {pb.TAG_SCOPE_ATESPACE: "ATESPACE", pb.TAG_SCOPE_PUBLISHED: "PUBLISHED"}


def copy_snapshot(source: Path, dest: Path) -> int:
    """Copy a snapshot folder (hard links where possible); the bytes it holds."""
    total = 0
    dest.mkdir(parents=True)
    for dirpath, dirnames, filenames in os.walk(source):
        rel = Path(dirpath).relative_to(source)
        for name in dirnames:
            (dest / rel / name).mkdir(exist_ok=True)
        for name in filenames:
            src, dst = Path(dirpath) / name, dest / rel / name
            if src.is_symlink():
                os.symlink(os.readlink(src), dst)
                continue
            try:
                os.link(src, dst)
            except OSError:
                shutil.copy2(src, dst)
            total += dst.stat().st_size
    return total


def _copy_and_commit(source: Path, dest: Path) -> int:
    """``copy_snapshot`` into ``dest``'s `.partial` twin, then fsync and rename it to ``dest``
    (`snapshots.commit_snapshot`), as pause checkpoints are: ``dest`` is complete or absent."""
    partial = partial_path(dest)
    remove_snapshot(partial)
    try:
        size = copy_snapshot(source, partial)
        crash_point("tag-copied-before-commit")
        commit_snapshot(partial, dest)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return size


def _scope(errors: FieldErrors, value: int) -> str:
    if value == pb.TAG_SCOPE_UNSPECIFIED:
        errors.required("tag.scope")
    elif value not in _SCOPES:
        errors.invalid("tag.scope", value, "must be between 1 and 2")
    return _SCOPES.get(value, "")


class Tags:
    def __init__(self, shared: Shared) -> None:
        self.shared = shared

    def _get(self, key: str) -> TagRecord:
        record = self.shared.state.tags.get(key)
        if record is None:
            raise AteapiError(grpc.StatusCode.NOT_FOUND, f"Tag {key} not found")
        return record

    # ---------------------------------------------------------------- RPCs
    async def create(self, request: pb.CreateTagRequest) -> TagRecord:
        errors = FieldErrors()
        tag = request.tag
        if not request.HasField("tag"):
            errors.required("tag")
            errors.raise_if_any()
        check_short_name(errors, "tag.metadata.atespace", tag.metadata.atespace)
        check_short_name(errors, "tag.metadata.name", tag.metadata.name)
        scope = _scope(errors, tag.scope)
        check_ref(errors, "tag.source_actor", tag.source_actor, tag.HasField("source_actor"))
        if (
            tag.metadata.atespace
            and tag.source_actor.atespace
            and tag.metadata.atespace != tag.source_actor.atespace
        ):
            errors.invalid(
                "tag.metadata.atespace", tag.metadata.atespace, "must match source_actor.atespace"
            )
        errors.raise_if_any()
        source = f"{tag.source_actor.atespace}/{tag.source_actor.name}"
        return await self.insert(f"{tag.metadata.atespace}/{tag.metadata.name}", source, scope)

    def get(self, request: pb.GetTagRequest) -> TagRecord:
        return self._get(validated_ref(request, "tag"))

    def list(self, request: pb.ListTagsRequest) -> tuple[list[TagRecord], str]:
        errors = FieldErrors()
        check_short_name(errors, "atespace", request.atespace, required=False)
        check_page_request(errors, request.page_size, request.page_token)
        errors.raise_if_any()
        rows = [
            r
            for r in self.shared.state.tags.values()
            if not request.atespace or r.meta.atespace == request.atespace
        ]
        return page(
            rows,
            lambda r: (r.meta.atespace, r.meta.name),
            kind="snapshot-tag",
            scope=request.atespace,
            page_size=request.page_size,
            page_token=request.page_token,
        )

    def update(self, request: pb.UpdateTagRequest) -> TagRecord:
        errors = FieldErrors()
        if not request.HasField("tag"):
            errors.required("tag")
            errors.raise_if_any()
        tag = request.tag
        check_short_name(errors, "tag.metadata.atespace", tag.metadata.atespace)
        check_short_name(errors, "tag.metadata.name", tag.metadata.name)
        scope = _scope(errors, tag.scope)  # request validation: before the store's checks
        errors.raise_if_any()
        key = f"{tag.metadata.atespace}/{tag.metadata.name}"
        for precondition in ("uid", "version"):
            if not getattr(tag.metadata, precondition):
                raise AteapiError(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"while updating tag {key}: persistence: precondition required: {precondition}",
                )
        record = self._get(key)
        if tag.metadata.uid != record.meta.uid:
            raise AteapiError(
                grpc.StatusCode.ABORTED, f"Tag {key} not found with uid {tag.metadata.uid}"
            )
        if tag.metadata.version != record.meta.version:
            raise AteapiError(grpc.StatusCode.ABORTED, "concurrent update conflict, please retry")
        source = f"{tag.source_actor.atespace}/{tag.source_actor.name}"
        if source != record.source_actor:
            raise AteapiError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"while updating tag {key}: tag.source_actor: Invalid value: "
                f'"{source}": field is immutable',
            )
        if record.snapshot is None or record.snapshot.completed("DURABLE") is None:
            raise AteapiError(
                grpc.StatusCode.FAILED_PRECONDITION, f"Tag {key} is still being created"
            )
        return self.shared.state.save(record, scope=scope)

    async def delete(self, request: pb.DeleteTagRequest) -> TagRecord:
        key = validated_ref(request, "tag")
        async with self.shared.locks.lock(f"tag:{key}", "tag"):
            record = self._get(key)
            check_preconditions("Tag", key, record.meta.uid, record.meta.version, request.options)
            await self.remove(record)
            return record

    # ---------------------------------------------------------------- internal
    async def recover(self) -> None:
        """At start: finish the tags a killed backend was copying. A copy committed before
        the kill is recorded COMPLETED; an unfinished one (its `.partial` folder) is removed
        with its tag, whose CreateTag never answered (a golden tag's build starts over)."""
        for record in list(self.shared.state.tags.values()):
            storage = record.snapshot.storage if record.snapshot is not None else ()
            pending = [s for s in storage if s.status == "IN_PROGRESS"]
            if record.snapshot is None or not pending:
                continue
            folder = Path(pending[0].path)
            await asyncio.to_thread(remove_snapshot, partial_path(folder))
            if await asyncio.to_thread(folder.is_dir):
                done = dataclasses.replace(pending[0], status="COMPLETED")
                snapshot = dataclasses.replace(record.snapshot, storage=(done,))
                self.shared.state.save(record, snapshot=snapshot)
                log.info("tag %s: its copy was complete before the restart: kept", record.meta.key)
            else:
                log.warning("tag %s: its copy was cut short by a restart: removed", record.meta.key)
                await self.remove(record)

    async def remove(self, record: TagRecord) -> None:
        """The tag and the snapshot it owns (the copy, even one half made)."""
        if record.snapshot is not None:
            for stored in record.snapshot.storage:
                await asyncio.to_thread(remove_snapshot, stored.path)
        self.shared.state.remove(record)

    async def insert(self, key: str, source: str, scope: str) -> TagRecord:
        """CreateTag's workflow: tag what the SUSPENDED actor ``source`` holds now."""
        shared = self.shared
        async with shared.locks.lock(source):
            actor = shared.state.actor(source)
            if actor.state != SUSPENDED:
                raise AteapiError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"Actor {source} must be ACTOR_STATE_SUSPENDED to be tagged "
                    f"(got: ACTOR_STATE_{actor.state})",
                )
            snapshot = actor.latest_durable()
            stored = snapshot.completed("DURABLE") if snapshot is not None else None
            if snapshot is None or stored is None:
                raise AteapiError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"Actor {source} holds no external snapshot to tag",
                )
            template = shared.template_of(actor)
            if key in shared.state.tags:
                raise AteapiError(
                    grpc.StatusCode.ALREADY_EXISTS,
                    f"Tag {key} already exists; delete it and create it again to retry",
                )
            atespace, _, name = key.partition("/")
            if atespace not in shared.state.atespaces:
                raise AteapiError(
                    grpc.StatusCode.FAILED_PRECONDITION, f"Atespace {atespace} not found"
                )
            meta = new_meta(atespace, name, shared.clock())
            folder = (
                shared.template_spec(template).snapshot_location
                / "atespaces"
                / atespace
                / "tags"
                / meta.uid
            )
            pending = Storage("DURABLE", "IN_PROGRESS", str(folder), stored.fidelity)
            record = shared.state.insert(
                TagRecord(
                    meta,
                    "PUBLISHED" if scope == "PUBLISHED" else "ATESPACE",
                    source,
                    snapshot.template_uid,
                    SnapshotRecord(1, "TAG", snapshot.template_uid, (pending,)),
                )
            )
            try:
                size = await asyncio.to_thread(_copy_and_commit, Path(stored.path), folder)
            except OSError as exc:
                log.warning("tag %s: copying %s failed: %s", key, stored.path, exc)
                raise AteapiError(
                    grpc.StatusCode.INTERNAL,
                    f"internal server error: while copying the snapshot of Actor {source} "
                    f"for Tag {key}: {exc}",
                ) from exc
            done = Storage("DURABLE", "COMPLETED", str(folder), stored.fidelity)
            shared.metrics.snapshot_size.labels(
                "tag", template.meta.atespace, template.meta.name
            ).observe(size)  # noqa: E501
            return shared.state.save(
                record, snapshot=SnapshotRecord(1, "TAG", snapshot.template_uid, (done,))
            )
