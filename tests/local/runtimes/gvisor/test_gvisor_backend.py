"""End to end through LocalBackend with runtime="gvisor": gRPC lifecycle + the real agent.

The fixtures (`backend`, `stub`, `http`) come from tests/local/conftest.py, which ends every
backend with a leak check; here `runtime_name` selects gVisor. The agent is dialled at the
address the actor's record holds, as the router dials it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
from local_helpers import agent_url, make_actor, ref

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.local import LocalBackend

pytestmark = pytest.mark.runsc

# A process inside the actor that counts in memory and mirrors the count to a file: after a
# resume the count goes on from where it was, which a restarted process could not do. The
# file is replaced atomically so a reader never sees it empty.
COUNTER = (
    "import os, time\n"
    "i = 0\n"
    "while True:\n"
    "    i += 1\n"
    "    open('/var/tmp/count.tmp', 'w').write(str(i))\n"
    "    os.replace('/var/tmp/count.tmp', '/var/tmp/count')\n"
    "    time.sleep(0.02)\n"
)


@pytest.fixture
def runtime_name() -> str:
    return "gvisor"


# PauseActor's tiers: a checkpoint, a frozen sandbox, and a frozen one checkpointed at once
# because its memory budget is 0 (eviction to the checkpoint tier).
TIERS = {
    "checkpoint": {"pause_tier": "checkpoint"},
    "freeze": {"pause_tier": "freeze", "frozen_memory": 4 * 2**30},
    "freeze-evicted": {"pause_tier": "freeze", "frozen_memory": 0},
}


@pytest.fixture(params=list(TIERS))
def backend_options(request: pytest.FixtureRequest) -> dict[str, Any]:
    return {"workers": 2, **TIERS[request.param]}


async def _agent(
    http: aiohttp.ClientSession,
    backend: LocalBackend,
    name: str,
    method: str,
    path: str,
    **kwargs: Any,
) -> Any:
    url = f"{agent_url(backend, name)}{path}"
    async with http.request(method, url, **kwargs) as resp:
        assert resp.status in (200, 201, 202, 206), await resp.text()
        if resp.content_type == "application/json":
            return await resp.json()
        return await resp.read()


async def _count(http: aiohttp.ClientSession, backend: LocalBackend, name: str) -> int:
    data = await _agent(http, backend, name, "GET", "/v1/files?path=/var/tmp/count")
    return int(data)


async def test_actor_keeps_memory_and_files_through_the_backend(
    backend: LocalBackend, stub: Any, http: aiohttp.ClientSession
) -> None:
    """Under gVisor a pause and a suspend both keep the sandbox's memory and files (a runsc
    checkpoint), and a new actor of the template starts from its golden tag with its own id
    and none of another actor's files (kagent:controlapi/workflow_suspend.go@2559ec02,
    functionaltest/actor_template_test.go@0e4768ab)."""
    assert backend.runtime_name == "gvisor"
    await make_actor(stub, "gv-a")
    running = (await stub.ResumeActor(pb.ResumeActorRequest(actor=ref("gv-a")))).actor
    assert running.status.state == pb.ACTOR_STATE_RUNNING
    ready = await _agent(http, backend, "gv-a", "GET", "/readyz")
    assert ready["actor_id"] == "gv-a"  # /run/ate/actor-id, not the golden actor's id

    job = await _agent(
        http,
        backend,
        "gv-a",
        "POST",
        "/v1/exec",
        json={"id": "counter", "command": ["python3", "-c", COUNTER]},
    )
    assert job["state"] == "running"
    await _agent(http, backend, "gv-a", "PUT", "/v1/files?path=/srv/note.txt", data=b"kept")
    await asyncio.sleep(0.3)
    before = await _count(http, backend, "gv-a")
    assert before > 1

    paused = (await stub.PauseActor(pb.PauseActorRequest(actor=ref("gv-a")))).actor
    assert paused.status.state == pb.ACTOR_STATE_PAUSED
    await stub.ResumeActor(pb.ResumeActorRequest(actor=ref("gv-a")))
    after_pause = await _count(http, backend, "gv-a")
    assert after_pause >= before
    job = await _agent(http, backend, "gv-a", "GET", "/v1/exec/counter")
    assert job["state"] == "running"  # the agent's job table (memory) and the process survived

    suspended = (await stub.SuspendActor(pb.SuspendActorRequest(actor=ref("gv-a")))).actor
    assert suspended.status.state == pb.ACTOR_STATE_SUSPENDED
    await stub.ResumeActor(pb.ResumeActorRequest(actor=ref("gv-a")))
    note = await _agent(http, backend, "gv-a", "GET", "/v1/files?path=/srv/note.txt")
    assert note == b"kept"
    assert await _count(http, backend, "gv-a") >= after_pause
    assert (await _agent(http, backend, "gv-a", "GET", "/v1/exec/counter"))["state"] == "running"

    # Another actor of the same template starts from the golden snapshot: own id, no files of a.
    await make_actor(stub, "gv-b")
    await stub.ResumeActor(pb.ResumeActorRequest(actor=ref("gv-b")))
    assert (await _agent(http, backend, "gv-b", "GET", "/readyz"))["actor_id"] == "gv-b"
    url = f"{agent_url(backend, 'gv-b')}/v1/stat?path=/srv/note.txt"
    async with http.get(url) as resp:
        assert resp.status == 404

    for name in ("gv-a", "gv-b"):
        await stub.SuspendActor(pb.SuspendActorRequest(actor=ref(name)))
        await stub.DeleteActor(pb.DeleteActorRequest(actor=ref(name)))
