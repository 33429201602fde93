"""The process runtime: bubblewrap isolation (issue 14) and the runtime contract of today.

A process-runtime actor may write only its working folder and its own /tmp, sees its own pid
namespace and no other actor's folder or the backend's state. Real: every actor is its own runsc
sandbox with its own root filesystem, /tmp included (cmd/ateom-gvisor/runsc.go runs each with a
per-actor ``-root``). The contract (runtimes/base.py): a start returns once the wakeup probe
answers, or once the process runs when the template has none; a durable snapshot (a suspend's,
and a tag's copy of it) holds the actor's files and restores them into any actor of the
template; `upload` turns a paused (stopped) agent into a durable snapshot; a durable snapshot
that is gone fails the start instead of starting empty.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from local_helpers import agent_url, make_actor, ref, run_in

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.local import LocalBackend
from gym_substrate.local.runtimes.base import (
    ActorSpec,
    Rootfs,
    RuntimeConfig,
    RuntimeFailure,
    Slot,
    SnapshotKind,
    SnapshotRef,
    TemplateSpec,
)
from gym_substrate.local.runtimes.process import ProcessRuntime, bwrap_problem

pytestmark = pytest.mark.skipif(
    bwrap_problem() is not None, reason=f"bubblewrap cannot run here: {bwrap_problem()}"
)

AGENT = (sys.executable, "-m", "sandbox_agent", "--host", "0.0.0.0", "--port", "80")


async def _resume(stub: Any, *names: str) -> None:
    for name in names:
        await stub.ResumeActor(pb.ResumeActorRequest(actor=ref(name)))


async def test_actor_writes_only_its_folder_and_tmp(
    stub: Any, backend: LocalBackend, http: aiohttp.ClientSession
) -> None:
    await make_actor(stub, "jail")
    await make_actor(stub, "other")
    await _resume(stub, "jail", "other")
    outside = await run_in(http, backend, "jail", "touch /etc/x; echo rc=$?")
    assert "rc=1" in outside["stdout"], outside
    for place in ("./mine", "/tmp/mine", "$HOME/again"):
        inside = await run_in(http, backend, "jail", f"touch {place} && echo ok")
        assert inside["stdout"] == "ok\n", (place, inside)
    # another actor's working folder is hidden, not merely read-only
    other = await run_in(http, backend, "other", "pwd")
    folder = other["stdout"].strip()
    peek = await run_in(http, backend, "jail", f"ls {folder} 2>&1; echo rc=$?")
    assert "rc=0" not in peek["stdout"], peek
    # nor are the backend's state folder and the host's secrets
    hidden = await run_in(
        http,
        backend,
        "jail",
        f"ls {backend.state_dir}/state.db; cat /etc/shadow 2>/dev/null | wc -c",
    )
    assert hidden["stdout"].splitlines()[-1:] == ["0"], hidden["stderr"]
    assert "state.db" not in hidden["stdout"], hidden
    for name in ("jail", "other"):
        await stub.SuspendActor(pb.SuspendActorRequest(actor=ref(name)))


async def test_actor_has_its_own_pid_namespace_and_few_capabilities(
    stub: Any, backend: LocalBackend, http: aiohttp.ClientSession
) -> None:
    await make_actor(stub, "ns")
    await _resume(stub, "ns")
    result = await run_in(
        http,
        backend,
        "ns",
        "readlink /proc/self/ns/pid; ls /proc | grep -c '^[0-9]'; hostname; "
        "grep CapEff /proc/self/status",
    )
    pid_ns, processes, hostname, caps = result["stdout"].splitlines()
    assert pid_ns != os.readlink("/proc/self/ns/pid")
    assert int(processes) < 20  # bwrap's init, the agent, this shell and its children
    assert hostname == "ns"
    # CAP_KILL, CAP_SETGID and CAP_SETUID (to run and signal jobs as another user), and
    # CAP_NET_BIND_SERVICE when the agent listens on port 80 (as root)
    wanted = (1 << 5) | (1 << 6) | (1 << 7)
    if os.geteuid() == 0:
        wanted |= 1 << 10
    assert int(caps.split()[1], 16) == wanted
    await stub.SuspendActor(pb.SuspendActorRequest(actor=ref("ns")))


async def test_each_actor_has_a_private_tmp(
    stub: Any, backend: LocalBackend, http: aiohttp.ClientSession
) -> None:
    """A file in one actor's /tmp is invisible to another actor and to the host's /tmp, lives
    through pause and suspend like the working folder, and goes with DeleteActor; uid, hostname
    and pid 1 stay as before. Real: each actor's /tmp is in its own sandbox's root filesystem
    (cmd/ateom-gvisor/runsc.go)."""
    name = f"gs-private-{secrets.token_hex(4)}"
    await make_actor(stub, "one")
    await make_actor(stub, "two")
    await _resume(stub, "one", "two")
    wrote = await run_in(http, backend, "one", f"echo mine > /tmp/{name} && cat /tmp/{name}")
    assert wrote["stdout"] == "mine\n", wrote
    assert not await asyncio.to_thread(Path("/tmp", name).exists)
    peek = await run_in(http, backend, "two", f"cat /tmp/{name} 2>&1; echo rc=$?")
    assert "rc=1" in peek["stdout"], peek
    host_file = Path("/tmp", f"{name}-host")
    await asyncio.to_thread(host_file.write_text, "host")
    try:
        hidden = await run_in(http, backend, "two", f"cat {host_file} 2>&1; echo rc=$?")
        assert "rc=1" in hidden["stdout"], hidden
    finally:
        await asyncio.to_thread(host_file.unlink)
    who = await run_in(http, backend, "one", "id -u; hostname; cat /proc/1/comm")
    assert who["stdout"].splitlines() == [str(os.getuid()), "one", "bwrap"], who
    for step in ("PauseActor", "SuspendActor"):
        request = getattr(pb, f"{step}Request")(actor=ref("one"))
        await getattr(stub, step)(request)
        await _resume(stub, "one")
        again = await run_in(http, backend, "one", f"cat /tmp/{name}")
        assert again["stdout"] == "mine\n", (step, again)
    assert isinstance(backend.runtime, ProcessRuntime)
    folder = backend.runtime.actors / "t" / "one"
    assert await asyncio.to_thread((folder / "tmp" / name).read_text) == "mine\n"
    await stub.SuspendActor(pb.SuspendActorRequest(actor=ref("one")))
    await stub.DeleteActor(pb.DeleteActorRequest(actor=ref("one")))
    assert not await asyncio.to_thread(folder.exists)
    await stub.SuspendActor(pb.SuspendActorRequest(actor=ref("two")))


async def test_start_up_says_what_isolates(backend: LocalBackend) -> None:
    assert isinstance(backend.runtime, ProcessRuntime)
    warning = backend.runtime.warning() or ""
    assert "bubblewrap" in warning
    assert "read-only host filesystem" in warning
    assert "a private /tmp" in warning
    if backend.runtime.nets is None:  # not root: the host's network, and it says so
        assert "share this machine's network" in warning
    else:
        assert "each has a network namespace of its own" in warning


def test_without_bwrap_the_warning_is_loud(tmp_path: Any) -> None:
    runtime = ProcessRuntime(RuntimeConfig(tmp_path, "gx1", 1))
    runtime.bwrap_problem = "bwrap is not installed (apt-get install bubblewrap)"
    warning = runtime.warning() or ""
    assert warning.startswith("NO ISOLATION")
    assert "full rights" in warning


# ---------------------------------------------------------------------------- the contract


@pytest.fixture
async def runtime(tmp_path: Path) -> AsyncIterator[ProcessRuntime]:
    rt = ProcessRuntime(RuntimeConfig(tmp_path / "runtime", "gp" + secrets.token_hex(3), 2))
    await rt.open()
    try:
        yield rt
    finally:
        await rt.cleanup()
        assert await rt.leftovers() == []


def _template(tmp_path: Path, command: tuple[str, ...] = AGENT, probe: bool = True) -> TemplateSpec:
    return TemplateSpec(
        "local",
        "sandbox",
        command,
        (),
        "/readyz" if probe else None,
        80,
        tmp_path / "store",
        Rootfs("host"),
    )


async def _exec(address: str, command: str) -> str:
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"http://{address}/v1/exec?wait=8", json={"command": command}) as response,
    ):
        assert response.status == 200, await response.text()
        body: dict[str, Any] = await response.json()
        return str(body["stdout"])


async def test_a_durable_snapshot_holds_the_files_and_restores_into_another_actor(
    runtime: ProcessRuntime, tmp_path: Path
) -> None:
    """An EXTERNAL checkpoint ends the agent and keeps its working folder and /tmp (not its
    memory: `memory_kept` False); started from it, the same actor or (as a tag's copy) another
    one finds those files, and nothing of the snapshot is consumed."""
    template = _template(tmp_path)
    first = ActorSpec("t", "src", template)
    started = await runtime.start(first, Slot(0), None, timeout_s=30)
    await _exec(started.address, "echo work > ./kept; echo tmp > /tmp/kept")
    dest = tmp_path / "store" / "snap"
    result = await runtime.checkpoint(first, started.handle, SnapshotKind.EXTERNAL, dest)
    assert not result.memory_kept
    assert result.retained_handle is None
    assert not await runtime.is_alive(started.handle)
    assert sorted(p.name for p in dest.iterdir()) == ["manifest.json", "tmp", "work"]
    fork = ActorSpec("t", "fork", template)
    again = await runtime.start(fork, Slot(1), SnapshotRef(SnapshotKind.TAG, dest), timeout_s=30)
    assert await _exec(again.address, "cat ./kept /tmp/kept") == "work\ntmp\n"
    await runtime.stop(again.handle)
    back = await runtime.start(
        first, Slot(0), SnapshotRef(SnapshotKind.EXTERNAL, dest), timeout_s=30
    )
    assert await _exec(back.address, "cat ./kept /tmp/kept") == "work\ntmp\n"
    await runtime.stop(back.handle)
    assert (dest / "work" / "kept").is_file()


async def test_upload_makes_a_paused_agent_durable(runtime: ProcessRuntime, tmp_path: Path) -> None:
    """A LOCAL checkpoint leaves the agent stopped (its memory kept, `retained_handle`); an
    upload of it (SuspendActor of a PAUSED actor) stops it for good and writes its files as a
    durable snapshot, which a start restores."""
    template = _template(tmp_path)
    actor = ActorSpec("t", "p", template)
    started = await runtime.start(actor, Slot(0), None, timeout_s=30)
    await _exec(started.address, "echo paused > ./kept")
    local = await runtime.checkpoint(
        actor, started.handle, SnapshotKind.LOCAL, tmp_path / "local" / "p1"
    )
    assert local.memory_kept
    assert local.retained_handle == started.handle
    dest = tmp_path / "store" / "up"
    uploaded = await runtime.upload(actor, local.snapshot, started.handle, dest)
    assert uploaded.snapshot == SnapshotRef(SnapshotKind.EXTERNAL, dest)
    assert not uploaded.memory_kept
    assert not await runtime.is_alive(started.handle)
    back = await runtime.start(actor, Slot(1), uploaded.snapshot, timeout_s=30)
    assert await _exec(back.address, "cat ./kept") == "paused\n"
    await runtime.stop(back.handle)


async def test_without_a_wakeup_probe_a_start_returns_once_the_process_runs(
    runtime: ProcessRuntime, tmp_path: Path
) -> None:
    """runtimes/base.py: with no wakeup probe a start returns once the process runs, as
    ResumeActor returns once the container started upstream (proto ContainerWakeupProbe is
    optional, ateapi.proto@2179589f); one that exits later is seen gone by is_alive."""
    started = await runtime.start(
        ActorSpec("t", "noprobe", _template(tmp_path, probe=False)), Slot(0), None, timeout_s=30
    )
    assert await runtime.is_alive(started.handle)
    url = f"http://{started.address}/readyz"

    async def ready() -> bool:
        try:
            async with aiohttp.ClientSession() as http, http.get(url) as response:
                return response.status == 200
        except aiohttp.ClientError:
            return False

    for _ in range(500):
        if await ready():
            break
        await asyncio.sleep(0.02)
    else:
        pytest.fail("the agent never answered")
    await runtime.stop(started.handle)
    # a command that exits has run: the start returns, and is_alive (the watchdog's question)
    # then says it is gone
    exits = _template(tmp_path, command=("/bin/sh", "-c", "sleep 0.2; exit 3"), probe=False)
    gone = await runtime.start(ActorSpec("t", "exits", exits), Slot(1), None, timeout_s=30)
    for _ in range(500):
        if not await runtime.is_alive(gone.handle):
            break
        await asyncio.sleep(0.02)
    else:
        pytest.fail("the exited command still counts as alive")
    await runtime.stop(gone.handle)


async def test_a_durable_snapshot_that_is_gone_fails_the_start(
    runtime: ProcessRuntime, tmp_path: Path
) -> None:
    """A restore from a snapshot folder that was removed (a deleted tag's copy an actor still
    borrows) fails, as gVisor's does, so the actor crashes instead of starting with no files as
    if nothing was lost (upstream: atelet Restore fails, crash.go@2559ec02 in kagent)."""
    gone = SnapshotRef(SnapshotKind.TAG, tmp_path / "store" / "deleted")
    with pytest.raises(RuntimeFailure, match="has no manifest.json"):
        await runtime.start(
            ActorSpec("t", "stranded", _template(tmp_path)), Slot(0), gone, timeout_s=30
        )


async def test_the_agent_answers_where_the_record_says(
    stub: Any, backend: LocalBackend, http: aiohttp.ClientSession
) -> None:
    """The actor's agent is at the address its record holds (what the router dials)."""
    await make_actor(stub, "here")
    await _resume(stub, "here")
    async with http.get(f"{agent_url(backend, 'here')}/readyz") as response:
        assert (await response.json())["actor_id"] == "here"
    await stub.SuspendActor(pb.SuspendActorRequest(actor=ref("here")))
