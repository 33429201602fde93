"""A restart after a kill that landed in an eviction keeps the pause (issue 32, item 6).

Found by `gym-substrate bench soak` (12 sandboxes, 3 backend kills, seeds 1 and 6): the budget
eviction of a frozen sandbox had written its checkpoint image (`checkpointed frozen ... in 130
ms` logged) when the backend was SIGKILLed before its book (`frozen.json`) dropped the entry.
The restart found the sandbox gone (a checkpoint ends it) and declared "that pause is lost":
the actor was CRASHED although its image was complete in its snapshot folder. Now a frozen
sandbox that is gone while its folder holds the finished image (the eviction removes the
frozen marker once `runsc checkpoint` has returned) goes on from the image. One with no image,
or with an image beside the marker (a checkpoint the kill cut short: restoring such an image
made the sentry panic in the same soak), is still reported lost, never passed off as a pause.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gym_substrate.local.runtimes.gvisor import frozen
from gym_substrate.local.runtimes.gvisor.freezer import FreezeTier
from gym_substrate.local.runtimes.gvisor.slots import UnitBook

pytestmark = pytest.mark.fast


class GoneSandboxes:
    """Every sandbox exited (what a checkpoint leaves) and nothing else is known."""

    async def is_alive(self, cid: str) -> bool:
        return False

    def load(self, cid: str) -> None:
        return None


def _tier(runtime_dir: Path, snapshots: dict[str, Path]) -> FreezeTier:
    """A tier whose book, as a killed backend left it, lists one frozen sandbox per snapshot."""
    units = UnitBook(1)
    runtime_dir.mkdir()
    parts: Any = SimpleNamespace(
        dir=runtime_dir,
        compression="none",
        runsc=None,
        sandboxes=GoneSandboxes(),
        nets=None,
        units=units,
    )
    tier = FreezeTier(parts, {"gvisor.pause_tier": "freeze", "gvisor.frozen_memory": "1G"})
    for unit, (cid, folder) in enumerate(snapshots.items(), start=1):
        folder.mkdir(parents=True)
        marker = {"sandbox": cid, "actor": f"gym/{cid}"}
        (folder / frozen.FROZEN_MARKER).write_text(json.dumps(marker))
        entry = frozen.Frozen(cid, f"gym/{cid}", unit, str(folder), 0.0, "cgroup")
        tier.frozen[cid] = entry
    tier._save()
    again = FreezeTier(parts, {"gvisor.pause_tier": "freeze", "gvisor.frozen_memory": "1G"})
    again.load()
    return again


def test_a_frozen_sandbox_checkpointed_before_the_kill_resumes_from_its_image(
    tmp_path: Path,
) -> None:
    folders = {name: tmp_path / f"snap-{name}" for name in ("evicted", "cut-short", "no-image")}
    tier = _tier(tmp_path / "runtime", {f"c-{name}": f for name, f in folders.items()})
    (folders["evicted"] / "checkpoint.img").write_bytes(b"image")
    (folders["evicted"] / frozen.FROZEN_MARKER).unlink()  # what a finished eviction does
    (folders["cut-short"] / "checkpoint.img").write_bytes(b"ima")
    asyncio.run(tier.open())
    assert tier.frozen == {}  # none is frozen any more: every unit is spare again
    assert sorted(tier.units.spares) == [1, 2, 3]
    # the evicted one: no loss recorded, and its resume restores the image
    assert frozen.claimed_cid(folders["evicted"]) is None
    # the others: reported lost, which their resume turns into CRASHED saying why
    for name in ("cut-short", "no-image"):
        with pytest.raises(Exception, match="its frozen sandbox was gone when the backend"):
            frozen.claimed_cid(folders[name])
