"""A gVisor actor's state is never lost without a word: a checkpoint that cannot fit is
refused and the sandbox keeps running; one that fails and loses the sandbox leaves the actor
CRASHED with a message saying what is gone (issue 24).

The state folder is a small tmpfs (we run as root), so a full disk is real: runsc's own
`no space left on device`, not a simulation.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from local_helpers import error, get_actor, make_actor, ref, run_in, settle_golden, state

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.ateapi import ateapi_pb2_grpc as pb_grpc
from gym_substrate.local import LocalBackend
from gym_substrate.local.statedir import state_leftovers

pytestmark = pytest.mark.runsc

TMPFS_MB = 96


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    folder = tmp_path / "state"
    folder.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_MB}m", "gsdurability", str(folder)],
        check=True,
    )
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


@pytest.fixture
async def small_backend(small_disk: Path) -> AsyncIterator[LocalBackend]:
    # the checkpoint tier: these tests are about a checkpoint meeting a full disk (a frozen
    # pause writes no image; its eviction to one is test_gvisor_freeze.py's)
    options: dict[str, Any] = {
        "default_rootfs": "host",
        "actors_per_worker": 1,
        "workers": 2,
        "pause_tier": "checkpoint",
    }
    async with LocalBackend(small_disk, runtime="gvisor", **options) as started:
        await settle_golden(started)
        yield started
    assert await state_leftovers(small_disk) == []


@pytest.fixture
async def small_stub(small_backend: LocalBackend) -> AsyncIterator[Any]:
    channel = grpc.aio.insecure_channel(small_backend.api_address)
    yield pb_grpc.ControlStub(channel)
    await channel.close()


def _fill(folder: Path, leave_bytes: int) -> Path:
    """A file that takes all of ``folder``'s free space but ``leave_bytes``."""
    stats = os.statvfs(folder)
    free = stats.f_bavail * stats.f_frsize
    filler = folder / "filler.bin"
    size = max(0, free - leave_bytes)
    with open(filler, "wb") as fh:
        chunk = b"\0" * (1 << 20)
        while size > 0:
            fh.write(chunk[: min(size, len(chunk))])
            size -= min(size, len(chunk))
    return filler


def _local_images(state_dir: Path) -> list[str]:
    """What `snapshots/local` holds (it goes once empty)."""
    folder = state_dir / "snapshots" / "local"
    return sorted(os.listdir(folder)) if folder.is_dir() else []


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        yield session


async def test_a_park_that_cannot_fit_is_refused_and_the_sandbox_keeps_running(
    small_backend: LocalBackend, small_stub: Any, small_disk: Path, http: aiohttp.ClientSession
) -> None:
    """Before: runsc's checkpoint failed with ENOSPC, gVisor stopped the sandbox and the user's
    files were gone. Now the park is refused up front, the actor stays RUNNING with its files."""
    await make_actor(small_stub, "full")
    await small_stub.ResumeActor(pb.ResumeActorRequest(actor=ref("full")))
    assert (await run_in(http, small_backend, "full", "echo kept > /srv/note"))["exit_code"] == 0
    filler = _fill(small_disk, 2 << 20)
    for call in (small_stub.PauseActor, small_stub.SuspendActor):
        kind = pb.PauseActorRequest if call is small_stub.PauseActor else pb.SuspendActorRequest
        refused = await error(call(kind(actor=ref("full"))))
        assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, refused.details()
        assert "keeps running" in refused.details()
        assert "free" in refused.details()
        actor = await get_actor(small_stub, "full")
        assert state(actor) == "RUNNING"
        assert not actor.status.HasField("crash")
        job = await run_in(http, small_backend, "full", "cat /srv/note")
        assert (job["exit_code"], job["stdout"]) == (0, "kept\n")
    filler.unlink()
    paused = (await small_stub.PauseActor(pb.PauseActorRequest(actor=ref("full")))).actor
    assert state(paused) == "PAUSED"
    await small_stub.ResumeActor(pb.ResumeActorRequest(actor=ref("full")))
    assert (await run_in(http, small_backend, "full", "cat /srv/note"))["stdout"] == "kept\n"
    await small_stub.DeleteActor(pb.DeleteActorRequest(actor=ref("full"), any_state=True))


async def test_a_checkpoint_that_runs_out_of_space_crashes_the_actor_and_says_what_is_lost(
    small_backend: LocalBackend,
    small_stub: Any,
    small_disk: Path,
    http: aiohttp.ClientSession,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """When the estimate lets a checkpoint through and the disk still fills (here: no estimate
    at all), gVisor stops the sandbox. The actor is then CRASHED, its message names the cause
    and what is lost, a resume is refused (no blank sandbox behind the same name) and only
    RevertActor takes it back, to the golden snapshot it started from
    (kagent:controlapi/crash.go@2559ec02: a failing atelet Checkpoint crashes the actor)."""
    from gym_substrate.local.runtimes.gvisor import GvisorRuntime

    async def unknown(self: GvisorRuntime, handle: str) -> None:
        return None

    monkeypatch.setattr(GvisorRuntime, "checkpoint_estimate", unknown)
    await make_actor(small_stub, "lost")
    await small_stub.ResumeActor(pb.ResumeActorRequest(actor=ref("lost")))
    assert (await run_in(http, small_backend, "lost", "echo gone > /srv/note"))["exit_code"] == 0
    filler = _fill(small_disk, 2 << 20)
    failed = await error(small_stub.PauseActor(pb.PauseActorRequest(actor=ref("lost"))))
    assert failed.code() == grpc.StatusCode.INTERNAL
    actor = await get_actor(small_stub, "lost")
    assert state(actor) == "CRASHED"
    message = actor.status.crash.message
    assert message.startswith("pause failed: atelet Checkpoint: ")
    assert "no space left on device" in message
    assert "lost: the sandbox's memory and files since its snapshot generation" in message
    assert await asyncio.to_thread(_local_images, small_disk) == [], "an unfinished image left"
    refused = await error(small_stub.ResumeActor(pb.ResumeActorRequest(actor=ref("lost"))))
    assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION
    filler.unlink()
    reverted = (await small_stub.RevertActor(pb.RevertActorRequest(actor=ref("lost")))).actor
    assert state(reverted) == "SUSPENDED"
    await small_stub.ResumeActor(pb.ResumeActorRequest(actor=ref("lost")))
    assert (await run_in(http, small_backend, "lost", "cat /srv/note"))["exit_code"] != 0
    await small_stub.DeleteActor(pb.DeleteActorRequest(actor=ref("lost"), any_state=True))
