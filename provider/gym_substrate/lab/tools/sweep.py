"""Delete actors and snapshots that rollouts left behind (the library behind `gym-substrate sweep`).

Substrate never deletes an idle actor or a tag and has no TTL, so a trainer that crashed (or was
killed between create and close) leaks actors, and the snapshots (tags) it took keep their
storage. The provider's ledger records every actor and snapshot it made. By default sweep deletes
the ledger's actors past their `ttl_s` or whose creating process is gone, then its snapshots past
their `ttl_s` or whose snapshot() failed half-way (a snapshot outliving its process is kept: it
may be a checkpoint to restart from). `everything`, `name` (a glob) and `states` select instead
from the live listing of the atespace, ledger or not; with `snapshots` the sweep is of snapshots
only: every one the ledger recorded, or with `everything`/`name` the atespace's tags. `name`
matches a snapshot's tag or the name its caller gave (Gym's `ng-<session id>-<time>`, whose tag
was derived from it).

A snapshot that NeMo Gym's session checkpointer took (`snapshot()`, marked `checkpoint` in the
ledger) is the checkpointer's to forget: only its TTL, when `lifecycle.snapshot_ttl_s` set one,
a `name` that matches it, or `checkpoints` deletes it; `snapshots` and `everything` leave it.

A snapshot that live sandboxes were made from and have not suspended away from yet is never
deleted (that would strand them): its result is a refusal that names them. Nothing outside the
configured atespace is ever touched: ledger entries made in another atespace are left alone.
Actors go first, those holding a worker before parked ones, so a sweep that deletes a snapshot's
last borrowers can delete it too and nothing waits behind a full pool. Deletion reuses the
provider's own paths (one DeleteActor with `any_state`, which needs no worker even for a PAUSED
actor, retried through transient codes; `delete_snapshot`, which checks for borrowers; NOT_FOUND
is done).
"""

from __future__ import annotations

import fnmatch
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

__all__ = [
    "STATES",
    "Selection",
    "SweepResult",
    "SweepTarget",
    "delete_planned",
    "delete_targets",
    "find_targets",
    "plan_sweep",
    "sweep_actors",
]

STATES = (
    "RUNNING",
    "RESUMING",
    "PAUSING",
    "PAUSED",
    "SUSPENDING",
    "SUSPENDED",
    "CRASHED",
    "REVERTING",
)
GOLDEN_ATESPACE = "ate-golden"  # templates' golden tags: theirs, never swept


@dataclass
class SweepResult:
    name: str  # the actor's id, or the snapshot's tag name
    atespace: str
    reason: str
    deleted: bool
    error: str = ""
    kind: str = "actor"  # actor | snapshot

    @property
    def actor_id(self) -> str:
        return self.name


@dataclass(frozen=True)
class SweepTarget:
    name: str
    atespace: str
    reason: str
    state: str = ""
    kind: str = "actor"

    @property
    def actor_id(self) -> str:
        return self.name

    def skipped(self, why: str) -> SweepResult:
        return SweepResult(self.name, self.atespace, self.reason, False, why, self.kind)


def _selection(everything: bool, name: str | None, states: Collection[str] | None) -> str:
    parts = []
    if name is not None:
        parts.append(f"name matches {name}")
    if states:
        parts.append(f"state {'/'.join(sorted(states))}")
    return ", ".join(parts) or ("--all" if everything else "")


async def find_targets(
    provider: Any,
    *,
    everything: bool = False,
    name: str | None = None,
    states: Collection[str] | None = None,
    snapshots: bool = False,
    checkpoints: bool = False,
) -> list[SweepTarget]:
    """What a sweep would delete, in the provider's configured atespace only (actors first)."""
    if snapshots:
        if states:
            raise ValueError("--state selects actors; it cannot be combined with --snapshots")
        return await _snapshot_targets(
            provider, everything=everything, name=name, checkpoints=checkpoints
        )
    targets = await _actor_targets(provider, everything=everything, name=name, states=states)
    if not (everything or name is not None or states):
        targets += _ledger_snapshots(provider, every=False, checkpoints=checkpoints)
    return targets


