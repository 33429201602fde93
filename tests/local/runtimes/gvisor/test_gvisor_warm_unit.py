"""The warm pool's choices that need no sandbox: which namespace a refill takes, and how a
pool that keeps failing is reported to the bench instead of being waited on for minutes.

Found by CI (stop 28): a refill took slot 0's home namespace, whose sandbox address is slot
0's worker IP; the DNAT map sends that address to whatever slot 0 runs, so the fill's readiness
probe reached another actor, or nothing, and `local bench` waited 300 s on a pool that never
filled.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from gym_substrate.lab.bench import local as bench
from gym_substrate.local.runtimes.base import RuntimeFailure
from gym_substrate.local.runtimes.gvisor.warm import UNIT_BASE, WarmPool


def _pool(workers: int, spares: list[int]) -> WarmPool:
    tier = SimpleNamespace(
        spares=list(spares), _spare_nets={}, slots={0: 7, 1: 1}, frozen={}, _save=lambda: None
    )
    runtime: Any = SimpleNamespace(tier=tier, config=SimpleNamespace(workers=workers))
    return WarmPool(runtime, {"gvisor.warm_pool": "1"})


def test_a_refill_never_takes_a_slots_home_namespace() -> None:
    pool = _pool(workers=2, spares=[0, 9])
    assert pool._take_unit() == (9, None)
    assert pool.rt.tier.spares == [0]  # slot 0's home unit waits for the next freeze
    unit, known = pool._take_unit()
    assert (unit, known) == (UNIT_BASE, None)  # a number of its own, not 0
    assert pool.rt.tier.spares == [0]


async def test_the_bench_names_a_pool_that_keeps_failing(monkeypatch: pytest.MonkeyPatch) -> None:
    pool = _pool(workers=2, spares=[])
    backend: Any = SimpleNamespace(runtime=SimpleNamespace(warm=pool), plane=object())
    monkeypatch.setattr(bench, "warm_targets", lambda plane: {"local/sandbox": None})

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
    backend: Any = SimpleNamespace(runtime=SimpleNamespace(warm=pool), plane=object())
    monkeypatch.setattr(bench, "warm_targets", lambda plane: {"local/sandbox": None})
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
