"""`ateapi.Control` as a whole: every RPC of the proto served, policy RPCs refused with the
reason, the elapsed trailer, placement by selectors, what pause and suspend keep, metrics under
Substrate's names, and the backend's own guards (one backend per state folder, a June state
folder refused, `local down` never signals an embedding process)."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from local_helpers import (
    RUNTIMES,
    agent_url,
    answer,
    error,
    get_actor,
    make_actor,
    ref,
    register_template,
    run_in,
    state,
    status_code,
)

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.local import LocalBackend
from gym_substrate.local.errors import BackendError

C = grpc.StatusCode
CONTROL = pb.DESCRIPTOR.services_by_name["Control"]
_EGRESS = (
    "the local backend does not enforce egress policies: its sandboxes have no network beyond "
    "their own loopback (docs/local.md, 'What the local backend does not do')"
)
_ACCESS = (
    "the local backend does not enforce access policies: every caller that passes its auth mode "
    "may do everything (docs/local.md, 'What the local backend does not do')"
)
POLICY = {
    **{f"{verb}ActorEgressPolicy": _EGRESS for verb in ("Get", "Create", "Update", "Delete")},
    **{f"{verb}GlobalAccessPolicy": _ACCESS for verb in ("Get", "Create", "Update")},
    **{f"{verb}AtespaceAccessPolicy": _ACCESS for verb in ("Get", "Create", "Update", "Delete")},
}


def _raw(channel: grpc.aio.Channel, method: str) -> Any:
    return channel.unary_unary(
        f"/ateapi.Control/{method}",
        request_serializer=lambda payload: payload,
        response_deserializer=lambda payload: payload,
    )


async def test_every_rpc_of_the_proto_is_served(backend: LocalBackend) -> None:
    """real: ateapi serves every RPC of `ateapi.Control` (ateapi.proto@2179589f); an empty
    request is refused by validation or answered, never `unknown method`. The policy RPCs
    (egress and access, ateapi.proto@2179589f) answer UNIMPLEMENTED here with the
    reason: the local backend enforces no policy, and a stored one that did nothing would
    mislead (design.md)."""
    async with grpc.aio.insecure_channel(backend.api_address) as channel:
        for method in CONTROL.methods:
            call = _raw(channel, method.name)(b"")
            code, message = await answer(call)
            if method.name in POLICY:
                assert (code, message) == (C.UNIMPLEMENTED, POLICY[method.name]), method.name
            else:
                assert code != C.UNIMPLEMENTED, (method.name, message)
                assert code in (C.OK, C.INVALID_ARGUMENT), (method.name, code, message)
    assert set(POLICY) <= set(CONTROL.methods_by_name)


async def test_every_answer_carries_the_elapsed_trailer(stub: Any) -> None:
    """real: ServerUnaryInterceptor sets `x-server-elapsed-us` after the handler returns,
    errors included (the client reads it off an ALREADY_EXISTS too); unknown fields are refused
    inside it (internal/ateinterceptors/ateinterceptors.go@2e3e300a, the chain in
    cmd/ateapi/main.go read_file id 70520562568)."""
    atespace = pb.CreateAtespaceRequest(
        atespace=pb.Atespace(metadata=pb.ResourceMetadata(name="t"))
    )
    ok = stub.CreateAtespace(atespace)
    await ok
    calls = [
        (ok, C.OK),
        (stub.CreateAtespace(atespace), C.ALREADY_EXISTS),
        (stub.GetActor(pb.GetActorRequest(actor=ref("nobody"))), C.NOT_FOUND),
        (stub.GetActor(pb.GetActorRequest()), C.INVALID_ARGUMENT),
        (stub.ResumeActor(pb.ResumeActorRequest(actor=ref("nobody"))), C.NOT_FOUND),
        (stub.GetActorEgressPolicy(pb.GetActorEgressPolicyRequest()), C.UNIMPLEMENTED),
    ]
    for call, code in calls:
        assert await status_code(call) == code
        trailers = dict(await call.trailing_metadata())
        assert re.fullmatch(r"\d+", trailers["x-server-elapsed-us"]), trailers


@pytest.mark.parametrize("runtime_name", RUNTIMES)
async def test_pause_keeps_memory_and_suspend_keeps_files(
    stub: Any, backend: LocalBackend, http: aiohttp.ClientSession
) -> None:
    """real: a pause keeps the actor's memory (a node-local snapshot of the whole sandbox) and
    a suspend its state in a durable snapshot (kagent:controlapi/workflow_pause.go,
    workflow_suspend.go@2559ec02). gVisor keeps memory through both; the process runtime keeps a
    paused process stopped but, suspended, only its files (runtimes/base.py)."""
    await make_actor(stub, "mem")
    r = ref("mem")
    await stub.ResumeActor(pb.ResumeActorRequest(actor=r))
    counter = "i=0; while :; do i=$((i+1)); echo $i > /tmp/n; sleep 0.02; done"
    url = agent_url(backend, "mem")
    body = {"id": "counter", "command": counter, "timeout_s": 120}
    async with http.post(f"{url}/v1/exec", json=body) as response:
        assert response.status == 202, await response.text()
    await run_in(http, backend, "mem", "echo kept > /tmp/file.txt")
    await stub.PauseActor(pb.PauseActorRequest(actor=r))
    await stub.ResumeActor(pb.ResumeActorRequest(actor=r))
    async with http.get(f"{agent_url(backend, 'mem')}/v1/exec/counter") as response:
        assert (await response.json())["state"] == "running"  # the same process, memory kept
    await stub.SuspendActor(pb.SuspendActorRequest(actor=r))
    await stub.ResumeActor(pb.ResumeActorRequest(actor=r))
    assert (await run_in(http, backend, "mem", "cat /tmp/file.txt"))["stdout"] == "kept\n"
    assert backend.runtime is not None
    async with http.get(f"{agent_url(backend, 'mem')}/v1/exec/counter") as response:
        if backend.runtime.memory_survives_suspend:
            assert (await response.json())["state"] == "running"
        else:
            assert response.status == 404  # a new agent process: its job table is empty
    await stub.SuspendActor(pb.SuspendActorRequest(actor=r))
    await stub.DeleteActor(pb.DeleteActorRequest(actor=r))


async def test_worker_selectors_limit_placement(stub: Any, backend: LocalBackend) -> None:
    """real: a worker is eligible only when the template's and the actor's worker_selector
    both match its labels (`Applies`, scheduling/scheduling.go@0d9382eb); with none eligible
    ResumeActor is RESOURCE_EXHAUSTED `no free workers available`, and an UpdateActor of the
    selector takes effect at the next resume (kagent:controlapi/actor.go@447b0ad3). The local
    workers carry `ate.dev/worker-pool: local` and `runtime: <name>`."""
    created = await make_actor(stub, "sel", labels={"gpu": "yes"})
    assert await answer(stub.ResumeActor(pb.ResumeActorRequest(actor=ref("sel")))) == (
        C.RESOURCE_EXHAUSTED,
        "no free workers available",
    )
    labels = {"ate.dev/worker-pool": "local", "runtime": backend.runtime_name}
    fixed = pb.Actor(metadata=created.metadata, actor_template=created.actor_template)
    fixed.worker_selector.match_labels.update(labels)
    await stub.UpdateActor(pb.UpdateActorRequest(actor=fixed))
    running = (await stub.ResumeActor(pb.ResumeActorRequest(actor=ref("sel")))).actor
    assert state(running) == "RUNNING"
    worker = await stub.GetWorker(
        pb.GetWorkerRequest(worker=running.status.worker_assignment.worker)
    )
    assert labels.items() <= dict(worker.labels).items()
    await stub.SuspendActor(pb.SuspendActorRequest(actor=ref("sel")))


@pytest.mark.parametrize("runtime_name", RUNTIMES)
async def test_a_command_that_cannot_start_crashes_the_actor(
    stub: Any, backend: LocalBackend
) -> None:
    """real: an atelet Run that fails crashes the actor with `resume failed: atelet Run:
    <...>` and frees its worker (kagent:controlapi/crash.go@2559ec02, row 1 of upstream-actors.md
    §12); the template's golden build ends `GoldenActorCrashed: ...`
    (controlapi/template_reconciler.go@00cd6e96). A workload that exits at once crashes at once,
    not at the probe's timeout. (June: the actor stayed RESUMING until a 28 s deadline.)"""
    template = await register_template(backend, "broken", ("/nonexistent/agent",))
    status = template.status.golden_snapshot_status
    assert status.error_message.startswith("GoldenActorCrashed: "), status.error_message
    await make_actor(stub, "x", template="broken")
    failed = await error(stub.ResumeActor(pb.ResumeActorRequest(actor=ref("x"))))
    assert failed.code() == C.INTERNAL
    assert (failed.details() or "").startswith("actor t/x crashed: atelet Run: ")
    crashed = await get_actor(stub, "x")
    assert state(crashed) == "CRASHED"
    assert crashed.status.crash.message.startswith("resume failed: atelet Run: ")
    workers = (await stub.ListWorkers(pb.ListWorkersRequest())).workers
    assert [w.status.allocated.actors for w in workers] == [0, 0]
    await stub.DeleteActor(pb.DeleteActorRequest(actor=ref("x")))