async def _actor_targets(
    provider: Any, *, everything: bool, name: str | None, states: Collection[str] | None
) -> list[SweepTarget]:
    from gym_substrate.nemo.control_client import actor_state
    from gym_substrate.nemo.ledger import Ledger

    atespace = provider.connection.atespace
    wanted = {s.upper() for s in states} if states else None
    targets: list[SweepTarget] = []
    if everything or name is not None or wanted:
        reason = _selection(everything, name, wanted)
        for found in await provider.control.list_actors(atespace):
            actor_id = found.metadata.name
            if (found.metadata.atespace or atespace) != atespace:
                continue
            state = actor_state(found)
            if name is not None and not fnmatch.fnmatchcase(actor_id, name):
                continue
            if wanted and state not in wanted:
                continue
            targets.append(SweepTarget(actor_id, atespace, reason, state))
        return targets
    if provider.lifecycle.ledger is None:
        return targets
    now = time.time()
    for entry in Ledger(provider.lifecycle.ledger).entries().values():
        if entry.api != provider.connection.api or entry.state == "deleted":
            continue
        if entry.atespace != atespace:  # never outside the configured atespace
            continue
        if entry.state == "close_failed":
            reason = "close failed earlier"
        elif entry.expired(now):
            reason = f"past ttl_s {entry.ttl_s:g}"
        elif entry.orphaned():
            reason = f"creating process {entry.pid} is gone"
        else:
            continue
        targets.append(SweepTarget(entry.actor_id, entry.atespace, reason))
    return targets


def _ledger_entries(provider: Any) -> list[Any]:
    """The ledger's snapshot entries of this provider's API and atespace."""
    from gym_substrate.nemo.ledger import Ledger

    if provider.lifecycle.ledger is None:
        return []
    atespace, api = provider.connection.atespace, provider.connection.api
    return [
        entry
        for entry in Ledger(provider.lifecycle.ledger).snapshots().values()
        if entry.api == api and entry.atespace == atespace
    ]


def _ledger_snapshots(provider: Any, *, every: bool, checkpoints: bool) -> list[SweepTarget]:
    """The ledger's snapshots in the atespace: past their TTL or failed half-way (`every`: all
    it recorded and did not delete, but checkpoints unless `checkpoints`)."""
    now = time.time()
    targets = []
    for entry in _ledger_entries(provider):
        if entry.state == "snapshot_failed":
            reason = "snapshot() failed half-way"
        elif entry.state != "snapshot":
            continue
        elif entry.expired(now):
            reason = f"past ttl_s {entry.ttl_s:g}"
        elif every and (checkpoints or not entry.checkpoint):
            reason = f"taken by process {entry.pid} of {entry.source}"
        else:
            continue
        targets.append(
            SweepTarget(entry.tag, entry.atespace, _named(reason, entry.label), "", "snapshot")
        )
    return targets


def _named(reason: str, label: str) -> str:
    return f"{reason} (named {label!r})" if label else reason


async def _snapshot_targets(
    provider: Any, *, everything: bool, name: str | None, checkpoints: bool
) -> list[SweepTarget]:
    atespace = provider.connection.atespace
    if atespace == GOLDEN_ATESPACE:
        raise ValueError(
            f"atespace {GOLDEN_ATESPACE} holds the templates' golden snapshots: they are the "
            "templates' to delete, never swept"
        )
    if not (everything or name is not None):
        return _ledger_snapshots(provider, every=True, checkpoints=checkpoints)
    reason = _selection(everything, name, None)
    kept = (
        set()
        if checkpoints
        else {e.tag for e in _ledger_entries(provider) if e.checkpoint and e.state == "snapshot"}
    )
    targets = []
    for snap in await provider.list_snapshots():
        if name is not None:
            if not any(fnmatch.fnmatchcase(n, name) for n in (snap.name, snap.label) if n):
                continue
        elif snap.name in kept:  # --all: a checkpoint only when told (--checkpoints, --name)
            continue
        targets.append(SweepTarget(snap.name, atespace, _named(reason, snap.label), "", "snapshot"))
    return targets


async def _delete_one(provider: Any, target: SweepTarget) -> SweepResult:
    from gym_substrate.nemo.errors import SnapshotInUseError

    try:
        if target.kind == "snapshot":
            await provider.delete_snapshot(f"{target.atespace}/{target.name}")
        else:
            await provider.delete_actor(target.name, target.atespace)
    except SnapshotInUseError as exc:
        return target.skipped(
            f"refused: in use by live sandboxes {', '.join(exc.borrowers)} (made from it and "
            "not suspended since): deleting it would strand them; close them first"
        )
    except Exception as exc:  # report every one, keep going
        return target.skipped(str(exc))
    return SweepResult(target.name, target.atespace, target.reason, True, kind=target.kind)


