"""A restart after a kill that landed in an eviction keeps the pause (issue 32, item 6).

Found by `gym-substrate bench soak` (12 sandboxes, 3 backend kills, seeds 1 and 6): the budget
eviction of a frozen sandbox had written its checkpoint image (`checkpointed frozen ... in 130
ms` logged) when the backend was SIGKILLed before its book (`frozen.json`) dropped the entry.
The restart found the sandbox gone (a checkpoint ends it) and declared "that pause is lost":
the actor was CRASHED although its image was complete in its snapshot folder. Now a frozen
sandbox that is gone while its folder holds the finished image (`runsc checkpoint` exited 0:
the shell around it writes a done file, even when the backend is dead by then; or the
eviction went on to remove the frozen marker) goes on from the image; a restart first waits
for the checkpoints the killed backend left running. One with no image,
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

    def __init__(self) -> None:
        self.ended: list[str] = []

    def load(self, cid: str) -> None:
        return None

    async def kill(self, cid: str, *, after: str) -> None:
        self.ended.append(cid)


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
    names = ("evicted", "checkpoint-done", "cut-short", "no-image")
    folders = {name: tmp_path / f"snap-{name}" for name in names}
    tier = _tier(tmp_path / "runtime", {f"c-{name}": f for name, f in folders.items()})
    (folders["evicted"] / "checkpoint.img").write_bytes(b"image")
    (folders["evicted"] / frozen.FROZEN_MARKER).unlink()  # what a finished eviction does
    # runsc exited 0 (its shell wrote the done file) but the kill came before the marker went
    (folders["checkpoint-done"] / "checkpoint.img").write_bytes(b"image")
    (folders["checkpoint-done"] / frozen.EVICTED_MARKER).write_bytes(b"")
    (folders["cut-short"] / "checkpoint.img").write_bytes(b"ima")
    asyncio.run(tier.open())
    assert tier.frozen == {}  # none is frozen any more: every unit is spare again
    assert sorted(tier.units.spares) == [1, 2, 3, 4]
    # the evicted ones: their stopped sandboxes removed, no loss recorded, a resume restores
    assert sorted(tier.sandboxes.ended) == ["c-checkpoint-done", "c-evicted"]
    assert frozen.claimed_cid(folders["evicted"]) is None
    assert frozen.claimed_cid(folders["checkpoint-done"]) == "c-checkpoint-done"
    actor: Any = SimpleNamespace(key="gym/c-checkpoint-done")
    thaw = tier.thaw(actor, SimpleNamespace(index=0), folders["checkpoint-done"], 0.0)
    assert asyncio.run(thaw) is None  # None: restore the image instead
    # the others: reported lost, which their resume turns into CRASHED saying why
    for name in ("cut-short", "no-image"):
        with pytest.raises(Exception, match="its frozen sandbox was gone when the backend"):
            frozen.claimed_cid(folders[name])


def test_a_restart_sees_which_checkpoints_the_killed_backend_left_running() -> None:
    import subprocess

    from gym_substrate.local.runtimes.gvisor._proc import checkpoints_running

    # `started` once the shell runs; then it waits in a builtin: no child process that would
    # carry the shell's command line between its fork and its exec
    script = "echo started; read line"
    argv = [script, "/usr/bin/runsc", "--root=/x", "checkpoint", "--image-path=/y", "c-busy"]
    writer = subprocess.Popen(
        ["sh", "-c", *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert writer.stdout is not None
        assert writer.stdout.readline() == "started\n"  # not before: a fork not yet exec'd
        assert checkpoints_running({"c-busy", "c-idle"}) == {"c-busy"}
    finally:
        writer.kill()
        writer.wait()
    assert checkpoints_running({"c-busy"}) == set()


def test_a_failed_runsc_command_says_what_panicked() -> None:
    """The CRASHED message of a failed restore quoted only the tail of the sentry's Go stack;
    the `panic:` line that says why comes first now."""
    from gym_substrate.local.runtimes.gvisor._proc import tail

    stack = ["starting", "panic: restore: file not found", *[f"\tframe {i}" for i in range(20)]]
    said = tail("\n".join(stack), 3)
    assert said == "panic: restore: file not found | ... | \tframe 17 | \tframe 18 | \tframe 19"
    assert tail("a\nb\nc", 2) == "b | c"


def test_the_book_is_written_on_the_event_loop_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bench density at 200 sandboxes: a pause failed with `No such file or directory:
    frozen.tmp -> frozen.json`, because measuring a frozen sandbox wrote the book from a worker
    thread while the loop wrote it too (one rename took the other's temporary file)."""
    import threading

    from gym_substrate.local.runtimes.gvisor import freezer, host

    tier = _tier(tmp_path / "runtime", {"c1": tmp_path / "snap"})
    tier.frozen = frozen.load_state(tier.state_path, tier.units)
    tier.runsc = SimpleNamespace(pids=lambda cid: [4242])
    writers: list[int] = []
    monkeypatch.setattr(freezer, "save_state", lambda *a: writers.append(threading.get_ident()))
    monkeypatch.setattr(host, "held_bytes", lambda roots: 30 << 20)

    async def measure() -> int:
        await tier._measure(tier.frozen["c1"])
        return threading.get_ident()

    loop_thread = asyncio.run(measure())
    assert tier.frozen["c1"].pss == 30 << 20
    assert writers == [loop_thread]
