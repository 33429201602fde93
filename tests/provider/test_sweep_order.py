"""`sweep` frees workers first and never needs a free worker to delete a parked leftover.

Issue 24: `sweep` could not delete a PAUSED leftover while other leftovers held every worker (it
waited 60 s and exited 1). DeleteActor with `any_state` deletes an actor in any state without a
worker (upstream-actors.md §4; the fake refuses PAUSED or RUNNING without it), and the sweep
deletes the actors that hold workers first, so nothing it deletes later waits behind a full pool.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gym_substrate import SubstrateProvider
from gym_substrate.lab.tools.sweep import SweepTarget, delete_targets, find_targets, sweep_actors
from gym_substrate.nemo.types import SandboxSpec

from .conftest import make_stack
from .fakes import CRASHED, PAUSED, RUNNING, SUSPENDED, FakeActor, FakeAgents, FakeControl

CONN = {"api": "127.0.0.1:1", "router": "http://router.invalid", "tls": {"plaintext": True}}
# Listed (and, before, deleted) in this order: parked ones ahead of the one holding the worker.
LEFTOVERS = {"paused": PAUSED, "suspended": SUSPENDED, "crashed": CRASHED, "running": RUNNING}


class _RecordingControl(FakeControl):
    def __init__(self) -> None:
        super().__init__(workers=1)
        self.deletes: list[tuple[str, bool]] = []

    async def delete_actor(self, atespace: str, name: str, *, any_state: bool = False) -> Any:
        self.deletes.append((name, any_state))
        return await super().delete_actor(atespace, name, any_state=any_state)


def _leftovers() -> tuple[_RecordingControl, SubstrateProvider]:
    control = _RecordingControl()
    control.atespaces.add("gym")
    for name, state in LEFTOVERS.items():
        control.actors[("gym", name)] = FakeActor("gym", name, "default/sandbox", state=state)
    provider = SubstrateProvider(
        connection=CONN, control=control, http=FakeAgents(control), lifecycle={"ledger": None}
    )
    return control, provider


async def test_sweep_deletes_the_worker_holder_first_and_parked_ones_without_waking_them() -> None:
    control, provider = _leftovers()
    async with provider:
        results = await delete_targets(provider, await find_targets(provider, everything=True))
    assert all(r.deleted for r in results), results
    assert control.deletes[0] == ("running", True)
    assert [name for name, _ in control.deletes[1:]] == ["crashed", "paused", "suspended"]
    assert all(any_state for _, any_state in control.deletes)
    assert len(control.deletes) == len(LEFTOVERS)  # one DeleteActor each, none refused
    assert control.calls["ResumeActor"] == control.calls["SuspendActor"] == 0
    assert control.actors == {}


async def test_ledger_leftovers_are_ordered_by_their_listed_state() -> None:
    """Ledger entries carry no state: one ListActors fills it in for the order."""
    control, provider = _leftovers()
    targets = [SweepTarget(name, "gym", "creating process is gone") for name in LEFTOVERS]
    async with provider:
        results = await delete_targets(provider, targets)
    assert [r.name for r in results][0] == "running"
    assert control.deletes[0] == ("running", True)
    assert control.calls["ListActors"] == 1
    assert control.actors == {}


async def test_sweep_deletes_a_paused_leftover_while_another_holds_the_only_worker(
    tmp_path: Path,
) -> None:
    """On the local backend, with one worker taken by a RUNNING leftover."""
    async with make_stack(tmp_path, workers=1) as stack:
        kwargs = stack.kwargs()
        provider = stack.provider()
        parked = await provider.create(SandboxSpec())
        await provider.pause(parked)
        holder = await provider.create(SandboxSpec())  # the only worker
        results = await sweep_actors(kwargs, everything=True)
        assert [(r.actor_id, r.deleted) for r in results] == [
            (holder.sandbox_id, True),
            (parked.sandbox_id, True),
        ]
        assert await stack.actors() == []
        assert stack.grpc_proxy.calls["ResumeActor"] == 2  # the two creates' own, no more
        await provider.aclose()
