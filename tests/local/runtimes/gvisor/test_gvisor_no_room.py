"""A gVisor park that cannot fit is refused up front and loses nothing (issue 32, item 6).

Found: with 100 MiB written into the sandbox's own files and less than that free where its image
goes, the room check let the checkpoint start and it failed with ENOSPC: the actor was CRASHED
and everything since its last snapshot was gone. The check estimated the image from `runsc
events --stats`, which leaves out the sandbox's in-memory root overlay: gVisor keeps the files
written to `/` in a deleted host file the sentry holds open (`/runsc-filestore-<n>`), counted in
no usage figure and in no process's PSS, and a checkpoint writes it out with the memory.
Measured here on 2026-12-04: 100 MiB written to /root moved the reported usage from 36.1 to
37.6 MB and the PSS from 72 to 74 MB, while the filestore's blocks went from 2.3 to 107 MB.
Now the estimate adds the filestore, and the frozen tier's measure counts it too: a pause on the
checkpoint tier, and a suspend of a frozen actor, are RESOURCE_EXHAUSTED and the actor keeps
running (or stays paused) with its file.
"""

from __future__ import annotations

from pathlib import Path

import aiohttp
import grpc
import pytest
from local_helpers import make_actor, ref, run_in, settle_golden, state, tmpfs_folder

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.ateapi import ateapi_pb2_grpc as pb_grpc
from gym_substrate.local import LocalBackend
from gym_substrate.local.snapshots import free_bytes

pytestmark = [pytest.mark.runsc, pytest.mark.slow]

MIB = 1 << 20


async def _refused(call: object) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call  # type: ignore[misc]
    assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, raised.value
    return raised.value.details() or ""


@pytest.mark.parametrize("tier", ["checkpoint", "freeze"])
async def test_a_park_that_cannot_fit_keeps_the_sandbox_and_its_files(
    tmp_path: Path, tier: str
) -> None:
    with tmpfs_folder(tmp_path / "state", "160m") as state_dir:
        backend = LocalBackend(
            state_dir,
            runtime="gvisor",
            workers=1,
            actors_per_worker=1,
            default_rootfs="host",
            allow_host_rootfs=True,
            pause_tier=tier,
            warm_pool=0,
        )
        async with (
            backend,
            grpc.aio.insecure_channel(backend.api_address) as channel,
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http,
        ):
            await settle_golden(backend)
            stub = pb_grpc.ControlStub(channel)
            await make_actor(stub, "big")
            await stub.ResumeActor(pb.ResumeActorRequest(actor=ref("big")))
            size = free_bytes(state_dir) + 10 * MIB  # more than the state folder has left
            job = await run_in(
                http, backend, "big", f"head -c {size} /dev/urandom > /root/big && echo ok"
            )
            assert job["stdout"].strip() == "ok", job
            if tier == "checkpoint":
                message = await _refused(stub.PauseActor(pb.PauseActorRequest(actor=ref("big"))))
                assert "keeps running" in message, message
                want = "RUNNING"
            else:  # the pause freezes (no image); the suspend would write it out
                paused = await stub.PauseActor(pb.PauseActorRequest(actor=ref("big")))
                assert state(paused.actor) == "PAUSED"
                message = await _refused(
                    stub.SuspendActor(pb.SuspendActorRequest(actor=ref("big")))
                )
                assert "stays PAUSED" in message, message
                want = "PAUSED"
            assert "MiB but only" in message, message
            got = await stub.GetActor(pb.GetActorRequest(actor=ref("big")))
            assert state(got) == want
            resumed = await stub.ResumeActor(pb.ResumeActorRequest(actor=ref("big")))
            assert state(resumed.actor) == "RUNNING"  # a frozen one thaws: nothing was lost
            job = await run_in(http, backend, "big", "wc -c < /root/big")
            assert job["stdout"].strip() == str(size), job
            await stub.DeleteActor(pb.DeleteActorRequest(actor=ref("big"), any_state=True))
