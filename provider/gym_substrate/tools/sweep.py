"""Delete actors that rollouts left behind (the library behind `gym-substrate sweep`).

Substrate never deletes an idle actor and has no TTL, so a trainer that crashed (or was killed
between create and close) leaks actors and their snapshots. The provider's ledger records every
actor it made; by default sweep deletes those past their `ttl_s` or whose creating process is
gone. `everything`, `name` (a glob on the actor id) and `states` select instead from the live
listing of the atespace (ListActors), ledger or not. Nothing outside the configured atespace is
ever touched: ledger entries made in another atespace are left alone. Deletion reuses the
provider's own close path (one DeleteActor with `any_state`, retried through transient codes;
NOT_FOUND is done).
"""

from __future__ import annotations

import fnmatch
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

__all__ = ["STATES", "SweepResult", "SweepTarget", "delete_targets", "find_targets", "sweep_actors"]

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


@dataclass
class SweepResult:
    actor_id: str
    atespace: str
    reason: str
    deleted: bool
    error: str = ""


@dataclass(frozen=True)
class SweepTarget:
    actor_id: str
    atespace: str
    reason: str
    state: str = ""


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
) -> list[SweepTarget]:
    """What a sweep would delete, in the provider's configured atespace only."""
    from gym_substrate._grpc import actor_state
    from gym_substrate._ledger import Ledger

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


async def delete_targets(
    provider: Any,
    targets: list[SweepTarget],
    *,
    on_progress: Callable[[int, int], None] | None = None,
) -> list[SweepResult]:
    """Delete each target through the provider's close path; report every one, keep going."""
    results: list[SweepResult] = []
    for done, target in enumerate(targets, start=1):
        if target.atespace != provider.connection.atespace:  # belt and braces
            results.append(
                SweepResult(
                    target.actor_id, target.atespace, target.reason, False, "other atespace"
                )
            )
            continue
        try:
            await provider.delete_actor(target.actor_id, target.atespace)
        except Exception as exc:  # report every actor, keep going
            results.append(
                SweepResult(target.actor_id, target.atespace, target.reason, False, str(exc))
            )
        else:
            results.append(SweepResult(target.actor_id, target.atespace, target.reason, True))
        if on_progress is not None:
            on_progress(done, len(targets))
    return results


async def sweep_actors(
    provider_kwargs: dict[str, Any],
    *,
    everything: bool = False,
    dry_run: bool = False,
    name: str | None = None,
    states: Collection[str] | None = None,
) -> list[SweepResult]:
    """Delete expired/orphaned ledger actors, or the atespace's actors the selection picks."""
    from gym_substrate import SubstrateProvider

    provider = SubstrateProvider(**provider_kwargs)
    try:
        targets = await find_targets(provider, everything=everything, name=name, states=states)
        if dry_run:
            return [
                SweepResult(t.actor_id, t.atespace, t.reason, False, "dry run") for t in targets
            ]
        return await delete_targets(provider, targets)
    finally:
        await provider.aclose()