async def test_metrics_use_substrate_names(
    stub: Any, backend: LocalBackend, http: aiohttp.ClientSession
) -> None:
    """real: ateapi exports `rpc.server.call.duration` {rpc.method, rpc.response.status_code}
    and `ate.actor.lifecycle.operation.duration` {ate.actor.operation.name,
    ate.template.atespace, ate.template.name, ate.snapshot.kind}, a Prometheus scrape showing
    them with underscores and unit suffixes (docs/metrics/registry/metrics.yaml@09c2ac9c);
    what Substrate has no metric for is `gym_substrate_local_*`."""
    await make_actor(stub, "m1")
    await stub.ResumeActor(pb.ResumeActorRequest(actor=ref("m1")))
    async with http.get(f"{backend.admin_url}/metrics") as response:
        text = await response.text()
    assert (
        'rpc_server_call_duration_seconds_count{rpc_method="ateapi.Control/CreateActor",'
        'rpc_response_status_code="OK"} 1.0' in text
    )
    assert (
        'ate_actor_lifecycle_operation_duration_seconds_count{ate_actor_operation_name="resume",'
        'ate_snapshot_kind="golden",ate_template_atespace="local",ate_template_name="sandbox",'
        'error_type=""} 1.0' in text
    )
    assert 'gym_substrate_local_actors{state="RUNNING"} 1.0' in text
    assert 'gym_substrate_local_workers{state="busy"} 1.0' in text
    assert 'gym_substrate_local_workers{state="free"} 1.0' in text
    for name in ("atelet_snapshot_size_bytes", "ate_actor_lifecycle_operation_duration_seconds"):
        assert f"# TYPE {name} histogram" in text
    await stub.SuspendActor(pb.SuspendActorRequest(actor=ref("m1")))


