"""The free-space check before a park asks only what a park will really write.

A freeze-tier pause writes no image, so it must not start a runsc process to estimate one (that
estimate was most of a freeze-tier pause: issue 22, `local bench --phases`); a checkpoint-tier
pause and every suspend still check, and a park that cannot fit is refused before anything is
written.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from gym_substrate.local.control import durability
from gym_substrate.local.errors import AteapiError


class FakeRuntime:
    def __init__(self, *, writes: bool, estimate: int) -> None:
        self.writes = writes
        self.estimate = estimate
        self.estimates = 0

    def pause_writes_image(self) -> bool:
        return self.writes

    async def checkpoint_estimate(self, handle: str) -> int:
        self.estimates += 1
        return self.estimate


def _check(runtime: FakeRuntime, dest: Path, **kw: Any) -> None:
    plane: Any = SimpleNamespace(runtime=runtime)
    record: Any = SimpleNamespace(handle="sandbox-1", key="gym/a", retained_handle="")
    asyncio.run(durability.check_room(plane, record, "pause", dest, **kw))


def test_a_freeze_tier_pause_is_never_estimated(tmp_path: Path) -> None:
    runtime = FakeRuntime(writes=False, estimate=2**62)
    _check(runtime, tmp_path / "snap")
    assert runtime.estimates == 0


def test_a_checkpoint_pause_that_cannot_fit_is_refused(tmp_path: Path) -> None:
    runtime = FakeRuntime(writes=True, estimate=2**62)
    with pytest.raises(AteapiError) as caught:
        _check(runtime, tmp_path / "snap")
    assert caught.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "keeps running" in caught.value.message
    assert runtime.estimates == 1


def test_a_suspend_is_checked_even_on_the_freeze_tier(tmp_path: Path) -> None:
    runtime = FakeRuntime(writes=False, estimate=2**62)
    with pytest.raises(AteapiError):
        _check(runtime, tmp_path / "snap", durable=True)
    assert runtime.estimates == 1


def test_a_budget_eviction_that_cannot_fit_keeps_the_sandbox_frozen(tmp_path: Path) -> None:
    """Past the frozen-memory budget the oldest frozen sandbox is checkpointed; when its image
    cannot fit, it stays frozen (nothing lost) instead of a checkpoint cut short by ENOSPC."""
    from gym_substrate.local.runtimes.gvisor import freezer, frozen
    from gym_substrate.local.runtimes.gvisor.slots import UnitBook

    parts: Any = SimpleNamespace(
        compression="none", runsc=None, sandboxes=None, nets=None, units=UnitBook(1)
    )
    tier = freezer.FreezeTier(parts, {"gvisor.pause_tier": "freeze"})
    entry = frozen.Frozen(
        cid="c1", actor="gym/a", unit=0, dest=str(tmp_path), frozen_at=0.0, method="cgroup"
    )
    entry.pss = 2**62
    assert asyncio.run(tier._room_for(entry, tmp_path / "image")) is False
    entry.pss = 4096
    assert asyncio.run(tier._room_for(entry, tmp_path / "image")) is True
    tier.frozen["c1"] = entry
    entry.pss = 2**62
    assert asyncio.run(tier.evict("c1", reason="over budget", room_first=True)) is None
    assert "c1" in tier.frozen  # untouched: runsc (None here) was never called


def test_evictions_at_once_leave_each_other_the_room_they_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by `bench soak` with 24 MiB left on the state disk: several budget evictions each
    saw room for one image, wrote at once, and runsc ended the sandboxes whose checkpoint ran
    out of space (gVisor kills a sandbox whose save fails), so their actors were CRASHED. An
    eviction under way now holds the room its image needs until it is written."""
    from gym_substrate.local.runtimes.gvisor import freezer, frozen
    from gym_substrate.local.runtimes.gvisor.slots import UnitBook

    parts: Any = SimpleNamespace(
        compression="none", runsc=None, sandboxes=None, nets=None, units=UnitBook(1)
    )
    tier = freezer.FreezeTier(parts, {"gvisor.pause_tier": "freeze"})
    entry = frozen.Frozen(
        cid="c1", actor="gym/a", unit=0, dest=str(tmp_path), frozen_at=0.0, method="cgroup"
    )
    entry.pss = 30 * 2**20
    one_image = freezer.image_bytes(entry.pss, "none")
    monkeypatch.setattr(freezer, "free_bytes", lambda folder: one_image + 2**20)
    assert asyncio.run(tier._room_for(entry, tmp_path / "image")) is True
    tier._reserved = one_image  # another eviction is writing its image
    assert asyncio.run(tier._room_for(entry, tmp_path / "image")) is False
