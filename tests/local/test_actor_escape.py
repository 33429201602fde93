"""An actor cannot reach the control plane (issue 24, defect 3).

Seen under the process runtime: from inside an actor, the admin listener and the plaintext API
answered; the actor registered a template on the host's `/`, created an actor of it and read a
host file, and ran `cat` in another actor through the router. Now the admin listener's `/_local/*`
calls need the operator's token (`<state>/admin.token`, 0600, in the folder no actor sees), a
template on the host's `/` needs `local up --allow-host-rootfs` (test_control_unit.py), and,
where the backend runs as root, each process-runtime actor has a network namespace of its own
(the gVisor runtime's veth + nftables, `runtimes/gvisor/net.py`): the API, the router, the
admin listener and the other actors are out of its reach, while the router still reaches it.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import json
import shlex
import stat
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from ci_policy import ON_CI
from local_helpers import make_actor, ref, run_in, target

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.local import LocalBackend
from gym_substrate.local.runtimes.base import RuntimeConfig
from gym_substrate.local.runtimes.process import ProcessRuntime
from gym_substrate.local.statedir import ADMIN_TOKEN_FILE


async def test_the_admin_calls_answer_only_the_operators_token(
    backend: LocalBackend, http: aiohttp.ClientSession
) -> None:
    token_file = backend.state_dir / ADMIN_TOKEN_FILE
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert token_file.read_text().strip() == backend.admin_token
    registration = {"name": "escape", "directory": "/"}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": backend.admin_token}):
        async with http.get(f"{backend.admin_url}/_local/status", headers=headers) as response:
            assert response.status == 401, headers
            error = (await response.json())["error"]
            assert error["code"] == "unauthorized"
            assert str(token_file) in error["message"]
        async with http.post(
            f"{backend.admin_url}/_local/images", json=registration, headers=headers
        ) as response:
            assert response.status == 401, headers
    assert all(i.repository != "local/escape" for i in backend.images)

    operator = {"Authorization": f"Bearer {backend.admin_token}"}
    async with http.get(f"{backend.admin_url}/_local/status", headers=operator) as response:
        assert response.status == 200
        assert (await response.json())["state_dir"] == str(backend.state_dir)
    for open_path in ("/readyz", "/metrics"):  # probes and Prometheus need no token
        async with http.get(f"{backend.admin_url}{open_path}") as response:
            assert response.status == 200, open_path


# ---------------------------------------------------------------------- the network escape
_PROBE = """
import json, socket, sys
out = {}
for name, (host, port) in json.loads(sys.argv[1]).items():
    sock = socket.socket()
    sock.settimeout(1.5)
    try:
        sock.connect((host, port))
        out[name] = "connected"
    except OSError as exc:
        out[name] = f"{type(exc).__name__}: {exc}"
    finally:
        sock.close()
print(json.dumps(out))
"""


def _probe_command(targets: dict[str, tuple[str, int]]) -> str:
    """A shell command that tries a TCP connection to each target from inside the actor."""
    script = base64.b64encode(_PROBE.encode()).decode()
    code = f"import base64; exec(base64.b64decode('{script}'))"
    return (
        f"{shlex.quote(sys.executable)} -c {shlex.quote(code)} {shlex.quote(json.dumps(targets))}"
    )


def _ip_port(address: str) -> tuple[str, int]:
    ip, _, port = address.partition(":")
    return ip, int(port or 80)


async def test_an_actor_reaches_neither_the_control_plane_nor_another_actor(
    backend: LocalBackend, stub: Any, http: aiohttp.ClientSession
) -> None:
    """Issue 24's walk, from inside a process-runtime actor: connect to the API, the admin
    listener and the router on loopback, to another actor's agent, and to the API's port on the
    host end of its own link. Every attempt fails; the router still reaches both actors."""
    runtime = backend.runtime
    assert isinstance(runtime, ProcessRuntime)
    if runtime.nets is None:
        if ON_CI:
            pytest.fail(
                f"CI runs as root: actors must get network namespaces ({runtime.netns_problem})"
            )
        pytest.skip(f"no network namespace per actor here: {runtime.netns_problem}")
    assert "network namespace of its own" in (runtime.warning() or "")
    for name in ("victim", "attacker"):
        await make_actor(stub, name)
        await stub.ResumeActor(pb.ResumeActorRequest(actor=ref(name)))
    plane = backend.plane
    assert plane is not None
    victim, attacker = (plane.lookup("t", n) for n in ("victim", "attacker"))
    assert victim is not None
    assert attacker is not None
    own_ip, _ = _ip_port(attacker.address)
    host_end = str(ipaddress.IPv4Address(own_ip) - 1)  # the host's side of the actor's /30
    targets = {
        "api": ("127.0.0.1", backend.api_port),
        "admin": ("127.0.0.1", backend.admin_port),
        "router": ("127.0.0.1", backend.router_port),
        "other actor's agent": _ip_port(victim.address),
        "api via the host end": (host_end, backend.api_port),
        "router via the host end": (host_end, backend.router_port),
    }
    job = await run_in(http, backend, "attacker", _probe_command(targets))
    assert job["exit_code"] == 0, job
    results = json.loads(job["stdout"])
    assert set(results) == set(targets)
    reached = {name: how for name, how in results.items() if how == "connected"}
    assert reached == {}, results

    # the same probe from the host reaches the control plane: it tells a reachable port apart
    on_host = {k: targets[k] for k in ("api", "admin", "router", "other actor's agent")}
    shell = await asyncio.create_subprocess_shell(
        _probe_command(on_host), stdout=asyncio.subprocess.PIPE
    )
    out, _ = await shell.communicate()
    assert json.loads(out) == dict.fromkeys(on_host, "connected")
    # and the router still reaches the actor
    async with http.post(
        f"{backend.router_url}/v1/exec?wait=8",
        json={"command": "echo routed"},
        headers=target("attacker"),
    ) as response:
        assert response.status == 200
        assert (await response.json())["stdout"] == "routed\n"
    for name in ("victim", "attacker"):
        await stub.SuspendActor(pb.SuspendActorRequest(actor=ref(name)))


def test_without_a_namespace_the_warning_says_actors_share_the_network(tmp_path: Path) -> None:
    """Not root (or asked for the host's network): today's behaviour, said at `up`."""
    runtime = ProcessRuntime(RuntimeConfig(tmp_path, "gx2", 1, extra={"process.network": "host"}))
    assert runtime.nets is None
    warning = runtime.warning() or ""
    assert "share this machine's network" in warning
    assert "can reach the API, the router, the admin listener" in warning
    assert "run as root for a network namespace per actor" in warning
