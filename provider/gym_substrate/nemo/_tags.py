"""Tags as snapshots: the ateapi calls behind `snapshot()`, `delete_snapshot()` and `create()`
from a snapshot.

`CreateActor(source_tag)` starts a new actor from a tag; that actor *borrows* the tag's snapshot
(status.snapshots holds a generation owned by the tag) until its first suspend writes its own, so
a tag deleted before then strands it (upstream's DeleteTag does not check). `borrowers` finds
such actors; the provider refuses to delete a tag they still use.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.nemo._retry import RetryPolicy, is_transient_control, retry_target
from gym_substrate.nemo.control_client import ControlAPI, tag_fidelity, tag_ready, tag_uri
from gym_substrate.nemo.errors import (
    ActorNotFoundError,
    ControlPlaneError,
    RetryError,
    SnapshotError,
)
from gym_substrate.nemo.snapshot import SandboxSnapshot, SnapshotScope

__all__ = ["borrowers", "from_tag", "get_tag", "wait_ready"]

log = logging.getLogger("gym_substrate.provider")


def _scope(tag: pb.Tag) -> SnapshotScope:
    return "published" if tag.scope == pb.TAG_SCOPE_PUBLISHED else "atespace"


def from_tag(
    tag: pb.Tag,
    *,
    template: str = "",
    workdir: str | None = None,
    env: Mapping[str, str] | None = None,
    label: str = "",
    borrowers: tuple[str, ...] | None = None,
) -> SandboxSnapshot:
    """The `SandboxSnapshot` a tag stands for."""
    created = tag.metadata.create_time
    return SandboxSnapshot(
        ref=f"{tag.metadata.atespace}/{tag.metadata.name}",
        source=tag.source_actor.name,
        template=template,
        created_at=created.seconds + created.nanos / 1e9 if created.seconds else 0.0,
        fidelity=tag_fidelity(tag),
        scope=_scope(tag),
        ready=tag_ready(tag),
        workdir=workdir,
        env=dict(env) if env is not None else None,
        label=label,
        borrowers=borrowers,
    )


class _StillCopying(SnapshotError):
    pass


async def wait_ready(control: ControlAPI, tag: pb.Tag, policy: RetryPolicy, *, what: str) -> pb.Tag:
    """The tag once its copy is COMPLETED (GetTag until then, within `policy.deadline`)."""
    if tag_ready(tag):
        return tag
    atespace, name = tag.metadata.atespace, tag.metadata.name

    async def look() -> pb.Tag:
        found = await control.get_tag(atespace, name)
        if not tag_ready(found):
            raise _StillCopying(f"{what}: tag {atespace}/{name} is still being copied")
        return found

    try:
        return await retry_target(
            look,
            lambda exc: isinstance(exc, _StillCopying) or is_transient_control(exc),
            policy,
            what=what,
        )
    except RetryError as exc:
        raise SnapshotError(
            f"{what}: snapshot {atespace}/{name} was not COMPLETED within {policy.deadline:g} s "
            "(create.ready_timeout_s); it is left for delete_snapshot() or `gym-substrate sweep "
            "--snapshots`"
        ) from exc


def _borrows(actor: pb.Actor, ref: str, uri: str) -> bool:
    """The actor was made from the tag and still holds the tag-owned generation (its first
    suspend has not replaced it yet)."""
    if actor.status.state == pb.ACTOR_STATE_DELETING:
        return False
    if f"{actor.source_tag.atespace}/{actor.source_tag.name}" != ref:
        return False
    for snapshot in actor.status.snapshots:
        if snapshot.owner != pb.SNAPSHOT_OWNER_TAG:
            continue
        uris = {s.object.snapshot_uri for s in snapshot.storage if s.object.snapshot_uri}
        if not uri or not uris or uri in uris:
            return True
    return False


async def borrowers(control: ControlAPI, tag: pb.Tag) -> list[str]:
    """Live actors (`atespace/name`) that still borrow the tag's snapshot.

    A tag scoped to its atespace can only have been used there; a published one is looked for
    in every atespace the caller may list (its own at least).
    """
    atespace = tag.metadata.atespace
    ref = f"{atespace}/{tag.metadata.name}"
    uri = tag_uri(tag)
    if tag.scope == pb.TAG_SCOPE_PUBLISHED:
        try:
            actors = await control.list_actors("")
        except ControlPlaneError as exc:
            if exc.code is None or exc.code.name != "PERMISSION_DENIED":
                raise
            log.info("cannot list every atespace (%s); looking in %s only", exc, atespace)
            actors = await control.list_actors(atespace)
    else:
        actors = await control.list_actors(atespace)
    return sorted(
        f"{a.metadata.atespace}/{a.metadata.name}" for a in actors if _borrows(a, ref, uri)
    )


async def get_tag(control: ControlAPI, atespace: str, name: str, policy: RetryPolicy) -> pb.Tag:
    """GetTag through transient codes; `SnapshotError` when there is no such snapshot."""
    try:
        return await retry_target(
            lambda: control.get_tag(atespace, name),
            is_transient_control,
            policy,
            what=f"GetTag {atespace}/{name}",
        )
    except ActorNotFoundError as exc:
        raise SnapshotError(
            f"snapshot {atespace}/{name} does not exist (list_snapshots() shows the atespace's)"
        ) from exc