# The order actors are deleted in: those holding a worker first (RUNNING, then the transitions
# that hold or are about to take one), so that nothing the sweep deletes later waits behind a
# full pool; parked ones last. DeleteActor with any_state deletes a PAUSED or SUSPENDED actor
# without a worker (upstream-actors.md §4), so they never need one freed first either.
_DELETE_ORDER = {
    "RUNNING": 0,
    "RESUMING": 1,
    "REVERTING": 1,
    "PAUSING": 2,
    "SUSPENDING": 2,
    "CRASHED": 4,
    "PAUSED": 5,
    "SUSPENDED": 5,
}
_UNKNOWN_STATE = 3


async def _with_states(provider: Any, targets: list[SweepTarget]) -> list[SweepTarget]:
    """Ledger targets carry no state: one ListActors of the atespace fills it in (best effort;
    a listing that fails leaves them unknown, deleted after the running ones)."""
    from dataclasses import replace

    from gym_substrate.nemo.control_client import actor_state
    from gym_substrate.nemo.errors import SubstrateError

    if all(t.state or t.kind != "actor" for t in targets):
        return targets
    try:
        listed = await provider.control.list_actors(provider.connection.atespace)
    except SubstrateError:
        return targets
    states = {a.metadata.name: actor_state(a) for a in listed}
    return [
        replace(t, state=states.get(t.name, "")) if t.kind == "actor" and not t.state else t
        for t in targets
    ]


def _delete_rank(target: SweepTarget) -> tuple[int, int]:
    if target.kind != "actor":
        return (1, 0)  # snapshots after every actor: the sweep may delete their borrowers
    return (0, _DELETE_ORDER.get(target.state, _UNKNOWN_STATE))


async def delete_targets(
    provider: Any,
    targets: list[SweepTarget],
    *,
    on_progress: Callable[[int, int], None] | None = None,
) -> list[SweepResult]:
    """Delete each target through the provider: actors holding a worker first, then parked
    ones, then snapshots; report every one, keep going."""
    results: list[SweepResult] = []
    ordered = sorted(await _with_states(provider, targets), key=_delete_rank)
    for done, target in enumerate(ordered, start=1):
        if target.atespace != provider.connection.atespace:  # belt and braces
            results.append(target.skipped("other atespace"))
        else:
            results.append(await _delete_one(provider, target))
        if on_progress is not None:
            on_progress(done, len(ordered))
    return results


async def sweep_actors(
    provider_kwargs: dict[str, Any],
    *,
    everything: bool = False,
    dry_run: bool = False,
    name: str | None = None,
    states: Collection[str] | None = None,
    snapshots: bool = False,
    checkpoints: bool = False,
) -> list[SweepResult]:
    """Delete expired/orphaned ledger actors and snapshots, or what the selection picks."""
    from gym_substrate import SubstrateProvider

    provider = SubstrateProvider(**provider_kwargs)
    try:
        targets = await find_targets(
            provider,
            everything=everything,
            name=name,
            states=states,
            snapshots=snapshots,
            checkpoints=checkpoints,
        )
        if dry_run:
            return [t.skipped("dry run") for t in targets]
        return await delete_targets(provider, targets)
    finally:
        await provider.aclose()


@dataclass(frozen=True)
class Selection:
    """What a sweep picks: none of it set, the ledger's leftovers; else live actors (or with
    ``snapshots``, snapshots) of the atespace by ``everything``, ``name`` or ``states``."""

    everything: bool = False
    name: str | None = None
    states: tuple[str, ...] | None = None
    snapshots: bool = False
    checkpoints: bool = False

    @property
    def selecting(self) -> bool:
        """True when the sweep goes past the ledger (the CLI asks before deleting then)."""
        return self.everything or self.name is not None or bool(self.states) or self.snapshots

    @property
    def what(self) -> str:
        return "snapshot(s)" if self.snapshots else "actor(s)"


async def plan_sweep(
    provider_kwargs: dict[str, Any], selection: Selection
) -> tuple[str, list[SweepTarget]]:
    """The provider's atespace and what ``selection`` would delete in it (nothing deleted)."""
    from gym_substrate import SubstrateProvider

    async with SubstrateProvider(**provider_kwargs) as provider:
        targets = await find_targets(
            provider,
            everything=selection.everything,
            name=selection.name,
            states=selection.states,
            snapshots=selection.snapshots,
            checkpoints=selection.checkpoints,
        )
        return provider.connection.atespace, targets


async def delete_planned(
    provider_kwargs: dict[str, Any],
    targets: list[SweepTarget],
    *,
    on_progress: Callable[[int, int], None] | None = None,
) -> list[SweepResult]:
    """Delete the targets `plan_sweep` found, through a provider of its own."""
    from gym_substrate import SubstrateProvider

    async with SubstrateProvider(**provider_kwargs) as provider:
        return await delete_targets(provider, targets, on_progress=on_progress)
