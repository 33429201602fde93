"""The warm pool's choices that need no sandbox: which namespace a refill takes, and how a
pool that keeps failing is reported to the bench instead of being waited on for minutes.

Found by CI (stop 28): a refill took slot 0's home namespace, whose sandbox address is slot
0's worker IP; the DNAT map sends that address to whatever slot 0 runs, so the fill's readiness
probe reached another actor, or nothing, and `local bench` waited 300 s on a pool that never
filled.

Issue 29 (200 parked sandboxes wedged the backend): a pooled sandbox dropped for the budget
left its namespace number free while the namespace was still being removed in the background;
a freeze took the number and was handed the namespace about to vanish (`Cannot open network
namespace "gs...-w57"` at the next start on that slot). And the pool refilled whatever the
budget was about to make it drop again (14 fills dropped in 4 minutes).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from tempfile import mkdtemp
from types import SimpleNamespace
from typing import Any

import pytest

from gym_substrate.lab.bench import local as bench
from gym_substrate.local.runtimes.base import RuntimeFailure
from gym_substrate.local.runtimes.gvisor import warm
from gym_substrate.local.runtimes.gvisor.freezer import FreezeTier
from gym_substrate.local.runtimes.gvisor.frozen import Frozen
from gym_substrate.local.runtimes.gvisor.sandboxes import Parts
from gym_substrate.local.runtimes.gvisor.slots import SlotNets, UnitBook
from gym_substrate.local.runtimes.gvisor.warm import UNIT_BASE, WarmPool


def _pool(workers: int, spares: list[int], budget: str = "4G") -> WarmPool:
    """A pool and a real frozen tier (the namespace book) on parts of no sandboxes; the
    registry is a stand-in whose ``runsc`` and ``discard`` each test sets."""
    sandboxes: Any = SimpleNamespace(instance="gsunit", runsc=None)
    units = UnitBook(workers)
    parts = Parts(Path(mkdtemp()), "none", sandboxes, SlotNets("gsunit", workers), units)
    tier = FreezeTier(parts, {"gvisor.pause_tier": "freeze", "gvisor.frozen_memory": budget})
    units.spares = list(spares)
    units.slots = {0: 7, 1: 1}
    return WarmPool(parts, {"gvisor.warm_pool": "1"}, tier)


def test_a_refill_never_takes_a_slots_home_namespace() -> None:
    pool = _pool(workers=2, spares=[0, 9])
    assert pool._take_unit() == (9, None)
    assert pool.units.spares == [0]  # slot 0's home unit waits for the next freeze
    unit, known = pool._take_unit()
    assert (unit, known) == (UNIT_BASE, None)  # a number of its own, not 0
    assert pool.units.spares == [0]


async def test_the_bench_names_a_pool_that_keeps_failing(monkeypatch: pytest.MonkeyPatch) -> None:
    pool = _pool(workers=2, spares=[])
    backend: Any = SimpleNamespace(
        runtime=SimpleNamespace(warm=pool), plane=SimpleNamespace(shared=object())
    )
    monkeypatch.setattr(bench, "warm_targets", lambda shared: {"local/sandbox": None})

    async def fail_twice() -> None:
        for failures in (1, 2):
            await asyncio.sleep(0)
            pool.failures, pool.last_error = failures, "wakeup probe /readyz never returned 200"
            await pool._notify()

    failing = asyncio.create_task(fail_twice())
    with pytest.raises(RuntimeFailure, match=r"failed to refill 2 times.*wakeup probe"):
        await bench._pool_full(backend)
    await failing


async def test_the_bench_waits_for_a_pool_that_fills(monkeypatch: pytest.MonkeyPatch) -> None:
    pool = _pool(workers=2, spares=[])
    backend: Any = SimpleNamespace(
        runtime=SimpleNamespace(warm=pool), plane=SimpleNamespace(shared=object())
    )
    monkeypatch.setattr(bench, "warm_targets", lambda shared: {"local/sandbox": None})
    monkeypatch.setattr(pool, "count", lambda key: filled)
    filled = 0

    async def fill_after_a_failure() -> None:
        nonlocal filled
        pool.failures = 1  # one failure in a row is retried, not reported
        await pool._notify()
        await asyncio.sleep(0)
        filled, pool.failures = 1, 0
        await pool._notify()

    filling = asyncio.create_task(fill_after_a_failure())
    await bench._pool_full(backend)
    await filling
    assert filled == 1


async def test_a_unit_being_released_is_handed_to_nobody(monkeypatch: pytest.MonkeyPatch) -> None:
    pool = _pool(workers=57, spares=[])  # 57: the first number a freeze would take
    tier = pool.tier
    released: list[int] = []
    gate = asyncio.Event()

    async def slow_discard(cid: str) -> None:
        await gate.wait()  # the sandbox's removal takes a while (runsc delete)

    pool.sandboxes.discard = slow_discard
    pool.sandboxes.runsc = SimpleNamespace(pids=lambda cid: None)
    monkeypatch.setattr(warm.net, "release_slot_net", lambda inst, unit: released.append(unit))
    dropping = asyncio.create_task(pool._destroy("warm-1", 57, "cgroup"))
    pooled = asyncio.create_task(pool._destroy("warm-2", UNIT_BASE, "cgroup"))
    await asyncio.sleep(0)
    assert tier._new_unit() == 58  # a freeze meanwhile gets another number
    assert pool._free_unit() == UNIT_BASE + 1  # and so does a refill
    gate.set()
    await asyncio.gather(dropping, pooled)
    assert released == [57, UNIT_BASE]
    assert tier._new_unit() == 57


async def test_a_unit_given_back_meanwhile_is_not_released(monkeypatch: pytest.MonkeyPatch) -> None:
    """A failed claim's thaw put the unit into the spares; its teardown must keep it."""
    pool = _pool(workers=2, spares=[])
    pool.sandboxes.runsc = SimpleNamespace(pids=lambda cid: None)

    async def discard(cid: str) -> None:
        pool.units.spares.append(57)

    pool.sandboxes.discard = discard
    released: list[int] = []
    monkeypatch.setattr(warm.net, "release_slot_net", lambda inst, unit: released.append(unit))
    await pool._destroy("warm-1", 57, "cgroup")
    assert released == []
    assert pool.units.spares == [57]


def test_the_pool_fills_only_with_room_for_every_slot_to_freeze() -> None:
    mib = 2**20
    pool = _pool(workers=2, spares=[], budget=str(400 * mib))
    tier = pool.tier
    for index in range(4):
        tier.frozen[f"f{index}"] = Frozen(f"f{index}", f"t/a{index}", 10 + index, "", 0.0, "x")
        tier.frozen[f"f{index}"].pss = 50 * mib
    # 200 MiB frozen + one pooled (50) + both slots freezing (100) = 350 <= 400
    assert pool._budget_allows()
    tier.frozen["f4"] = Frozen("f4", "t/a4", 14, "", 0.0, "x")
    tier.frozen["f4"].pss = 60 * mib
    # 260 + 60 + 120 = 440 > 400: the fill would be shed as soon as the slots pause
    assert not pool._budget_allows()
