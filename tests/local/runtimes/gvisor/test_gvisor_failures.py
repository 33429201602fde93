"""Failures injected at each step of a start, a freeze, a thaw and an eviction under real runsc.

Issue 29: at 200 parked sandboxes a start failed in `ip -n <netns> -batch -` (`Cannot open
network namespace`): the error escaped as a class the control plane did not expect, and the
namespace had been removed behind the slot's back. Whatever fails now, the runtime answers
`RuntimeFailure`, leaves no sandbox on the slot, leaves every slot's namespace whole (or
rebuilds one found gone), and the next start on the slot works. The conftest's teardown proves
nothing is left on the host.
"""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path
from typing import Any

import pytest
from gvisor_helpers import counter_template, get, new_instance

from gym_substrate.local.runtimes.base import (
    ActorSpec,
    RuntimeConfig,
    RuntimeFailure,
    Slot,
    SnapshotKind,
)
from gym_substrate.local.runtimes.gvisor import net
from gym_substrate.local.runtimes.gvisor._proc import CommandError
from gym_substrate.local.runtimes.gvisor.cgfreeze import FreezeError
from gym_substrate.local.runtimes.gvisor.runsc import RunscError

pytestmark = pytest.mark.runsc


@pytest.fixture
def runtime_config(tmp_path: Path) -> RuntimeConfig:
    return RuntimeConfig(
        runtime_dir=tmp_path / "state" / "runtime" / "gvisor",
        instance=new_instance(),
        workers=2,
        extra={"gvisor.pause_tier": "freeze", "gvisor.frozen_memory": "4G"},
    )


def _fail(error: Exception) -> Any:
    async def fail(*args: Any, **kwargs: Any) -> Any:
        raise error

    return fail


async def _slot_is_clean(runtime: Any, slot: int) -> None:
    """The slot's namespace is whole and no sandbox of ours runs in it."""
    assert await asyncio.to_thread(net.slot_net_intact, runtime.nets.by_slot[slot])
    for sandbox in list(runtime.sandboxes.known.values()):
        if sandbox.slot == slot:
            assert not await runtime.is_alive(sandbox.cid), sandbox


async def _start_works(runtime: Any, tmp_path: Path, slot: int, name: str) -> Any:
    actor = ActorSpec("default", name, counter_template(tmp_path / "snaps", marker=False))
    started = await runtime.start(actor, Slot(slot), None, timeout_s=30)
    assert (await asyncio.to_thread(get, started.address, "/state"))["actor_id"] == name
    return started


START_STEPS = {
    "veth address reset (ip)": ("net.reset_sandbox_addr", CommandError("`ip -n` failed")),
    "runsc run": ("runsc.run", RunscError("runsc run failed")),
    "wakeup probe": ("sandboxes.wait_ready", RuntimeFailure("probe never answered")),
    "an unexpected class": ("net.reset_sandbox_addr", KeyError("eth0")),
}


