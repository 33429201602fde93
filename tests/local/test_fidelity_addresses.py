"""Actor addresses are bare worker IPs with the agent on port 80, as on a real cluster.

Real: the router reads ``Actor.ateom_pod_ip``, refuses anything that is not an IP, and dials
``<ip>:80`` (cmd/atenet/internal/router/extproc.go); that IP is the worker pod's, which every
worker in the store carries from the moment it is synced (cmd/ateapi/internal/controlapi/
syncer.go) and which the resume workflow copies onto the actor when it assigns the worker and
marks it RESUMING (cmd/ateapi/internal/controlapi/workflow_resume.go).
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from local_helpers import RUNTIMES, host, make_actor, ref

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.local import LocalBackend
from gym_substrate.local.runtimes.base import ActorSpec, RuntimeConfig, Slot
from gym_substrate.local.runtimes.loopback import port80_problem
from gym_substrate.local.runtimes.process import ProcessRuntime
from gym_substrate.local.templates import default_template

needs_port_80 = pytest.mark.skipif(
    port80_problem() is not None, reason=f"agents cannot listen on port 80: {port80_problem()}"
)


@pytest.fixture(params=RUNTIMES)
def runtime_name(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


def _bare_ip(value: str) -> str:
    """The value, checked to be a bare IPv4 address (what extproc.go accepts)."""
    assert str(ipaddress.IPv4Address(value)) == value, value
    return value


async def _agent_at(http: aiohttp.ClientSession, ip: str) -> str:
    """The actor id the agent answering on <ip>:80 reports, dialled as the real router does."""
    async with http.get(f"http://{ip}:80/readyz") as response:
        assert response.status == 200
        body: dict[str, Any] = await response.json()
        return str(body["actor_id"])


async def _worker_ips(stub: Any) -> dict[str, str]:
    """ListWorkers as worker pod -> IP, checking every worker has a bare one."""
    workers = (await stub.ListWorkers(pb.ListWorkersRequest())).workers
    return {w.worker_pod: _bare_ip(w.ip) for w in workers}


async def _running(stub: Any, *names: str) -> dict[str, pb.Actor]:
    out = {}
    for name in names:
        actor = (await stub.GetActor(pb.GetActorRequest(actor_ref=ref(name)))).actor
        assert actor.status == pb.Actor.STATUS_RUNNING, (name, actor.status)
        out[name] = actor
    return out


@needs_port_80
async def test_running_actors_have_unique_bare_ips_served_on_port_80(
    stub: Any, backend: LocalBackend, http: aiohttp.ClientSession
) -> None:
    """Every running actor's ateom_pod_ip is a bare IP, its own, equal to its worker's IP, and
    HTTP to <ip>:80 reaches that actor's agent; free workers list an IP too (syncer.go). A
    worker whose actor paused and whose slot another actor took still hands out distinct,
    reachable addresses, and the paused actor answers at its worker's IP once resumed."""
    before = await _worker_ips(stub)
    assert len(set(before.values())) == len(before) == 2
    for name in ("a", "b", "c"):
        await make_actor(stub, name)
    for name in ("a", "b"):
        await stub.ResumeActor(pb.ResumeActorRequest(actor_ref=ref(name)))

    async def check(*names: str) -> None:
        actors = await _running(stub, *names)
        ips = {name: _bare_ip(actor.ateom_pod_ip) for name, actor in actors.items()}
        assert len(set(ips.values())) == len(ips), ips
        workers = await _worker_ips(stub)
        for name, actor in actors.items():
            assert workers[actor.ateom_pod_name] == ips[name]
            assert await _agent_at(http, ips[name]) == name

    await check("a", "b")
    await stub.PauseActor(pb.PauseActorRequest(actor_ref=ref("a")))
    await stub.ResumeActor(pb.ResumeActorRequest(actor_ref=ref("c")))  # takes a's worker
    await check("b", "c")
    await stub.SuspendActor(pb.SuspendActorRequest(actor_ref=ref("c")))
    await stub.ResumeActor(pb.ResumeActorRequest(actor_ref=ref("a")))  # memory kept
    await check("a", "b")
    # the router still reaches them through the record
    async with http.get(f"{backend.router_url}/readyz", headers=host("a")) as response:
        assert (await response.json())["actor_id"] == "a"
    for name in ("a", "b"):
        await stub.SuspendActor(pb.SuspendActorRequest(actor_ref=ref(name)))


