"""GvisorRuntime against real runsc: memory and files survive pause, suspend and slot changes.

The counter agent holds a request counter and a boot nonce (drawn at process start) in memory
and writes a marker file into the root overlay, so each assertion separates "restored from a
snapshot" (same nonce, counter continues) from "booted afresh" (new nonce, counter restarts).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest
from gvisor_helpers import counter_template, get

from gym_substrate.local.runtimes.base import (
    ActorSpec,
    RuntimeFailure,
    Slot,
    SnapshotKind,
    SnapshotRef,
)
from gym_substrate.local.runtimes.gvisor import gvisor_problem

pytestmark = pytest.mark.runsc


async def aget(address: str, path: str) -> dict[str, Any]:
    return await asyncio.to_thread(get, address, path)


def test_gvisor_works_here_and_the_answer_is_cached() -> None:
    assert gvisor_problem() is None
    assert gvisor_problem.cache_info().currsize == 1  # type: ignore[attr-defined]


async def _golden(runtime: Any, template: Any, dest: Path) -> SnapshotRef:
    """What the control plane's golden build leaves: a golden actor booted, checkpointed into
    durable storage, and that snapshot copied into a tag (here: used in place, as a TAG)."""
    golden = ActorSpec("ate-golden", "0f0e5c3a-golden", template)
    booted = await runtime.start(golden, Slot(0), None, timeout_s=30)
    result = await runtime.checkpoint(golden, booted.handle, SnapshotKind.EXTERNAL, dest)
    assert result.memory_kept
    assert ("checkpoint", dict(result.files)["checkpoint"]) in result.files
    return SnapshotRef(SnapshotKind.TAG, result.snapshot.path)


async def test_memory_and_files_survive_pause_suspend_and_slot_moves(
    runtime: Any, tmp_path: Path
) -> None:
    template = counter_template(tmp_path / "snaps")
    golden = await _golden(runtime, template, tmp_path / "snaps" / "golden")

    actor = ActorSpec("default", "counter-a", template)
    started = await runtime.start(actor, Slot(0), golden, timeout_s=30)
    assert started.memory_restored
    first = await aget(started.address, "/state")
    assert first["actor_id"] == "counter-a"  # /run/ate/actor-id is this actor's, not golden's
    assert first["marker"] == f"boot-{first['boot_nonce']}"  # written before the golden checkpoint
    assert first["resolv"] == "nameserver 127.0.0.1\n"
    await aget(started.address, "/write?text=written-inside")
    assert (await aget(started.address, "/state"))["counter"] == first["counter"] + 1

    # Pause: LOCAL checkpoint, then resume on the OTHER slot (new netns, new IP).
    paused = await runtime.checkpoint(
        actor, started.handle, SnapshotKind.LOCAL, tmp_path / "local" / "p1"
    )
    assert paused.memory_kept
    assert paused.size_bytes > 0
    assert not await runtime.is_alive(started.handle)
    moved = await runtime.start(actor, Slot(1), paused.snapshot, timeout_s=30)
    assert moved.address != started.address
    after_pause = await aget(moved.address, "/state")
    assert after_pause["counter"] == first["counter"] + 2  # memory kept
    assert after_pause["boot_nonce"] == first["boot_nonce"]
    assert after_pause["marker"] == "written-inside"  # file kept
    assert after_pause["actor_id"] == "counter-a"

    # Suspend: EXTERNAL checkpoint into the template's snapshot store, resume on slot 0.
    suspended = await runtime.checkpoint(
        actor, moved.handle, SnapshotKind.EXTERNAL, tmp_path / "snaps" / "counter-a" / "s1"
    )
    assert (tmp_path / "snaps" / "counter-a" / "s1" / "checkpoint.img").is_file()
    back = await runtime.start(actor, Slot(0), suspended.snapshot, timeout_s=30)
    after_suspend = await aget(back.address, "/state")
    assert after_suspend["counter"] == first["counter"] + 3
    assert after_suspend["boot_nonce"] == first["boot_nonce"]
    assert after_suspend["marker"] == "written-inside"

    # A second actor created after the golden snapshot starts from it: the golden boot's
    # nonce and marker, a fresh counter, and its own id; a cold boot draws a new nonce.
    other = ActorSpec("default", "counter-b", template)
    second = await runtime.start(other, Slot(1), golden, timeout_s=30)
    state_b = await aget(second.address, "/state")
    assert state_b["boot_nonce"] == first["boot_nonce"]
    assert state_b["marker"] == f"boot-{first['boot_nonce']}"
    assert state_b["counter"] == 1
    assert state_b["actor_id"] == "counter-b"
    await runtime.stop(second.handle)
    assert not await runtime.is_alive(second.handle)

    cold = await runtime.start(
        ActorSpec("default", "counter-c", template), Slot(1), None, timeout_s=30
    )
    assert not cold.memory_restored
    state_c = await aget(cold.address, "/state")
    assert state_c["boot_nonce"] != first["boot_nonce"]
    assert state_c["counter"] == 1
    mem = await runtime.memory_bytes(cold.handle)
    assert mem is not None
    assert 10 * 2**20 < mem < 1024 * 2**20


async def test_nothing_leaves_the_host(runtime: Any, tmp_path: Path) -> None:
    from gym_substrate.local.runtimes.gvisor import net

    template = counter_template(tmp_path / "snaps", marker=False)
    started = await runtime.start(
        ActorSpec("default", "egress", template), Slot(0), None, timeout_s=30
    )
    # The host's own outward address must be out of reach too (only the /30 peer is routed).
    route = (
        await asyncio.to_thread(
            subprocess.run,
            ["ip", "-4", "-o", "route", "get", "1.1.1.1"],
            capture_output=True,
            text=True,
            check=False,
        )
    ).stdout
    host_ip = route.split("src ")[1].split()[0] if "src " in route else "192.0.2.1"
    for target in ("1.1.1.1", "10.0.0.1", host_ip):
        result = await aget(started.address, f"/connect?host={target}&port=53")
        assert result["connected"] is False, target
        error = result["error"].lower()
        assert "unreachable" in error or "no route" in error, result

    # A host service listening on all interfaces is reachable over the veth's host end only
    # without the backend's nftables table: prove both, so the check can fail.
    listener = socket.create_server(("0.0.0.0", 0))
    try:
        port = listener.getsockname()[1]
        veth_host = ipaddress.IPv4Address(started.address.split(":")[0]) - 1
        probe = f"/connect?host={veth_host}&port={port}"
        assert (await aget(started.address, probe))["connected"] is False
        await asyncio.to_thread(net.remove_firewall, runtime.instance)
        try:
            assert (await aget(started.address, probe))["connected"] is True
        finally:
            await asyncio.to_thread(net.install_firewall, runtime.instance)
        assert (await aget(started.address, probe))["connected"] is False
    finally:
        listener.close()


async def test_failures_are_clear_and_leave_nothing(runtime: Any, tmp_path: Path) -> None:
    broken = counter_template(tmp_path / "snaps", marker=False)
    broken = type(broken)(**{**broken.__dict__, "command": ("/bin/sh", "-c", "echo boom >&2")})
    with pytest.raises(RuntimeFailure, match="boom|exited before"):
        await runtime.start(ActorSpec("default", "broken", broken), Slot(0), None, timeout_s=20)

    template = counter_template(tmp_path / "snaps", marker=False)
    missing = SnapshotRef(SnapshotKind.LOCAL, tmp_path / "nope")
    with pytest.raises(RuntimeFailure, match="no checkpoint.img"):
        await runtime.start(ActorSpec("default", "x", template), Slot(0), missing, timeout_s=20)

    # A checkpoint that fails before gVisor stops the sandbox (the image dir already holds an
    # image) says so and keeps it: it still runs and answers, and a later checkpoint works
    # (issue 24: it used to be discarded, its memory and files lost).
    actor = ActorSpec("default", "ckfail", template)
    started = await runtime.start(actor, Slot(1), None, timeout_s=30)
    dest = tmp_path / "occupied"
    dest.mkdir()
    (dest / "checkpoint.img").write_text("x")
    with pytest.raises(RuntimeFailure, match="its sandbox still runs") as info:
        await runtime.checkpoint(actor, started.handle, SnapshotKind.LOCAL, dest)
    assert not info.value.sandbox_lost
    assert await runtime.is_alive(started.handle)
    assert (await aget(started.address, "/state"))["counter"] >= 1
    done = await runtime.checkpoint(actor, started.handle, SnapshotKind.LOCAL, tmp_path / "fresh")
    assert (done.snapshot.path / "checkpoint.img").is_file()
    await runtime.close()
    assert not await runtime.is_alive(started.handle)
    assert await runtime.runsc.list() == []


async def test_restarted_runtime_adopts_running_sandboxes(
    runtime: Any, runtime_config: Any, tmp_path: Path
) -> None:
    from gym_substrate.local.runtimes.gvisor import GvisorRuntime

    template = counter_template(tmp_path / "snaps", marker=False)
    actor = ActorSpec("default", "adopted", template)
    started = await runtime.start(actor, Slot(1), None, timeout_s=30)
    assert (await aget(started.address, "/state"))["counter"] == 1
    await runtime.close()  # a control plane going away without stopping sandboxes

    again = GvisorRuntime(runtime_config)
    await again.open()  # reuses its leases: same netns, same addresses
    adopted = await again.adopt(actor, Slot(1), started.handle, started.address)
    assert adopted is not None
    assert adopted.address == started.address
    assert (await aget(adopted.address, "/state"))["counter"] == 2
    assert await again.adopt(actor, Slot(0), started.handle, started.address) is None
    assert await again.sweep(keep=[]) == [f"sandbox {started.handle} (running)"]
    assert not await again.is_alive(started.handle)


async def test_connection_open_at_checkpoint_does_not_wedge_the_restored_agent(
    runtime: Any, tmp_path: Path
) -> None:
    """An asyncio agent restored with a keep-alive connection in its image spins forever.

    The runtime resets host connections into the sandbox before checkpointing; without that,
    the second readyz below never answers (found with a router keep-alive pool).
    """
    import http.client
    import sys

    template = counter_template(tmp_path / "snaps", marker=False)
    template = type(template)(
        **{**template.__dict__, "command": (sys.executable, "-m", "sandbox_agent", "--port", "80")}
    )
    actor = ActorSpec("default", "keepalive", template)
    started = await runtime.start(actor, Slot(0), None, timeout_s=30)
    conn = http.client.HTTPConnection(started.address.split(":")[0], 80, timeout=5)
    await asyncio.to_thread(conn.request, "GET", "/readyz")
    response = await asyncio.to_thread(conn.getresponse)
    assert response.status == 200
    response.read()  # the connection stays open (keep-alive)
    snap = await runtime.checkpoint(actor, started.handle, SnapshotKind.LOCAL, tmp_path / "ka")
    conn.close()
    again = await runtime.start(actor, Slot(0), snap.snapshot, timeout_s=20)
    assert (await aget(again.address, "/readyz"))["actor_id"] == "keepalive"


async def test_directory_rootfs_runs_and_snapshots(runtime: Any, tmp_path: Path) -> None:
    """A rootfs folder holding nothing but a static busybox serves readyz and survives pause."""
    import shutil

    from gym_substrate.local.runtimes.base import Rootfs

    rootfs = tmp_path / "rootfs"
    (rootfs / "bin").mkdir(parents=True)
    (rootfs / "www").mkdir()
    (rootfs / "www" / "readyz").write_text("ok\n")
    shutil.copy("/bin/busybox", rootfs / "bin" / "busybox")
    template = counter_template(tmp_path / "snaps", marker=False)
    template = type(template)(
        **{
            **template.__dict__,
            "command": ("/bin/busybox", "httpd", "-f", "-p", "80", "-h", "/www"),
            "rootfs": Rootfs("directory", rootfs),
        }
    )
    actor = ActorSpec("default", "busybox", template)
    started = await runtime.start(actor, Slot(0), None, timeout_s=30)
    snap = await runtime.checkpoint(actor, started.handle, SnapshotKind.LOCAL, tmp_path / "bb")
    again = await runtime.start(actor, Slot(1), snap.snapshot, timeout_s=30)
    body = await asyncio.to_thread(_fetch, f"http://{again.address}/readyz")
    assert body == b"ok\n"


def _fetch(url: str) -> bytes:
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as resp:  # noqa: S310
        data: bytes = resp.read()
    return data


async def test_concurrent_actors_swap_slots_and_a_busy_slot_is_refused(
    runtime: Any, tmp_path: Path
) -> None:
    template = counter_template(tmp_path / "snaps")
    golden = await _golden(runtime, template, tmp_path / "snaps" / "golden")
    actors = [ActorSpec("default", f"par-{i}", template) for i in range(2)]
    started = await asyncio.gather(
        *(runtime.start(a, Slot(i), golden, timeout_s=30) for i, a in enumerate(actors))
    )
    with pytest.raises(RuntimeFailure, match="still runs sandbox"):
        await runtime.start(ActorSpec("default", "intruder", template), Slot(0), None, timeout_s=5)
    for i, s in enumerate(started):
        await aget(s.address, f"/write?text=mine-{i}")
    snaps = await asyncio.gather(
        *(
            runtime.checkpoint(a, s.handle, SnapshotKind.LOCAL, tmp_path / "par" / a.actor_id)
            for a, s in zip(actors, started, strict=True)
        )
    )
    # Each actor comes back on the other one's slot, at the other one's address.
    swapped = await asyncio.gather(
        *(
            runtime.start(a, Slot(1 - i), snap.snapshot, timeout_s=30)
            for i, (a, snap) in enumerate(zip(actors, snaps, strict=True))
        )
    )
    for i, s in enumerate(swapped):
        assert s.address == started[1 - i].address
        state = await aget(s.address, "/state")
        assert state["actor_id"] == f"par-{i}"
        assert state["marker"] == f"mine-{i}"


async def test_upload_makes_a_paused_checkpoint_durable(runtime: Any, tmp_path: Path) -> None:
    """SuspendActor of a PAUSED actor uploads its node-local checkpoint (atelet
    UploadPausedCheckpoint, kagent:controlapi/workflow_suspend.go@2559ec02): the same image,
    moved into durable storage, restores memory and files."""
    template = counter_template(tmp_path / "snaps", marker=False)
    actor = ActorSpec("default", "up", template)
    started = await runtime.start(actor, Slot(0), None, timeout_s=30)
    await aget(started.address, "/write?text=before-pause")
    before = await aget(started.address, "/state")
    local = await runtime.checkpoint(
        actor, started.handle, SnapshotKind.LOCAL, tmp_path / "local" / "p1"
    )
    dest = tmp_path / "snaps" / "up" / "s1"
    uploaded = await runtime.upload(actor, local.snapshot, "", dest)
    assert uploaded.snapshot == SnapshotRef(SnapshotKind.EXTERNAL, dest)
    assert uploaded.memory_kept
    assert (dest / "checkpoint.img").is_file()
    back = await runtime.start(actor, Slot(1), uploaded.snapshot, timeout_s=30)
    after = await aget(back.address, "/state")
    assert (after["boot_nonce"], after["counter"]) == (before["boot_nonce"], before["counter"] + 1)
    assert after["marker"] == "before-pause"


async def test_without_a_wakeup_probe_a_start_returns_once_the_sandbox_runs(
    runtime: Any, tmp_path: Path
) -> None:
    """With no wakeup probe the start returns once the sandbox runs (runtimes/base.py; the
    probe is optional, ateapi.proto@2179589f ContainerWakeupProbe), the agent answering soon
    after."""
    template = counter_template(tmp_path / "snaps", marker=False, probe=False)
    started = await runtime.start(ActorSpec("default", "np", template), Slot(0), None, timeout_s=30)
    assert await runtime.is_alive(started.handle)
    for _ in range(500):
        try:
            state = await aget(started.address, "/state")
            break
        except OSError:
            await asyncio.sleep(0.02)
    else:
        pytest.fail("the agent never answered")
    assert state["actor_id"] == "np"
