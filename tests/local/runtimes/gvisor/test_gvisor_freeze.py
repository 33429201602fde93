"""PauseActor's two tiers under real runsc: frozen in memory, or checkpointed to an image.

Every test here runs on four runtimes: the checkpoint tier (today's pause), the freeze tier
(cgroup freezer), the freeze tier with a zero memory budget, which checkpoints each frozen
sandbox as soon as it froze (eviction to the checkpoint tier), and the freeze tier through
`runsc pause` (the fallback). A pause must keep memory, files and the actor's id
on all three, and give the worker's slot back at once; the conftest's teardown proves nothing
of any tier is left on the host (sandboxes, netns, veths, cgroups, leases, nft tables).

Addresses follow upstream's rule on every tier: a started actor's address is its slot's worker
IP and its agent answers on port 80 there (kagent:controlapi/workflow_resume.go@2559ec02
copies the worker's IPs onto the actor), also once a frozen sandbox took its namespace along,
after a thaw onto another slot and after a restart; connections open at pause are reset, so
none reaches a paused actor after another one took its worker's IP.
"""

from __future__ import annotations

import asyncio
import http.client
import json
from pathlib import Path
from typing import Any

import pytest
from gvisor_helpers import counter_template, get, kernel_leftovers, new_instance

from gym_substrate.local.runtimes.base import ActorSpec, RuntimeConfig, Slot, SnapshotKind
from gym_substrate.local.runtimes.gvisor.freezer import FROZEN_MARKER

pytestmark = pytest.mark.runsc

TIERS: dict[str, dict[str, str]] = {
    "checkpoint": {"gvisor.pause_tier": "checkpoint"},
    "freeze": {"gvisor.pause_tier": "freeze", "gvisor.frozen_memory": "4G"},
    "freeze-evicted": {"gvisor.pause_tier": "freeze", "gvisor.frozen_memory": "0"},
    # `runsc pause`, the fallback where the sandbox's cgroup is out of reach
    "freeze-runsc": {"gvisor.pause_tier": "freeze", "gvisor.freezer": "runsc"},
}


