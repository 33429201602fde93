"""NeMo Gym's session checkpoint protocol end to end on a local backend, driven as it drives us.

`checkpointer.Checkpointer` models the protocol's shape: sessions exported in parallel (at most
16 calls at once, against 4 worker slots, so the idle policy and the snapshots' suspends make
room), parked, restored all or nothing in a provider of their own (as a fresh process would),
the superseded sandboxes stopped through `connect()`, the snapshots forgotten. Session ids are
Gym-style: not DNS labels. On gVisor a process's memory survives the round trip.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import grpc
import pytest

from gym_substrate.ateapi.eras import CURRENT, V03, V04
from gym_substrate.nemo.types import SandboxSpec, SandboxStatus

from .checkpointer import Checkpointer, CheckpointError
from .conftest import Stack, make_stack
from .test_forks_local import MEMORY_KEEPER, _ask, _write

PROVIDER = {
    "lifecycle": {"idle_policy": "pause", "idle_after_s": 0.5},
    "create": {"ready_timeout_s": 180},
}


def _spec(i: int) -> SandboxSpec:
    return SandboxSpec(workdir=f"/tmp/session-{i}", env={"SESSION": f"s{i}"})


async def _start(stack: Stack, ckpt: Checkpointer, ids: list[str], memory: bool) -> dict[str, Any]:
    """Every session created and working; what each holds at the commit (its memory too)."""
    provider = ckpt.provider
    handles = await asyncio.gather(*(ckpt.create(s, _spec(i)) for i, s in enumerate(ids)))
    keeper = _write(stack.tmp, "keeper.py", MEMORY_KEEPER)

    async def work(i: int, handle: Any) -> Any:
        done = await provider.exec(handle, f"echo committed-{i} > state.txt")
        assert done.return_code == 0, done
        if not memory:
            return None
        await provider.upload_file(handle, keeper, "/tmp/k.py")
        started = await provider.exec_with_background_services(
            handle, "nohup python3 /tmp/k.py >/dev/null 2>&1 &"
        )
        assert started.return_code == 0, started
        return await _ask(provider, handle)

    held = await asyncio.gather(*(work(i, h) for i, h in enumerate(handles)))
    return dict(zip(ids, held, strict=True))


async def _round_trip(stack: Stack, sessions: int, *, memory: bool) -> None:
    provider = stack.provider(**PROVIDER)
    ckpt = Checkpointer(provider, parallelism=16)
    ids = [f"Sess_{i:02d}:{uuid.uuid4().hex[:6]}/ÄB" for i in range(sessions)]
    held = await _start(stack, ckpt, ids, memory)

    states = await ckpt.export(ids)
    for session_id, state in states.items():
        assert type(state.snapshot_id) is str
        assert state.snapshot_id.startswith(f"gym/ng-sess-{session_id[5:7]}-")
    labels = {s.ref: s.label for s in await provider.list_snapshots()}
    for session_id, state in states.items():  # the caller's name, where list_snapshots shows it
        assert labels[state.snapshot_id].startswith(f"ng-{session_id[:16]}-")
    # the sessions move on past the commit, then are parked: neither is what a restore gets
    await asyncio.gather(
        *(provider.exec(h, "echo after > state.txt") for h, _ in ckpt.sessions.values())
    )
    await ckpt.park(ids)
    originals = set(await stack.actors())
    assert len(originals) == sessions
    handle = ckpt.sessions[ids[0]][0]
    assert await provider.status(handle) == SandboxStatus.PAUSED  # parked, not a checkpoint

    restorer = stack.provider(**PROVIDER)
    again = Checkpointer(restorer, parallelism=16)
    stack.grpc_proxy.inject("CreateActor", grpc.StatusCode.PERMISSION_DENIED, "injected")
    with pytest.raises(CheckpointError, match="could not be re-created"):
        await again.restore(states)
    assert set(await stack.actors()) == originals  # no restored handle stays active
    assert again.sessions == {}

    await again.restore(states)
    assert not originals & set(await stack.actors())  # superseded: stopped through connect()
    for i, session_id in enumerate(ids):
        restored = again.sessions[session_id][0]
        seen = await restorer.exec(restored, "cat state.txt; pwd; echo $SESSION")
        assert seen.stdout == f"committed-{i}\n/tmp/session-{i}\ns{i}\n", seen
        if memory:
            assert await _ask(restorer, restored) == held[session_id]  # the same process

    for session_id in ids:  # stop and forget
        await again.stop(session_id, states[session_id].snapshot_id)
    await restorer.delete_snapshot(states[ids[0]].snapshot_id)  # gone already: quiet
    assert await restorer.list_snapshots() == []
    assert await stack.actors() == []
    await restorer.aclose()
    await provider.aclose()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("era", "sessions"), [(CURRENT, 16), (V03, 4), (V04, 4)]
)  # the release eras the backend serves (issue 30), with fewer sessions to spare CI's time
async def test_the_checkpoint_protocol_round_trip_on_the_process_runtime(
    tmp_path: Path, era: str, sessions: int
) -> None:
    async with make_stack(tmp_path, workers=4, api_era=era) as stack:
        await _round_trip(stack, sessions, memory=False)


@pytest.mark.runsc
async def test_the_checkpoint_protocol_keeps_a_process_memory_on_gvisor(tmp_path: Path) -> None:
    async with make_stack(tmp_path, workers=4, runtime="gvisor") as stack:
        await _round_trip(stack, 16, memory=True)  # 16 sessions at parallelism 16, 4 slots
