"""Actor addresses are bare worker IPs with the agent on port 80, as on a real cluster.

Real: a Worker carries its pod's IPs (`Worker.ips`, set when the syncer creates it), and the
resume workflow copies them onto the actor's `status.worker_assignment.worker_pod_ips` when it
binds the worker and marks the actor RESUMING (`workerAssignmentFrom`, kagent:controlapi/
workflow_resume.go@2559ec02; ateapi.proto@2179589f WorkerAssignment); traffic reaches the actor
on port 80 of that IP (cmd/atenet/internal/router/ingress/ingress.go@18d1c266). With one
actor per worker (the test backends' default), the worker's IP is the actor's own.
"""

from __future__ import annotations

import asyncio
import ipaddress
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from local_helpers import (
    RUNTIMES,
    get_actor,
    late_workload,
    make_actor,
    ref,
    state,
    wait_state,
    workload_actor,
)

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.local import LocalBackend
from gym_substrate.local.runtimes.base import ActorSpec, Rootfs, RuntimeConfig, Slot, TemplateSpec
from gym_substrate.local.runtimes.loopback import port80_problem
from gym_substrate.local.runtimes.process import ProcessRuntime

needs_port_80 = pytest.mark.skipif(
    port80_problem() is not None, reason=f"agents cannot listen on port 80: {port80_problem()}"
)


@pytest.fixture(params=RUNTIMES)
def runtime_name(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


def _bare_ip(value: str) -> str:
    """The value, checked to be a bare IPv4 address."""
    assert str(ipaddress.IPv4Address(value)) == value, value
    return value


async def _agent_at(http: aiohttp.ClientSession, ip: str) -> str:
    """The actor id the agent answering on <ip>:80 reports."""
    async with http.get(f"http://{ip}:80/readyz") as response:
        assert response.status == 200
        body: dict[str, Any] = await response.json()
        return str(body["actor_id"])


async def _worker_ips(stub: Any) -> dict[str, str]:
    """ListWorkers as worker name -> IP, checking every worker has one bare IP."""
    workers = (await stub.ListWorkers(pb.ListWorkersRequest())).workers
    out = {}
    for worker in workers:
        (ip,) = worker.ips
        out[worker.metadata.name] = _bare_ip(ip)
    return out


@needs_port_80
async def test_running_actors_have_unique_bare_ips_served_on_port_80(
    stub: Any, backend: LocalBackend, http: aiohttp.ClientSession
) -> None:
    """Every running actor's worker_pod_ips is one bare IP, its own, equal to its worker's IP,
    and HTTP to <ip>:80 reaches that actor's agent; free workers list an IP too. A worker whose
    actor paused and whose slot another actor took still hands out distinct, reachable
    addresses, and the paused actor answers at its worker's IP once resumed."""
    before = await _worker_ips(stub)
    assert len(set(before.values())) == len(before) == 2
    for name in ("a", "b", "c"):
        await make_actor(stub, name)
    for name in ("a", "b"):
        await stub.ResumeActor(pb.ResumeActorRequest(actor=ref(name)))

    async def check(*names: str) -> None:
        workers = await _worker_ips(stub)
        ips = {}
        for name in names:
            actor = await get_actor(stub, name)
            assert state(actor) == "RUNNING", name
            assignment = actor.status.worker_assignment
            (ip,) = assignment.worker_pod_ips
            ips[name] = _bare_ip(ip)
            assert workers[assignment.worker.name] == ip
            assert await _agent_at(http, ip) == name
        assert len(set(ips.values())) == len(ips), ips

    await check("a", "b")
    await stub.PauseActor(pb.PauseActorRequest(actor=ref("a")))
    await stub.ResumeActor(pb.ResumeActorRequest(actor=ref("c")))  # takes a's worker
    await check("b", "c")
    await stub.SuspendActor(pb.SuspendActorRequest(actor=ref("c")))
    await stub.ResumeActor(pb.ResumeActorRequest(actor=ref("a")))  # memory kept
    await check("a", "b")
    for name in ("a", "b"):
        await stub.SuspendActor(pb.SuspendActorRequest(actor=ref(name)))


async def test_a_resuming_actor_already_has_its_workers_ip(
    stub: Any, backend: LocalBackend
) -> None:
    """While RESUMING (its sandbox still starting) the actor already carries its worker
    assignment, the worker's IP included: the workflow writes it with RESUMING, before the
    restore (kagent:controlapi/workflow_resume.go@2559ec02)."""
    await workload_actor(stub, backend, "late", late_workload(2))
    resume = asyncio.ensure_future(stub.ResumeActor(pb.ResumeActorRequest(actor=ref("late"))))
    seen = await wait_state(stub, "late", "RESUMING")
    workers = await _worker_ips(stub)
    assignment = seen.status.worker_assignment
    assert list(assignment.worker_pod_ips) == [workers[assignment.worker.name]]
    running = (await resume).actor
    assert running.status.worker_assignment.worker_pod_ips == assignment.worker_pod_ips
    await stub.SuspendActor(pb.SuspendActorRequest(actor=ref("late")))


async def test_without_port_80_the_record_keeps_ip_and_port(tmp_path: Path) -> None:
    """Where the agent may not bind port 80 (no root) the process runtime falls back to a free
    port on the worker's own loopback IP, records ``ip:port`` (which the local router dials as
    given) and says so in its start-up warning; two backends never share a worker IP."""
    runtimes = [  # on the host's network, as without root (no namespace per actor)
        ProcessRuntime(
            RuntimeConfig(tmp_path / name / "runtime", name, 2, {"process.network": "host"})
        )
        for name in ("gsaddr1", "gsaddr2")
    ]
    first, _ = runtimes
    first.port80_problem = "binding port 80 needs root or CAP_NET_BIND_SERVICE"
    assert "ateom_pod_ip reads <ip>:<port>" in (first.warning() or "")
    for runtime in runtimes:
        await runtime.open()
    try:
        ips = [r.worker_ip(Slot(i)) for r in runtimes for i in (0, 1)]
        assert len({_bare_ip(ip) for ip in ips}) == 4
        agent = (sys.executable, "-m", "sandbox_agent", "--host", "0.0.0.0", "--port", "80")
        template = TemplateSpec(
            "local", "sandbox", agent, (), "/readyz", 80, tmp_path / "store", Rootfs("host")
        )
        started = await first.start(
            ActorSpec("t", "fallback", template), Slot(1), None, timeout_s=30
        )
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