@pytest.fixture(params=list(TIERS))
def tier(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def runtime_config(tmp_path: Path, tier: str) -> RuntimeConfig:
    return RuntimeConfig(
        runtime_dir=tmp_path / "state" / "runtime" / "gvisor",
        instance=new_instance(),
        workers=2,
        extra=TIERS[tier],
    )


async def aget(address: str, path: str) -> dict[str, Any]:
    return await asyncio.to_thread(get, address, path)


async def _settle(runtime: Any) -> None:
    """Wait for the tier's background work (PSS measurement, evictions) to end."""
    while runtime.tier._tasks:
        await asyncio.gather(*list(runtime.tier._tasks), return_exceptions=True)


async def test_pause_keeps_memory_files_and_frees_the_slot_on_every_tier(
    runtime: Any, tier: str, tmp_path: Path
) -> None:
    template = counter_template(tmp_path / "snaps")
    actor = ActorSpec("default", "tiered", template)
    started = await runtime.start(actor, Slot(0), None, timeout_s=30)
    assert started.address == runtime.worker_ip(Slot(0))
    await aget(started.address, "/write?text=kept")
    before = await aget(started.address, "/state")
    kept_alive = http.client.HTTPConnection(started.address, 80, timeout=10)
    await asyncio.to_thread(_request, kept_alive, "/readyz")

    paused = await runtime.checkpoint(
        actor, started.handle, SnapshotKind.LOCAL, tmp_path / "local" / "p1"
    )
    assert paused.memory_kept
    await _settle(runtime)
    folder = paused.snapshot.path
    if tier in ("freeze", "freeze-runsc"):
        assert (folder / FROZEN_MARKER).is_file()
        assert paused.retained_handle == started.handle
        assert await runtime.is_alive(started.handle)  # frozen, not gone
        (entry,) = runtime.tier.frozen.values()
        assert entry.pss > 10 * 2**20  # measured while frozen (the budget counts it)
        assert runtime.tier.frozen_bytes() == entry.pss
    else:
        assert (folder / "checkpoint.img").is_file()
        assert not (folder / FROZEN_MARKER).exists()
        assert not await runtime.is_alive(started.handle)
    if tier == "freeze-evicted":
        assert runtime.tier.evictions == 1

    # The slot is free at once: another actor runs there while the first one is paused.
    other = ActorSpec("default", "neighbour", counter_template(tmp_path / "snaps", marker=False))
    neighbour = await runtime.start(other, Slot(0), None, timeout_s=30)
    assert neighbour.address == runtime.worker_ip(Slot(0))
    assert (await aget(neighbour.address, "/state"))["actor_id"] == "neighbour"
    # the connection opened before the pause was reset: it reaches neither actor
    with pytest.raises((OSError, http.client.HTTPException)):
        await asyncio.to_thread(_request, kept_alive, "/readyz")
    kept_alive.close()

    resumed = await runtime.start(actor, Slot(1), paused.snapshot, timeout_s=30)
    assert resumed.address == runtime.worker_ip(Slot(1))  # thawed onto the other slot
    assert resumed.memory_restored
    after = await aget(resumed.address, "/state")
    assert after["boot_nonce"] == before["boot_nonce"]
    assert after["counter"] == before["counter"] + 1
    assert after["marker"] == "kept"
    assert after["actor_id"] == "tiered"
    assert resumed.address != neighbour.address

    # Pause again, then suspend the paused actor (what tags and forks need): a durable image
    # that restores memory, on every tier.
    again = await runtime.checkpoint(
        actor, resumed.handle, SnapshotKind.LOCAL, tmp_path / "local" / "p2"
    )
    dest = tmp_path / "snaps" / "tiered" / "s1"
    uploaded = await runtime.upload(actor, again.snapshot, again.retained_handle or "", dest)
    assert (dest / "checkpoint.img").is_file()
    assert not await runtime.is_alive(resumed.handle)
    back = await runtime.start(actor, Slot(1), uploaded.snapshot, timeout_s=30)
    assert back.address == runtime.worker_ip(Slot(1))
    final = await aget(back.address, "/state")
    assert (final["boot_nonce"], final["counter"]) == (before["boot_nonce"], before["counter"] + 2)
    assert final["marker"] == "kept"
    await _settle(runtime)


def _request(connection: http.client.HTTPConnection, path: str) -> dict[str, Any]:
    """GET ``path`` on a kept-alive connection (the connection stays open for the next)."""
    connection.request("GET", path)
    response = connection.getresponse()
    data: dict[str, Any] = json.loads(response.read())
    return data


@pytest.mark.parametrize("tier", ["freeze"])  # the tier that keeps sandboxes across restarts
async def test_frozen_actors_survive_a_runtime_restart_and_are_parked_at_down(
    runtime: Any, runtime_config: RuntimeConfig, tier: str, tmp_path: Path
) -> None:
    from gym_substrate.local.runtimes.gvisor import GvisorRuntime

    template = counter_template(tmp_path / "snaps", marker=False)
    actors = [ActorSpec("default", f"keep-{i}", template) for i in range(3)]
    states, snaps = [], []
    for i, actor in enumerate(actors):  # three actors through two slots: freezing frees them
        started = await runtime.start(actor, Slot(i % 2), None, timeout_s=30)
        states.append(await aget(started.address, "/state"))
        snaps.append(
            await runtime.checkpoint(
                actor, started.handle, SnapshotKind.LOCAL, tmp_path / "local" / actor.actor_id
            )
        )
    await _settle(runtime)
    worker_ips = [runtime.worker_ip(Slot(i)) for i in (0, 1)]
    await runtime.close()  # the control plane goes (as after SIGKILL: state is on disk)

    again = GvisorRuntime(runtime_config)
    await again.open()
    try:
        assert set(again.tier.frozen) == {s.retained_handle for s in snaps}
        assert await again.sweep(keep=[s.retained_handle for s in snaps]) == []
        # both slots' namespaces went with frozen sandboxes; the workers keep their IPs
        assert [again.worker_ip(Slot(i)) for i in (0, 1)] == worker_ips
        resumed = await again.start(actors[0], Slot(1), snaps[0].snapshot, timeout_s=30)
        assert resumed.address == worker_ips[1]  # actor 0 froze on slot 0
        state = await aget(resumed.address, "/state")
        assert (state["boot_nonce"], state["counter"]) == (
            states[0]["boot_nonce"],
            states[0]["counter"] + 1,
        )
        # `local down`: the frozen ones become images in their folders, then restore.
        await again.park_paused()
        assert again.tier.frozen == {}
        for snap in snaps[1:]:
            assert (snap.snapshot.path / "checkpoint.img").is_file()
            assert not (snap.snapshot.path / FROZEN_MARKER).exists()
        restored = await again.start(actors[2], Slot(0), snaps[2].snapshot, timeout_s=30)
        assert restored.address == worker_ips[0]
        state = await aget(restored.address, "/state")
        assert state["boot_nonce"] == states[2]["boot_nonce"]
    finally:
        await again.cleanup()
    assert await again.leftovers() == []
    assert kernel_leftovers(runtime_config.instance, runtime_config.runtime_dir) == []


async def test_deleting_a_frozen_actor_ends_its_sandbox(
    runtime: Any, tier: str, tmp_path: Path
) -> None:
    template = counter_template(tmp_path / "snaps", marker=False)
    actor = ActorSpec("default", "doomed", template)
    started = await runtime.start(actor, Slot(0), None, timeout_s=30)
    paused = await runtime.checkpoint(
        actor, started.handle, SnapshotKind.LOCAL, tmp_path / "local" / "d"
    )
    await runtime.stop(paused.retained_handle or started.handle)
    assert not await runtime.is_alive(started.handle)
    assert runtime.tier.frozen == {}
    await _settle(runtime)
