"""The default template's agent under gVisor runs unpacked, from a read-only folder (issue 22
item 3): nothing of it is unpacked into the sandbox's in-memory /tmp, so a checkpoint does not
carry a copy of the agent.

Real: Substrate's clusters bake the agent into a derived image (kagent's actor images), where
its files are read from the image's layers, not from the sandbox's memory; this is the local
backend's equivalent (an image volume bound read-only).
"""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from local_helpers import create_actor, object_ref, target

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.local import LocalBackend, rootfs
from gym_substrate.local.templates import AGENT_MOUNT

pytestmark = [pytest.mark.runsc, pytest.mark.rootfs]


@pytest.fixture
def runtime_name() -> str:
    return "gvisor"


@pytest.fixture
def backend_options(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    monkeypatch.delenv(rootfs.AGENT_FORM_ENV, raising=False)  # the runtime's default form
    rootfs.ensure_rootfs()
    return {"workers": 1, "default_rootfs": "debian"}


async def _exec(http: aiohttp.ClientSession, backend: LocalBackend, command: str) -> Any:
    async with http.post(
        f"{backend.router_url}/v1/exec?wait=8", json={"command": command}, headers=target("unp")
    ) as response:
        assert response.status == 200, await response.text()
        result = await response.json()
    assert result["state"] == "exited", result
    return result


@pytest.mark.timeout(600)
async def test_the_agent_runs_from_a_read_only_folder_and_leaves_tmp_empty(
    stub: Any, backend: LocalBackend, http: aiohttp.ClientSession
) -> None:
    """The agent answers from the bound folder (its executable is there, beside _internal),
    the folder is mounted read-only and cannot be written, and /tmp holds nothing of it
    (the static build leaves about 42 MB of unpacked layers there)."""
    await create_actor(stub, "unp")
    await stub.ResumeActor(pb.ResumeActorRequest(actor=object_ref("unp")))

    exe = await _exec(http, backend, "tr '\\0' ' ' </proc/1/cmdline; echo; ls /opt/sandbox-agent")
    lines = exe["stdout"].split()
    assert lines[0] == f"{AGENT_MOUNT}/sandbox-agent", exe
    assert "_internal" in lines[1:], exe

    mounts = await _exec(http, backend, "cat /proc/mounts")
    options = [
        line.split()[3].split(",")
        for line in mounts["stdout"].splitlines()
        if line.split()[1] == AGENT_MOUNT
    ]
    assert options, mounts["stdout"]
    assert "ro" in options[-1], options
    write = await _exec(http, backend, f"touch {AGENT_MOUNT}/_internal/x")
    assert write["exit_code"] != 0, write
    assert "Read-only" in write["stderr"], write

    tmp = await _exec(http, backend, "du -sk /tmp | cut -f1; ls -A /tmp")
    used_kib, *entries = tmp["stdout"].split()
    assert int(used_kib) < 1024, tmp
    assert not [e for e in entries if e.startswith(("_MEI", "staticx", "sandbox-agent"))], tmp

    # and it survives a checkpoint: suspend, resume, answer
    await stub.SuspendActor(pb.SuspendActorRequest(actor=object_ref("unp")))
    await stub.ResumeActor(pb.ResumeActorRequest(actor=object_ref("unp")))
    again = await _exec(http, backend, "echo back")
    assert again["stdout"] == "back\n"
    await stub.SuspendActor(pb.SuspendActorRequest(actor=object_ref("unp")))
    await stub.DeleteActor(pb.DeleteActorRequest(actor=object_ref("unp")))
