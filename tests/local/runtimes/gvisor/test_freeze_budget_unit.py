"""The frozen-memory budget counts a sandbox not measured yet as the largest one measured.

Found with `bench density --sandboxes 200` at `local up`'s defaults (warm pool 1): the pool was
filled 80 times and 18 fills were dropped again within 80 s, each for "the frozen-memory budget
is short". A sandbox just frozen counted 128 MiB (the guess) until its PSS was measured, about
30 MiB: two fresh freezes took the budget 200 MiB over for a moment, the pool was shed, and
refilled as soon as the measurements came in. The guess is only for a tier (and a warm pool)
that has measured nothing yet: the first freeze counts as the largest pooled sandbox, which
`test_gvisor_warm_pool.py` also needed (it shed two of ten pooled sandboxes for one freeze).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gym_substrate.local.runtimes.gvisor import frozen
from gym_substrate.local.runtimes.gvisor.freezer import FreezeTier
from gym_substrate.local.runtimes.gvisor.slots import UnitBook

pytestmark = pytest.mark.fast

MIB = 1 << 20


class Pool:
    """The warm pool's side of the budget: one pooled sandbox of 30 MiB, shed on request."""

    def __init__(self) -> None:
        self.held, self.shed_calls = 30 * MIB, 0

    def bytes(self) -> int:
        return self.held

    def largest(self) -> int:
        return self.held

    def shed(self, over: int) -> int:
        self.shed_calls += 1
        freed, self.held = self.held, 0
        return freed


def _tier(tmp_path: Path, budget_mib: int) -> FreezeTier:
    parts: Any = SimpleNamespace(
        dir=tmp_path, compression="none", runsc=None, sandboxes=None, nets=None, units=UnitBook(4)
    )
    extra = {"gvisor.pause_tier": "freeze", "gvisor.frozen_memory": f"{budget_mib}M"}
    return FreezeTier(parts, extra)


def _freeze(tier: FreezeTier, cid: str, pss_mib: int) -> None:
    entry = frozen.Frozen(cid, f"gym/{cid}", len(tier.frozen) + 4, "/x", 0.0, "cgroup")
    entry.pss = pss_mib * MIB
    tier.frozen[cid] = entry


def test_a_fresh_freeze_counts_as_the_largest_measured_sandbox(tmp_path: Path) -> None:
    tier = _tier(tmp_path, 200)
    assert tier.frozen_bytes() == 0
    _freeze(tier, "first", 0)
    assert tier.frozen_bytes() == frozen.GUESS_PSS  # nothing measured anywhere: the guess
    tier.share_budget(Pool())
    assert tier.frozen_bytes() == 30 * MIB  # a pooled sandbox of the same kind was measured
    _freeze(tier, "a", 30)
    _freeze(tier, "b", 28)
    _freeze(tier, "fresh", 0)
    assert tier.frozen_bytes() == (30 + 30 + 28 + 30) * MIB


def test_fresh_freezes_within_the_budget_leave_the_warm_pool_alone(tmp_path: Path) -> None:
    tier = _tier(tmp_path, 200)
    pool = Pool()
    tier.share_budget(pool)
    for i in range(4):
        _freeze(tier, f"m{i}", 30)  # 120 MiB measured, 30 pooled
    _freeze(tier, "fresh", 0)  # really about 30 MiB: 180 of 200
    tier.enforce_budget()
    assert pool.shed_calls == 0
    assert pool.held == 30 * MIB
    _freeze(tier, "one-more", 30)  # now 210 of 200: the pool goes first, no eviction
    tier.enforce_budget()
    assert (pool.shed_calls, pool.held, tier._tasks) == (1, 0, set())
