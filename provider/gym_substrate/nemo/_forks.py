"""Snapshots and forks on the provider: `snapshot` (NeMo Gym's call: the id as a string),
`take_snapshot` (the same, as a `SandboxSnapshot`), `describe_snapshot`, `fork`,
`delete_snapshot` and `list_snapshots`.

`SnapshotMethods` is a mixin of `SubstrateProvider` (it uses the provider's sandboxes, clients
and ledger). A snapshot is taken while `ManagedActor.suspended()` holds the sandbox SUSPENDED:
SuspendActor (a paused actor's node-local snapshot is uploaded, it is not woken), CreateTag,
GetTag until the copy is COMPLETED; the next call on the source resumes it. The ledger records
the snapshot before CreateTag, so even a reply lost on the way back leaves a record for
`gym-substrate sweep`. `fork` is one snapshot and `n` concurrent creates from it, all or nothing;
unless kept, its snapshot is deleted when the last of its children is closed here.

A caller's name that is not a DNS label (Gym's session checkpointer names snapshots after
session ids) is stored under a tag derived from it (`snapshot.tag_name`); the name itself is
kept in the ledger and in this process, where `list_snapshots` and `sweep --name` read it,
since a tag has no field to hold it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.nemo import _shared
from gym_substrate.nemo._actor import SubstrateActor
from gym_substrate.nemo._retry import RetryPolicy, is_transient_control, retry_target
from gym_substrate.nemo._tags import borrowers, from_tag, get_tag, wait_ready
from gym_substrate.nemo.control_client import ControlAPI, template_of
from gym_substrate.nemo.errors import (
    ActorNotFoundError,
    AlreadyExistsError,
    ControlPlaneError,
    SnapshotError,
    SnapshotInUseError,
    SubstrateCreateError,
    SubstrateError,
)
from gym_substrate.nemo.snapshot import (
    SandboxSnapshot,
    SnapshotCapabilities,
    SnapshotScope,
    capabilities_for,
    parse_snapshot,
)
from gym_substrate.nemo.snapshot import tag_name as snapshot_tag
from gym_substrate.nemo.types import SandboxHandle, SandboxSpec

if TYPE_CHECKING:
    import weakref

    from gym_substrate.nemo._managed import ManagedActor
    from gym_substrate.nemo._pty import SubstratePtySession
    from gym_substrate.nemo.config import ConnectionConfig, CreateConfig, LifecycleConfig
    from gym_substrate.nemo.ledger import LedgerRecorder

__all__ = ["FORK_MAX", "SnapshotMethods", "SnapshotSource"]

log = logging.getLogger("gym_substrate.provider")

FORK_MAX = 1024  # children per fork() call: more is almost surely a mistake (a typo, a loop)


@dataclass(frozen=True)
class SnapshotSource:
    """Where a new sandbox starts from, resolved before anything is made."""

    ref: str
    atespace: str
    scope: SnapshotScope
    template: str  # "" when the snapshot's template could not be found out
    workdir: str | None
    env: Mapping[str, str] | None  # None: the sandbox's own record says (read on first exec)


def _ref(tag: pb.Tag) -> str:
    return f"{tag.metadata.atespace}/{tag.metadata.name}"


def _check_scope(scope: object) -> SnapshotScope:
    if scope == "atespace" or scope == "published":
        return scope
    raise ValueError(
        f"scope must be 'atespace' (sandboxes from it only in its own atespace) or 'published' "
        f"(in any atespace), got {scope!r}"
    )


def _check_ttl(ttl_s: object) -> float | None:
    if ttl_s is None:
        return None
    if isinstance(ttl_s, bool) or not isinstance(ttl_s, int | float) or not ttl_s > 0:
        raise ValueError(f"ttl_s must be a number of seconds > 0 or None, got {ttl_s!r}")
    return float(ttl_s)


class SnapshotMethods:
    """`SupportsSandboxSnapshot` and `SupportsSandboxFork` for `SubstrateProvider`."""

    if TYPE_CHECKING:  # provided by SubstrateProvider
        connection: ConnectionConfig
        create_config: CreateConfig
        lifecycle: LifecycleConfig
        _retry: RetryPolicy
        _record: LedgerRecorder
        _ptys: dict[tuple[str, str], weakref.WeakSet[SubstratePtySession]]
        _lease: _shared.Lease

        def _resources(self) -> _shared.SharedResources: ...
        def _managed(self, handle: SandboxHandle) -> ManagedActor: ...
        def _key(self, managed: ManagedActor) -> tuple[str, str]: ...
        async def create(
            self, spec: SandboxSpec, *, snapshot: SandboxSnapshot | str | None = None
        ) -> SandboxHandle: ...
        async def close(self, handle: SandboxHandle) -> None: ...

    def _init_snapshots(self) -> None:
        # snapshot ref -> the children fork() made from it that are still open here
        self._fork_children: dict[str, set[tuple[str, str]]] = {}
        # snapshot ref -> the caller's name its tag was derived from (the ledger keeps it too)
        self._labels: dict[str, str] = {}

    # ------------------------------------------------------------------ capability

    def snapshot_capabilities(self) -> SnapshotCapabilities:
        """What a snapshot here captures and leaves out (no I/O; NeMo Gym #3275's report), as
        far as the server's era is known from an earlier call."""
        res = self._lease.resources
        return capabilities_for(getattr(res.control, "era", "") if res is not None else "")

    def validate_snapshots(self) -> None:
        """Gym's `validate_...()` convention: returns when snapshots can work (they can on every
        Substrate this provider accepts: tags and `source_tag` are part of its API)."""
        return

    # ------------------------------------------------------------------ snapshot

    @_shared.holding
    async def snapshot(self, handle: SandboxHandle, *, name: str | None = None) -> str:
        """Snapshot the sandbox as it is now; returns the id (`atespace/tag`) as a plain string.

        NeMo Gym's `SupportsSandboxSnapshot.snapshot()`: its session checkpointer stores the id
        and restores with `create()` and `provider_options["snapshot_id"]`. `name` may be any
        string (Gym's are `ng-<session id>-<unix time>`): one that is not a DNS label is stored
        under a tag derived from it and found by it in `list_snapshots()` and `sweep --name`.
        Such a snapshot has no TTL unless `lifecycle.snapshot_ttl_s` says, and `sweep` leaves it
        alone unless told (`--checkpoints`, or `--name` matching it). `take_snapshot()` returns
        the whole `SandboxSnapshot` instead.
        """
        taken = await self._take(handle, name, "atespace", None, checkpoint=True)
        return taken.ref

    @_shared.holding
    async def take_snapshot(
        self,
        handle: SandboxHandle,
        *,
        name: str | None = None,
        scope: SnapshotScope = "atespace",
        ttl_s: float | None = None,
    ) -> SandboxSnapshot:
        """As `snapshot()`, returning the whole `SandboxSnapshot` (source, template, fidelity,
        time, the source's workdir and env); `str()` of it is the id.

        The sandbox is suspended (a paused one is uploaded without waking), tagged, and the
        tag waited for until COMPLETED; its next call resumes it. A call in flight in it is
        `SnapshotBusyError` and nothing is taken. `scope="published"` lets other atespaces use
        it; `ttl_s` (default `lifecycle.snapshot_ttl_s`, none) is when `sweep` may delete it.
        """
        return await self._take(handle, name, scope, ttl_s, checkpoint=False)

    async def _take(
        self,
        handle: SandboxHandle,
        name: str | None,
        scope: SnapshotScope,
        ttl_s: float | None,
        *,
        checkpoint: bool,
    ) -> SandboxSnapshot:
        managed = self._managed(handle)
        actor = managed.actor
        tag_name = snapshot_tag(name, actor.actor_id)
        label = name if name is not None and name != tag_name else ""
        scope = _check_scope(scope)
        ttl = _check_ttl(ttl_s) if ttl_s is not None else self.lifecycle.snapshot_ttl_s
        key = self._key(managed)

        def detach() -> None:  # as pause() does: the sandbox is about to be suspended
            for session in list(self._ptys.get(key, ())):
                session.detach()

        async with managed.suspended(detach):
            await self._record.snapshot(
                "snapshot",
                actor.atespace,
                tag_name,
                source=actor.actor_id,
                template=actor.template,
                ttl_s=ttl,
                **({"label": label} if label else {}),
                **({"checkpoint": True} if checkpoint else {}),
            )
            tag = await self._tag_ready(actor, tag_name, scope, label or tag_name)
        if label:
            self._labels[f"{actor.atespace}/{tag_name}"] = label
        current = managed.actor
        known = managed.defaults_known
        return from_tag(
            tag,
            template=current.template,
            workdir=current.workdir if known else None,
            env=dict(current.env) if known else None,
            label=label,
        )

    async def _tag_ready(
        self, actor: SubstrateActor, tag_name: str, scope: SnapshotScope, asked: str
    ) -> pb.Tag:
        """CreateTag of the suspended source, then GetTag until COMPLETED; the ledger says
        when it failed (sweep deletes what is left)."""
        control = self._resources().control
        try:
            tag = await self._create_tag(control, actor, tag_name, scope)
            return await wait_ready(
                control,
                tag,
                self._retry.with_deadline(self.create_config.ready_timeout_s),
                what=f"snapshot of {actor.actor_id}",
            )
        except AlreadyExistsError as exc:
            await self._record.snapshot(
                "snapshot_not_made", actor.atespace, tag_name, error=str(exc)
            )
            raise SnapshotError(
                f"a snapshot named {asked!r} (tag {actor.atespace}/{tag_name}) already exists: "
                "pass another name, or delete_snapshot() that one first"
            ) from exc
        except BaseException as exc:  # cancelled too: a tag may be left, sweep deletes it
            with contextlib.suppress(BaseException):
                await asyncio.shield(
                    self._record.snapshot(
                        "snapshot_failed", actor.atespace, tag_name, error=repr(exc)
                    )
                )
            if isinstance(exc, SnapshotError) or not isinstance(exc, SubstrateError | OSError):
                raise
            raise SnapshotError(f"could not snapshot sandbox {actor.actor_id}: {exc}") from exc

    async def _create_tag(
        self, control: ControlAPI, actor: SubstrateActor, name: str, scope: SnapshotScope
    ) -> pb.Tag:
        """CreateTag, retried through transient codes; a retry that finds the tag our earlier
        attempt made (same source) takes it."""
        tries = 0

        async def attempt() -> pb.Tag:
            nonlocal tries
            tries += 1
            try:
                return await control.create_tag(
                    actor.atespace, name, actor.actor_id, published=scope == "published"
                )
            except AlreadyExistsError:
                if tries == 1:
                    raise
                found = await control.get_tag(actor.atespace, name)
                if found.source_actor.name != actor.actor_id:
                    raise
                return found

        return await retry_target(
            attempt,
            is_transient_control,
            RetryPolicy(0.05, 1.0, 2.0, 60.0, self._retry.pacer),
            what=f"CreateTag {actor.atespace}/{name}",
        )

    # ------------------------------------------------------------------ fork

    @_shared.holding
    async def fork(
        self,
        handle: SandboxHandle,
        n: int,
        *,
        name: str | None = None,
        keep_snapshot: bool = False,
    ) -> list[SandboxHandle]:
        """`n` new sandboxes, each starting from this sandbox's state right now.

        One snapshot, then `n` concurrent creates from it, each waiting out a full backend
        (RESOURCE_EXHAUSTED) as `create()` does, within `create.ready_timeout_s`. All or
        nothing: if any child fails, those made are closed and `SnapshotError` says why. The
        snapshot is deleted once the last child is closed here, unless `keep_snapshot` (the
        children's `handle.raw.snapshot` names it). The source stays usable.
        """
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= FORK_MAX:
            raise ValueError(f"n must be a whole number of sandboxes, 1..{FORK_MAX}, got {n!r}")
        if not isinstance(keep_snapshot, bool):
            raise ValueError(f"keep_snapshot must be True or False, got {keep_snapshot!r}")
        source = self._managed(handle).actor
        snap = await self.take_snapshot(handle, name=name)
        spec = SandboxSpec(provider_options={"atespace": source.atespace})
        outcomes = await asyncio.gather(
            *(self.create(spec, snapshot=snap) for _ in range(n)), return_exceptions=True
        )
        children = [o for o in outcomes if isinstance(o, SandboxHandle)]
        failures = [o for o in outcomes if isinstance(o, BaseException)]
        if not failures:
            if not keep_snapshot:
                self._fork_children[snap.ref] = {(c.raw.atespace, c.sandbox_id) for c in children}
            return children
        await asyncio.gather(*(self.close(c) for c in children), return_exceptions=True)
        if not keep_snapshot:
            await self._drop_snapshot(snap.ref)
        for failure in failures:
            if not isinstance(failure, Exception):  # cancelled, interrupted: not a fork failure
                raise failure
        raise SnapshotError(
            f"fork of sandbox {source.actor_id} into {n}: {len(failures)} of the {n} sandboxes "
            f"could not be created from snapshot {snap.ref} (first: {failures[0]}); the "
            f"{len(children)} made were closed"
        ) from failures[0]

    async def _after_close(self, actor: SubstrateActor) -> None:
        """A closed fork child: its fork's snapshot goes with the last of them."""
        ref = actor.snapshot
        children = self._fork_children.get(ref or "")
        if ref is None or children is None:
            return
        children.discard((actor.atespace, actor.actor_id))
        if not children:
            del self._fork_children[ref]
            await self._drop_snapshot(ref)

    async def _drop_snapshot(self, ref: str) -> None:
        try:
            await self.delete_snapshot(ref)
        except SubstrateError as exc:  # left for `sweep --snapshots`, or its TTL
            log.warning("could not delete fork snapshot %s (left for sweep): %s", ref, exc)

    # ------------------------------------------------------------------ list / delete

    @_shared.holding
    async def list_snapshots(self, *, atespace: str | None = None) -> list[SandboxSnapshot]:
        """The snapshots (tags) of the configured atespace, or of `atespace`, by name."""
        from gym_substrate.core.names import is_dns_label

        where = self.connection.atespace if atespace is None else atespace
        if not is_dns_label(where):
            raise ValueError(f"atespace must be a DNS label, got {atespace!r}")
        control = self._resources().control
        try:
            tags = await retry_target(
                lambda: control.list_tags(where), is_transient_control, self._retry, what="ListTags"
            )
        except SubstrateError as exc:
            raise SnapshotError(f"could not list the snapshots of atespace {where}: {exc}") from exc
        labels = await self._known_labels()
        return [from_tag(t, label=labels.get(_ref(t), "")) for t in tags]

    @_shared.holding
    async def describe_snapshot(self, snapshot_id: SandboxSnapshot | str) -> SandboxSnapshot:
        """What `snapshot()`'s id stands for: source, template, fidelity, time, the caller's
        name, and `borrowers`, the live sandboxes made from it that still run on its copy
        (while there are any, `delete_snapshot()` refuses). `SnapshotError` when it is gone."""
        atespace, name = parse_snapshot(snapshot_id, "snapshot_id")
        control = self._resources().control
        tag = await get_tag(control, atespace, name, self._retry)
        users = await borrowers(control, tag)
        template = ""
        with contextlib.suppress(ControlPlaneError):  # the source may be gone
            template = template_of(await control.get_actor(atespace, tag.source_actor.name))
        labels = await self._known_labels()
        return from_tag(
            tag, template=template, label=labels.get(_ref(tag), ""), borrowers=tuple(users)
        )

    async def _known_labels(self) -> dict[str, str]:
        """Snapshot ref -> the caller's name, for tags derived from one: this process's, and
        the ledger's (other processes', earlier runs')."""
        ledger = self._record.ledger
        labels: dict[str, str] = {}
        if ledger is not None:
            entries = await asyncio.to_thread(ledger.snapshots)
            api = self.connection.api
            labels = {e.ref: e.label for e in entries.values() if e.label and e.api == api}
        return {**labels, **self._labels}

    @_shared.holding
    async def delete_snapshot(
        self, snapshot_id: SandboxSnapshot | str, *, force: bool = False
    ) -> None:
        """Delete a snapshot by the id `snapshot()` returned; one already gone is done.

        Refused (`SnapshotInUseError`, naming them) while live sandboxes were made from it and
        have not suspended since: they still run on its copy, and deleting it would strand
        them. `force=True` deletes it anyway. (Gym's "stop and forget" stops the session's
        sandbox first, so nothing borrows it by then.)
        """
        atespace, name = parse_snapshot(snapshot_id, "snapshot_id")
        ref = f"{atespace}/{name}"
        control = self._resources().control
        try:
            tag = await get_tag(control, atespace, name, self._retry)
        except SnapshotError:
            await self._record.snapshot("snapshot_deleted", atespace, name, error="not found")
            return
        if not force:
            users = await borrowers(control, tag)
            if users:
                raise SnapshotInUseError(
                    f"snapshot {ref} is in use by {len(users)} live sandbox(es) made from it "
                    f"that have not suspended since: {', '.join(users)}. Deleting it would strand "
                    "them; close them (or let them suspend) first, or pass force=True",
                    borrowers=tuple(users),
                )
        try:
            await retry_target(
                lambda: control.delete_tag(atespace, name),
                is_transient_control,
                self._retry,
                what=f"DeleteTag {ref}",
            )
        except ActorNotFoundError:
            pass  # someone else deleted it meanwhile: done
        except SubstrateError as exc:
            raise SnapshotError(f"could not delete snapshot {ref}: {exc}") from exc
        self._fork_children.pop(ref, None)
        self._labels.pop(ref, None)
        await self._record.snapshot("snapshot_deleted", atespace, name)

    # ------------------------------------------------------------------ create from one

    async def _snapshot_source(self, value: Any, atespace: str) -> SnapshotSource:
        """What a sandbox made from snapshot `value` needs, checked before anything is made: the
        tag exists and is COMPLETED, its scope admits `atespace`, and its template."""
        try:
            tag_atespace, name = parse_snapshot(value, "snapshot")
        except ValueError as exc:
            raise SubstrateCreateError(str(exc)) from exc
        ref = f"{tag_atespace}/{name}"
        control = self._resources().control
        try:
            tag = await get_tag(control, tag_atespace, name, self._retry)
        except SnapshotError as exc:
            raise SubstrateCreateError(f"cannot create a sandbox from it: {exc}") from exc
        except SubstrateError as exc:
            raise SubstrateCreateError(f"could not look up snapshot {ref}: {exc}") from exc
        snap = from_tag(tag)
        if not snap.ready:
            raise SubstrateCreateError(
                f"snapshot {ref} is not usable: it is still being copied, or the snapshot() that "
                "made it failed half-way (delete_snapshot() it and take it again)"
            )
        if snap.scope == "atespace" and tag_atespace != atespace:
            raise SubstrateCreateError(
                f"snapshot {ref} can only make sandboxes in atespace {tag_atespace}, not "
                f"{atespace}: pass provider_options.atespace={tag_atespace!r}, or take it with "
                "scope='published'"
            )
        template = value.template if isinstance(value, SandboxSnapshot) else ""
        if not template:
            with contextlib.suppress(ControlPlaneError):  # the source may be gone: CreateActor says
                got = await control.get_actor(tag_atespace, tag.source_actor.name)
                template = template_of(got)
        known = isinstance(value, SandboxSnapshot) and value.env is not None
        return SnapshotSource(
            ref=ref,
            atespace=tag_atespace,
            scope=snap.scope,
            template=template,
            workdir=value.workdir if known else None,
            env=dict(value.env or {}) if known else None,
        )