@pytest.mark.parametrize("step", list(START_STEPS))
async def test_a_start_that_fails_at_any_step_leaves_the_slot_clean(
    runtime: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    where, error = START_STEPS[step]
    owner, _, name = where.rpartition(".")
    target = {"net": net, "runsc": runtime.runsc, "sandboxes": runtime.sandboxes}[owner]
    with monkeypatch.context() as patch:
        patch.setattr(target, name, _fail(error))
        actor = ActorSpec("default", "doomed", counter_template(tmp_path / "snaps"))
        with pytest.raises(RuntimeFailure):
            await runtime.start(actor, Slot(0), None, timeout_s=30)
    await _slot_is_clean(runtime, 0)
    started = await _start_works(runtime, tmp_path, 0, "after")
    await runtime.stop(started.handle)


async def test_a_namespace_removed_behind_the_slots_back_is_rebuilt(
    runtime: Any, tmp_path: Path
) -> None:
    """The wedge's first error, `Cannot open network namespace`: the start repairs it."""
    slot_net = runtime.nets.by_slot[0]
    await asyncio.to_thread(subprocess.run, ["ip", "netns", "del", slot_net.netns], check=True)
    started = await _start_works(runtime, tmp_path, 0, "repaired")
    assert runtime.repaired_nets == 1
    assert started.address == runtime.worker_ip(Slot(0))
    await runtime.stop(started.handle)


async def test_a_freeze_that_fails_keeps_the_sandbox_running(
    runtime: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started = await _start_works(runtime, tmp_path, 0, "keeps")
    actor = ActorSpec("default", "keeps", counter_template(tmp_path / "snaps", marker=False))
    with monkeypatch.context() as patch:
        patch.setattr(runtime.tier, "set_frozen", _fail(FreezeError("will not settle")))
        with pytest.raises(RuntimeFailure, match="freezing"):
            await runtime.checkpoint(actor, started.handle, SnapshotKind.LOCAL, tmp_path / "p")
    assert await runtime.is_alive(started.handle)
    assert runtime.tier.frozen == {}
    assert (await asyncio.to_thread(get, started.address, "/state"))["actor_id"] == "keeps"
    await runtime.stop(started.handle)
    await _slot_is_clean(runtime, 0)


async def test_a_thaw_whose_probe_fails_frees_the_slot(
    runtime: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started = await _start_works(runtime, tmp_path, 0, "thawed")
    actor = ActorSpec("default", "thawed", counter_template(tmp_path / "snaps", marker=False))
    paused = await runtime.checkpoint(actor, started.handle, SnapshotKind.LOCAL, tmp_path / "p")
    with monkeypatch.context() as patch:
        never = _fail(RuntimeFailure("probe never answered"))
        patch.setattr(runtime.sandboxes, "wait_ready", never)
        with pytest.raises(RuntimeFailure, match="probe"):
            await runtime.start(actor, Slot(1), paused.snapshot, timeout_s=30)
    assert not await runtime.is_alive(started.handle)  # ended, not left on the slot
    await _slot_is_clean(runtime, 1)
    again = await _start_works(runtime, tmp_path, 1, "next")
    await runtime.stop(again.handle)


async def test_an_eviction_that_fails_loses_only_that_pause_and_no_namespace(
    runtime: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint that ends the sandbox as it fails (gVisor's way with a save that runs out
    of space) loses that pause, reported, and nothing else."""
    started = await _start_works(runtime, tmp_path, 0, "evicted")
    actor = ActorSpec("default", "evicted", counter_template(tmp_path / "snaps", marker=False))
    paused = await runtime.checkpoint(actor, started.handle, SnapshotKind.LOCAL, tmp_path / "p")
    (entry,) = runtime.tier.frozen.values()

    async def save_fails_and_ends_it(cid: str, *args: Any, **kwargs: Any) -> None:
        await runtime.sandboxes.kill(cid, after="a failed save")  # until it has exited
        raise RunscError("no space left")

    with monkeypatch.context() as patch:
        patch.setattr(runtime.runsc, "checkpoint", save_fails_and_ends_it)
        with pytest.raises(RuntimeFailure, match="checkpointing frozen"):
            await runtime.tier.evict(entry.cid, reason="a test")
    assert runtime.tier.frozen == {}
    assert entry.unit in runtime.units.spares  # its namespace is a spare, whole
    assert await asyncio.to_thread(net.slot_net_intact, entry.slotnet)
    with pytest.raises(RuntimeFailure, match="lost"):
        await runtime.start(actor, Slot(0), paused.snapshot, timeout_s=30)
    await _slot_is_clean(runtime, 0)
    for slot in (0, 1):  # the spare goes to the next freeze; both slots still start
        again = await _start_works(runtime, tmp_path, slot, f"next{slot}")
        await runtime.stop(again.handle)


async def test_an_eviction_that_fails_with_the_sandbox_alive_keeps_it_frozen(
    runtime: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint that fails before it touched the sandbox (runsc refused, a thaw failed):
    the sandbox is frozen again and its pause goes on, memory and all."""
    started = await _start_works(runtime, tmp_path, 0, "kept")
    actor = ActorSpec("default", "kept", counter_template(tmp_path / "snaps", marker=False))
    paused = await runtime.checkpoint(actor, started.handle, SnapshotKind.LOCAL, tmp_path / "p")
    (entry,) = runtime.tier.frozen.values()
    with monkeypatch.context() as patch:
        patch.setattr(runtime.runsc, "checkpoint", _fail(RunscError("refused")))
        with pytest.raises(RuntimeFailure, match="it stays frozen, nothing is lost"):
            await runtime.tier.evict(entry.cid, reason="a test")
    assert list(runtime.tier.frozen) == [entry.cid]
    resumed = await runtime.start(actor, Slot(0), paused.snapshot, timeout_s=30)
    assert resumed.handle == entry.cid  # thawed, the same sandbox
    assert (await asyncio.to_thread(get, resumed.address, "/state"))["actor_id"] == "kept"
    await runtime.stop(resumed.handle)
    await _slot_is_clean(runtime, 0)
