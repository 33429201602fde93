"""Per-actor disk limits (gVisor): a sandbox's writable root overlay holds at most the limit.

Before, `--overlay2=root:memory` kept every file a sandbox wrote in unbounded sentry memory,
which its next checkpoint then wrote into the state folder (issue 24). Now the overlay's files
live in a tmpfs of ``--actor-disk`` bytes private to the sandbox (`runsc.py`), and a host-rootfs
sandbox's writable /tmp has the same bound: a write past it is ENOSPC inside that sandbox, which
keeps running; another sandbox and the API do not notice, and the limit holds after a pause
and resume (the image records it).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import grpc
import pytest
from local_helpers import make_actor, ref, run_in, settle_golden, state

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.ateapi import ateapi_pb2_grpc as pb_grpc
from gym_substrate.local import LocalBackend
from gym_substrate.local.runtimes.actor_disk import ACTOR_DISK_ENV
from gym_substrate.local.statedir import state_leftovers

pytestmark = pytest.mark.runsc


@pytest.fixture
async def backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[LocalBackend]:
    monkeypatch.setenv(ACTOR_DISK_ENV, "16MiB")  # the variable: the old code shows the defect
    options = {"default_rootfs": "host", "workers": 2, "actors_per_worker": 1}
    async with LocalBackend(
        tmp_path / "state", runtime="gvisor", pause_tier="checkpoint", **options
    ) as started:
        await settle_golden(started)
        yield started
    assert await state_leftovers(tmp_path / "state") == []


async def test_a_sandbox_that_fills_its_overlay_gets_enospc_and_keeps_running(
    backend: LocalBackend,
) -> None:
    async with (
        grpc.aio.insecure_channel(backend.api_address) as channel,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http,
    ):
        stub = pb_grpc.ControlStub(channel)
        for name in ("filler", "other"):
            await make_actor(stub, name)
            await stub.ResumeActor(pb.ResumeActorRequest(actor=ref(name)))
        for path in ("/opt/big", "/tmp/big"):
            job = await run_in(
                http, backend, "filler", f"head -c 40M /dev/zero > {path}; echo rc=$?"
            )
            assert "No space left on device" in job["stderr"], (path, job)
            assert "rc=1" in job["stdout"], (path, job)
        job = await run_in(http, backend, "filler", "rm -f /opt/big /tmp/big; echo kept > /opt/k")
        assert job["exit_code"] == 0, job
        job = await run_in(http, backend, "other", "head -c 12M /dev/zero > /opt/mine && echo ok")
        assert job["stdout"].strip() == "ok", job
        got = await stub.GetActor(pb.GetActorRequest(actor=ref("other")))
        assert state(got) == "RUNNING"

        # restored from its image, the sandbox has its files and the same limit
        await stub.PauseActor(pb.PauseActorRequest(actor=ref("filler")))
        await stub.ResumeActor(pb.ResumeActorRequest(actor=ref("filler")))
        job = await run_in(http, backend, "filler", "cat /opt/k; head -c 40M /dev/zero > /opt/b")
        assert job["stdout"].strip() == "kept", job
        assert "No space left on device" in job["stderr"], job
        for name in ("filler", "other"):
            await stub.DeleteActor(pb.DeleteActorRequest(actor=ref(name), any_state=True))
