"""A restart copes with a sandbox left frozen in its cgroup that the frozen book never knew.

Found by `gym-substrate bench soak` with `local up`'s warm pool: after a SIGKILL the next start
failed, `runsc delete --force` timing out on a sandbox that was frozen in its cgroup (a kill
between a freeze and the book's write leaves one: runsc reports it "running"). A frozen task
cannot die and `runsc state` waits on its sentry forever. Reproduced here, the start adopted
the frozen sandbox as RUNNING and `stop()` then failed on `runsc state` after 10 s. Now the
adoption thaws such a sandbox (its pause was never recorded, so RUNNING is right and nothing is
lost), and every kill and discard thaws first.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import grpc
import pytest
from local_helpers import make_actor, ref, settle_golden

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.ateapi import ateapi_pb2_grpc as pb_grpc
from gym_substrate.local import LocalBackend
from gym_substrate.local.runtimes.gvisor import cgfreeze

pytestmark = [pytest.mark.runsc, pytest.mark.slow]


def _options() -> dict[str, object]:
    return {"runtime": "gvisor", "workers": 1, "actors_per_worker": 1, "default_rootfs": "host"}


async def test_a_start_adopts_a_sandbox_frozen_behind_the_books_back(tmp_path: Path) -> None:
    state = tmp_path / "state"
    first = LocalBackend(state, warm_pool=0, **_options())  # type: ignore[arg-type]
    await first.start()
    await settle_golden(first)
    async with grpc.aio.insecure_channel(first.api_address) as channel:
        stub = pb_grpc.ControlStub(channel)
        await make_actor(stub, "a")
        await stub.ResumeActor(pb.ResumeActorRequest(actor=ref("a")))
    assert first.plane is not None
    cid = first.plane.state.actors["t/a"].handle
    root = state / "runtime" / "gvisor" / "runsc"
    shown = await asyncio.to_thread(
        subprocess.run, ["runsc", f"--root={root}", "state", cid], capture_output=True
    )
    pid = int(json.loads(shown.stdout)["pid"])
    await first.detach()  # a control plane gone, its sandboxes still there (as after kill -9)
    freezer = cgfreeze.find_freezer(pid)
    assert freezer is not None, "the sandbox has no cgroup freezer here"
    freezer.freeze()  # frozen behind the book's back: its actor cannot be adopted
    second = LocalBackend(state, warm_pool=0, **_options())  # type: ignore[arg-type]
    await asyncio.wait_for(second.start(), 60)
    try:
        assert second.plane is not None
        record = second.plane.state.actors["t/a"]
        assert (record.state, record.handle) == ("RUNNING", cid)  # adopted, nothing lost
        assert not freezer.frozen()  # and running again
    finally:
        await asyncio.wait_for(second.stop(), 60)  # before the fix: `runsc state` timed out
