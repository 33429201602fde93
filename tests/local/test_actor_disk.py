"""Per-actor disk limits (process runtime): an actor that fills its own folder gets ENOSPC in
its exec, and nothing else notices.

Seen under the process runtime (issue 24, defect 4): one actor's 65 MB write filled the state
folder that every actor, snapshot and the control plane's database share. With a limit each
actor's working folder and /tmp are a file system of that size (`runtimes/actor_disk.py`): a
write past it fails inside that actor only; another actor still writes, the API still answers,
and the actor's files survive a suspend and resume into a folder with the same limit.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import grpc
import pytest
from ci_policy import ON_CI
from local_helpers import make_actor, ref, run_in, settle_golden, state

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.ateapi import ateapi_pb2_grpc as pb_grpc
from gym_substrate.local import LocalBackend
from gym_substrate.local.runtimes import actor_disk
from gym_substrate.local.statedir import state_leftovers


@pytest.fixture
async def limited(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[LocalBackend]:
    if actor_disk.problem() is not None:
        if ON_CI:
            pytest.fail(f"CI runs as root: actor disk limits must work ({actor_disk.problem()})")
        pytest.skip(f"no actor disk limits here: {actor_disk.problem()}")
    # through the variable `local up`'s children honour, so the old code shows the defect
    monkeypatch.setenv(actor_disk.ACTOR_DISK_ENV, "8MiB")
    state_dir = tmp_path / "state"
    backend = LocalBackend(
        state_dir, runtime="process", workers=2, actors_per_worker=1, default_rootfs="host"
    )
    async with backend:
        await settle_golden(backend)
        yield backend
    assert await state_leftovers(state_dir) == []


async def test_an_actor_that_fills_its_disk_gets_enospc_and_nobody_else_notices(
    limited: LocalBackend,
) -> None:
    backend = limited
    async with (
        grpc.aio.insecure_channel(backend.api_address) as channel,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http,
    ):
        stub = pb_grpc.ControlStub(channel)
        for name in ("filler", "other"):
            await make_actor(stub, name)
            await stub.ResumeActor(pb.ResumeActorRequest(actor=ref(name)))
        job = await run_in(http, backend, "filler", "head -c 20M /dev/zero > big; echo rc=$?")
        assert "No space left on device" in job["stderr"], job
        assert "rc=1" in job["stdout"], job
        job = await run_in(http, backend, "filler", "head -c 9M /dev/zero > /tmp/t; echo rc=$?")
        assert "rc=1" in job["stdout"], job  # its /tmp shares the limit
        job = await run_in(http, backend, "filler", "rm -f big /tmp/t; echo kept > keep")
        assert job["exit_code"] == 0, job

        # another actor and the control plane are untouched
        job = await run_in(http, backend, "other", "head -c 6M /dev/zero > mine && echo ok")
        assert job["stdout"].strip() == "ok", job
        got = await stub.GetActor(pb.GetActorRequest(actor=ref("other")))
        assert state(got) == "RUNNING"

        # its files come back after a suspend, into a folder with the same limit
        await stub.SuspendActor(pb.SuspendActorRequest(actor=ref("filler")))
        await stub.ResumeActor(pb.ResumeActorRequest(actor=ref("filler")))
        job = await run_in(http, backend, "filler", "cat keep; head -c 20M /dev/zero > big")
        assert job["stdout"].strip() == "kept", job
        assert "No space left on device" in job["stderr"], job

        for name in ("filler", "other"):
            await stub.DeleteActor(pb.DeleteActorRequest(actor=ref(name), any_state=True))
    actors = backend.state_dir / "runtime" / "process" / "actors"
    assert actor_disk.mounts_under(actors) == []
    assert list(actors.rglob("*.disk")) == []  # DeleteActor dropped the images


def test_actor_disk_sizes_are_validated() -> None:
    assert actor_disk.parse_size("1GiB") == 1 << 30
    assert actor_disk.parse_size("512M") == 512 << 20
    assert actor_disk.parse_size("0") == 0
    for bad in ("-1G", "lots", "1k", "nan"):
        with pytest.raises(ValueError, match="not a size"):
            actor_disk.parse_size(bad)


def test_up_names_a_bad_actor_disk_before_starting(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from gym_substrate.cli.local import local

    result = CliRunner().invoke(
        local, ["up", "--state-dir", str(tmp_path / "state"), "--actor-disk", "1x"]
    )
    assert result.exit_code != 0
    assert "--actor-disk: actor disk '1x' is not a size" in result.output
    assert not (tmp_path / "state").exists()  # refused before anything was made


def test_a_bad_actor_disk_variable_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(actor_disk.ACTOR_DISK_ENV, "2k")
    with pytest.raises(ValueError, match=f"{actor_disk.ACTOR_DISK_ENV}: actor disk '2k'"):
        LocalBackend(tmp_path / "state", runtime="process")
