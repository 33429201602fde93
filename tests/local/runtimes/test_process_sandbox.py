"""The process runtime under bubblewrap (issue 14, "The process runtime is not a sandbox").

A process-runtime actor may write only its working folder and its own /tmp, sees its own pid
namespace and no other actor's folder or the backend's state, and still answers through the
router. Real: every actor is its own runsc sandbox with its own root filesystem, /tmp included
(cmd/ateom-gvisor/runsc.go runs each with a per-actor ``-root``).
"""

from __future__ import annotations

import asyncio
import os
import secrets
from pathlib import Path
from typing import Any

import pytest
from local_helpers import host, make_actor, ref

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.local import LocalBackend
from gym_substrate.local.runtimes.process import ProcessRuntime, bwrap_problem

pytestmark = pytest.mark.skipif(
    bwrap_problem() is not None, reason=f"bubblewrap cannot run here: {bwrap_problem()}"
)


async def _run(http: Any, backend: LocalBackend, actor: str, command: str) -> dict[str, Any]:
    async with http.post(
        f"{backend.router_url}/v1/exec?wait=8", json={"command": command}, headers=host(actor)
    ) as response:
        assert response.status == 200, await response.text()
        result: dict[str, Any] = await response.json()
        return result


async def test_actor_writes_only_its_folder_and_tmp(
    stub: Any, backend: LocalBackend, http: Any
) -> None:
    await make_actor(stub, "jail")
    await make_actor(stub, "other")
    outside = await _run(http, backend, "jail", "touch /etc/x; echo rc=$?")
    assert "rc=1" in outside["stdout"], outside
    for place in ("./mine", "/tmp/mine", "$HOME/again"):
        inside = await _run(http, backend, "jail", f"touch {place} && echo ok")
        assert inside["stdout"] == "ok\n", (place, inside)
    # another actor's working folder is hidden, not merely read-only
    other = await _run(http, backend, "other", "pwd")
    folder = other["stdout"].strip()
    peek = await _run(http, backend, "jail", f"ls {folder} 2>&1; echo rc=$?")
    assert "rc=0" not in peek["stdout"], peek
    # nor are the backend's state folder and the host's secrets
    secrets = await _run(
        http,
        backend,
        "jail",
        f"ls {backend.state_dir}/state.db; cat /etc/shadow 2>/dev/null | wc -c",
    )
    assert secrets["stdout"].splitlines()[-1:] == ["0"], secrets["stderr"]
    assert "state.db" not in secrets["stdout"], secrets
    for name in ("jail", "other"):
        await stub.SuspendActor(pb.SuspendActorRequest(actor_ref=ref(name)))


async def test_actor_has_its_own_pid_namespace_and_few_capabilities(
    stub: Any, backend: LocalBackend, http: Any
) -> None:
    await make_actor(stub, "ns")
    result = await _run(
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
    await stub.SuspendActor(pb.SuspendActorRequest(actor_ref=ref("ns")))


async def test_each_actor_has_a_private_tmp(stub: Any, backend: LocalBackend, http: Any) -> None:
    """A file in one actor's /tmp is invisible to another actor and to the host's /tmp, lives
    through pause and suspend like the working folder, and goes with DeleteActor; uid, hostname
    and pid 1 stay as before. Real: each actor's /tmp is in its own sandbox's root filesystem
    (cmd/ateom-gvisor/runsc.go)."""
    name = f"gs-private-{secrets.token_hex(4)}"
    await make_actor(stub, "one")
    await make_actor(stub, "two")
    wrote = await _run(http, backend, "one", f"echo mine > /tmp/{name} && cat /tmp/{name}")
    assert wrote["stdout"] == "mine\n", wrote
    assert not await asyncio.to_thread(Path("/tmp", name).exists)
    peek = await _run(http, backend, "two", f"cat /tmp/{name} 2>&1; echo rc=$?")
    assert "rc=1" in peek["stdout"], peek
    host_file = Path("/tmp", f"{name}-host")
    await asyncio.to_thread(host_file.write_text, "host")
    try:
        hidden = await _run(http, backend, "two", f"cat {host_file} 2>&1; echo rc=$?")
        assert "rc=1" in hidden["stdout"], hidden
    finally:
        await asyncio.to_thread(host_file.unlink)
    who = await _run(http, backend, "one", "id -u; hostname; cat /proc/1/comm")
    assert who["stdout"].splitlines() == [str(os.getuid()), "one", "bwrap"], who
    for step in ("PauseActor", "SuspendActor"):
        request = getattr(pb, f"{step}Request")(actor_ref=ref("one"))
        await getattr(stub, step)(request)
        again = await _run(http, backend, "one", f"cat /tmp/{name}")  # the router resumes it
        assert again["stdout"] == "mine\n", (step, again)
    assert isinstance(backend.runtime, ProcessRuntime)
    folder = backend.runtime.actors / "t" / "one"
    assert await asyncio.to_thread((folder / "tmp" / name).read_text) == "mine\n"
    await stub.SuspendActor(pb.SuspendActorRequest(actor_ref=ref("one")))
    await stub.DeleteActor(pb.DeleteActorRequest(actor_ref=ref("one")))
    assert not await asyncio.to_thread(folder.exists)
    await stub.SuspendActor(pb.SuspendActorRequest(actor_ref=ref("two")))


async def test_start_up_says_what_isolates(backend: LocalBackend) -> None:
    assert isinstance(backend.runtime, ProcessRuntime)
    warning = backend.runtime.warning() or ""
    assert "bubblewrap" in warning
    assert "read-only host filesystem" in warning
    assert "a private /tmp" in warning
    assert "share this machine's network" in warning


def test_without_bwrap_the_warning_is_loud(tmp_path: Any) -> None:
    from gym_substrate.local.runtimes.base import RuntimeConfig

    runtime = ProcessRuntime(RuntimeConfig(tmp_path, "gx1", 1))
    runtime.bwrap_problem = "bwrap is not installed (apt-get install bubblewrap)"
    warning = runtime.warning() or ""
    assert warning.startswith("NO ISOLATION")
    assert "full rights" in warning