async def test_one_backend_per_state_folder(backend: LocalBackend) -> None:
    """A state folder belongs to one backend at a time (its lock); a taken API port is refused
    with what to do (statedir.py, backend.py)."""
    with pytest.raises(BackendError, match="already uses"):
        async with LocalBackend(backend.state_dir, runtime="process", default_rootfs="host"):
            pass
    busy = LocalBackend(
        backend.state_dir.parent / "other",
        runtime="process",
        default_rootfs="host",
        api_port=backend.api_port,
    )
    with pytest.raises(BackendError, match="pick another --api-port"):
        await busy.start()


async def test_a_june_state_folder_is_refused(tmp_path: Path) -> None:
    """A state folder written by a backend that spoke the June API is refused at start, saying
    how to go on (design.md: store schema "2", StaleStateError -> BackendError): its actors
    cannot be carried over, and reading them as today's would mislead."""
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    db = sqlite3.connect(state_dir / "state.db")
    db.execute("CREATE TABLE actors (atespace TEXT, actor_id TEXT, body TEXT)")
    db.commit()
    db.close()
    backend = LocalBackend(state_dir, runtime="process", default_rootfs="host")
    with pytest.raises(BackendError, match="June 2026 ateapi") as info:
        await backend.start()
    assert "local down --purge" in str(info.value)


def test_pool_options_are_checked(tmp_path: Path) -> None:
    """`LocalBackend(workers=N, actors_per_worker=K)`: at least one of each, at most 64 actors a
    worker and 250 in all (runtime slots); the default K comes from this machine."""
    for workers, per_worker in ((0, 1), (1, 0), (1, 65), (10, 30)):
        with pytest.raises(ValueError, match="workers"):
            LocalBackend(tmp_path, workers=workers, actors_per_worker=per_worker)
    default = LocalBackend(tmp_path, workers=2)
    assert 1 <= default.actors_per_worker <= 64


def test_down_never_signals_an_embedding_process(backend: LocalBackend) -> None:
    """`local down` stops only a backend that runs in a process of its own; one embedded in a
    program (a test, a trainer) is left alone, with a message saying so."""
    from click.testing import CliRunner

    from gym_substrate.cli.local import local  # here: the CLI is re-based apart (design.md)

    result = CliRunner().invoke(local, ["down", "--state-dir", str(backend.state_dir)])
    assert result.exit_code != 0
    assert "embedded" in result.output
    assert backend.plane is not None  # still serving