async def test_a_resuming_actor_already_has_its_workers_ip(
    stub: Any, backend: LocalBackend
) -> None:
    """While RESUMING (its sandbox still booting) the actor already carries the assigned
    worker's IP and pod name (workflow_resume.go sets them before the restore call)."""
    slow = dataclasses.replace(
        default_template(backend.state_dir / "snapshots" / "store"),
        name="slow",
        command=(
            "/bin/sh",
            "-c",
            'sleep 1.5; exec "$0" "$@"',
            sys.executable,
            "-m",
            "sandbox_agent",
            "--host",
            "0.0.0.0",
            "--port",
            "80",
        ),
    )
    assert backend.plane is not None
    await backend.plane.add_template(slow)
    await stub.CreateAtespace(pb.CreateAtespaceRequest(name="t"))
    await stub.CreateActor(
        pb.CreateActorRequest(
            actor_ref=ref("late"), actor_template_namespace="local", actor_template_name="slow"
        )
    )
    resume = asyncio.ensure_future(
        stub.ResumeActor(pb.ResumeActorRequest(actor_ref=ref("late"), boot=True))
    )
    seen: pb.Actor | None = None
    for _ in range(400):
        actor = (await stub.GetActor(pb.GetActorRequest(actor_ref=ref("late")))).actor
        if actor.status == pb.Actor.STATUS_RESUMING:
            seen = actor
            break
        await asyncio.sleep(0.01)
    assert seen is not None, "never saw the actor RESUMING"
    workers = await _worker_ips(stub)
    assert seen.ateom_pod_ip == workers[seen.ateom_pod_name]
    running = (await resume).actor
    assert running.ateom_pod_ip.partition(":")[0] == seen.ateom_pod_ip
    await stub.SuspendActor(pb.SuspendActorRequest(actor_ref=ref("late")))


async def test_without_port_80_the_record_keeps_ip_and_port(tmp_path: Path) -> None:
    """Where the agent may not bind port 80 (no root) the process runtime falls back to a free
    port on the worker's own loopback IP, records ``ip:port`` (which the local router dials as
    given) and says so in its start-up warning; two backends never share a worker IP."""
    runtimes = [
        ProcessRuntime(RuntimeConfig(tmp_path / name / "runtime", name, 2))
        for name in ("gsaddr1", "gsaddr2")
    ]
    first, second = runtimes
    first.port80_problem = "binding port 80 needs root or CAP_NET_BIND_SERVICE"
    assert "ateom_pod_ip reads <ip>:<port>" in (first.warning() or "")
    for runtime in runtimes:
        await runtime.open()
    try:
        ips = [r.worker_ip(Slot(i)) for r in runtimes for i in (0, 1)]
        assert len({_bare_ip(ip) for ip in ips}) == 4
        actor = ActorSpec("t", "fallback", default_template(tmp_path / "store"))
        started = await first.start(actor, Slot(1), None, timeout_s=30)
        ip, _, port = started.address.partition(":")
        assert ip == first.worker_ip(Slot(1))
        assert int(port) in range(1, 65536)
        assert int(port) != 80
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"http://{started.address}/readyz") as response,
        ):
            assert (await response.json())["actor_id"] == "fallback"
        await first.stop(started.handle)
    finally:
        for runtime in runtimes:
            await runtime.cleanup()
            assert await runtime.leftovers() == []
