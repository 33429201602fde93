"""ateapi.Control over gRPC: every RPC and illegal transition answers Substrate's status code."""

from __future__ import annotations

import asyncio
import dataclasses
import sys
from pathlib import Path
from typing import Any

import grpc
import pytest
from click.testing import CliRunner
from local_helpers import RUNTIMES, host, make_actor, ref, status_code

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.ateapi import ateapi_pb2_grpc as pb_grpc
from gym_substrate.cli.local import local
from gym_substrate.local import LocalBackend
from gym_substrate.local.errors import BackendError

S = pb.Actor.Status
C = grpc.StatusCode


def _listing(folder: Path) -> list[str] | None:
    """Names in a folder, or None when it does not exist."""
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else None


async def test_atespaces(stub: Any) -> None:
    created = await stub.CreateAtespace(pb.CreateAtespaceRequest(name="team-a"))
    assert created.atespace.name == "team-a"
    assert await status_code(stub.CreateAtespace(pb.CreateAtespaceRequest(name="team-a"))) == (
        C.ALREADY_EXISTS
    )
    for bad in ("", "Team", "a_b", "-a", "a" * 64):
        assert await status_code(stub.CreateAtespace(pb.CreateAtespaceRequest(name=bad))) == (
            C.INVALID_ARGUMENT
        ), bad
    got = await stub.GetAtespace(pb.GetAtespaceRequest(name="team-a"))
    assert got.atespace.name == "team-a"
    assert await status_code(stub.GetAtespace(pb.GetAtespaceRequest(name="nope"))) == C.NOT_FOUND
    await make_actor(stub, "x1", atespace="team-a")
    listed = await stub.ListAtespaces(pb.ListAtespacesRequest())
    # the template controller's golden atespace is there too (test_fidelity_control.py)
    assert [a.name for a in listed.atespaces] == ["ate-golden", "team-a"]
    assert await status_code(stub.DeleteAtespace(pb.DeleteAtespaceRequest(name="team-a"))) == (
        C.FAILED_PRECONDITION
    )
    await stub.DeleteActor(pb.DeleteActorRequest(actor_ref=ref("x1", "team-a")))
    await stub.DeleteAtespace(pb.DeleteAtespaceRequest(name="team-a"))
    assert await status_code(stub.DeleteAtespace(pb.DeleteAtespaceRequest(name="team-a"))) == (
        C.NOT_FOUND
    )


async def test_create_actor_errors(stub: Any) -> None:
    actor = await make_actor(stub, "a1")
    assert (actor.status, actor.version, actor.atespace) == (S.STATUS_SUSPENDED, 1, "t")
    assert (actor.actor_template_namespace, actor.actor_template_name) == ("local", "sandbox")
    assert actor.ateom_pod_ip == ""
    assert actor.worker_pool_name == ""

    def create(name: str, atespace: str = "t", tpl: str = "sandbox") -> Any:
        return stub.CreateActor(
            pb.CreateActorRequest(
                actor_ref=ref(name, atespace),
                actor_template_namespace="local",
                actor_template_name=tpl,
            )
        )

    assert await status_code(create("a1")) == C.ALREADY_EXISTS
    # Substrate's create_actor.go: FAILED_PRECONDITION for a missing template or atespace
    assert await status_code(create("a2", tpl="nope")) == C.FAILED_PRECONDITION
    assert await status_code(create("a2", atespace="nope")) == C.FAILED_PRECONDITION
    for bad in ("", "A1", "a.b", "a_b", "x-", "a" * 64):
        assert await status_code(create(bad)) == C.INVALID_ARGUMENT, bad
    bad_selector = pb.CreateActorRequest(
        actor_ref=ref("a3"),
        actor_template_namespace="local",
        actor_template_name="sandbox",
        worker_selector=pb.Selector(match_labels={"bad key!": "v"}),
    )
    assert await status_code(stub.CreateActor(bad_selector)) == C.INVALID_ARGUMENT
    listed = await stub.ListActors(pb.ListActorsRequest(atespace="t"))
    assert [a.actor_id for a in listed.actors] == ["a1"]  # nothing half-created


async def test_get_and_missing_actor(stub: Any) -> None:
    await make_actor(stub, "a1")
    got = await stub.GetActor(pb.GetActorRequest(actor_ref=ref("a1")))
    assert got.actor.actor_id == "a1"
    # one at a time: Resume, Pause and Suspend take the lock of "zz" before they look it up
    for call in (
        lambda: stub.GetActor(pb.GetActorRequest(actor_ref=ref("zz"))),
        lambda: stub.ResumeActor(pb.ResumeActorRequest(actor_ref=ref("zz"))),
        lambda: stub.PauseActor(pb.PauseActorRequest(actor_ref=ref("zz"))),
        lambda: stub.SuspendActor(pb.SuspendActorRequest(actor_ref=ref("zz"))),
        lambda: stub.DeleteActor(pb.DeleteActorRequest(actor_ref=ref("zz"))),
        lambda: stub.UpdateActor(pb.UpdateActorRequest(actor_ref=ref("zz"))),
    ):
        assert await status_code(call()) == C.NOT_FOUND
    assert await status_code(stub.GetActor(pb.GetActorRequest(actor_ref=ref("")))) == (
        C.INVALID_ARGUMENT
    )
    assert await status_code(stub.GetActor(pb.GetActorRequest(actor_ref=ref("a1", "")))) == (
        C.INVALID_ARGUMENT
    )


async def test_list_actors_paging(stub: Any) -> None:
    for index in range(5):
        await make_actor(stub, f"p{index}", atespace="one")
    await make_actor(stub, "q0", atespace="two")
    seen: list[str] = []
    token = ""
    pages = 0
    while True:
        page = await stub.ListActors(pb.ListActorsRequest(page_size=2, page_token=token))
        seen += [f"{a.atespace}/{a.actor_id}" for a in page.actors]
        pages += 1
        token = page.next_page_token
        if not token:
            break
    assert pages == 4  # the golden actor of local/sandbox is listed too
    assert sorted(seen) == sorted({*seen})
    assert len(seen) == 7
    only = await stub.ListActors(pb.ListActorsRequest(atespace="two"))
    assert [a.actor_id for a in only.actors] == ["q0"]
    for size in (-1, 1001):
        assert await status_code(stub.ListActors(pb.ListActorsRequest(page_size=size))) == (
            C.INVALID_ARGUMENT
        )
    # a token this server never issued: INTERNAL, as ateredis.go (test_hostile_api.py)
    assert (
        await status_code(stub.ListActors(pb.ListActorsRequest(page_token="%%%not-a-token")))
        == C.INTERNAL
    )


@pytest.mark.parametrize("runtime_name", RUNTIMES)
async def test_lifecycle_transitions_and_versions(stub: Any, backend: LocalBackend) -> None:
    await make_actor(stub, "life")
    r = ref("life")
    # illegal from SUSPENDED: the pause workflow finds no worker (workflow_pause.go)
    assert await status_code(stub.PauseActor(pb.PauseActorRequest(actor_ref=r))) == (C.INTERNAL)
    # suspend is idempotent when already SUSPENDED
    same = await stub.SuspendActor(pb.SuspendActorRequest(actor_ref=r))
    assert same.actor.status == S.STATUS_SUSPENDED
    running = (await stub.ResumeActor(pb.ResumeActorRequest(actor_ref=r))).actor
    assert running.status == S.STATUS_RUNNING
    assert running.ateom_pod_ip
    assert running.worker_pool_name == "local"
    assert running.ateom_pod_name
    assert running.ateom_pod_uid
    again = (await stub.ResumeActor(pb.ResumeActorRequest(actor_ref=r))).actor
    assert again.version == running.version  # idempotent, no write
    assert await status_code(stub.DeleteActor(pb.DeleteActorRequest(actor_ref=r))) == (
        C.FAILED_PRECONDITION
    )
    workers = (await stub.ListWorkers(pb.ListWorkersRequest())).workers
    assert len(workers) == 2
    busy = [w for w in workers if w.actor_id]
    assert [(w.actor_id, w.actor_atespace, w.actor_template) for w in busy] == [
        ("life", "t", "sandbox")
    ]
    assert busy[0].worker_pod == running.ateom_pod_name

    paused = (await stub.PauseActor(pb.PauseActorRequest(actor_ref=r))).actor
    assert paused.status == S.STATUS_PAUSED
    assert paused.version > running.version
    assert paused.latest_snapshot_info.type == pb.SNAPSHOT_TYPE_LOCAL
    assert paused.ateom_pod_ip == ""
    assert paused.worker_pool_name == ""
    assert (await stub.PauseActor(pb.PauseActorRequest(actor_ref=r))).actor.status == (
        S.STATUS_PAUSED
    )
    # Substrate cannot suspend a paused actor (no active worker, workflow_suspend.go)
    assert await status_code(stub.SuspendActor(pb.SuspendActorRequest(actor_ref=r))) == (C.INTERNAL)
    assert await status_code(stub.DeleteActor(pb.DeleteActorRequest(actor_ref=r))) == (
        C.FAILED_PRECONDITION
    )
    resumed = (await stub.ResumeActor(pb.ResumeActorRequest(actor_ref=r))).actor
    assert resumed.status == S.STATUS_RUNNING
    assert resumed.version > paused.version
    suspended = (await stub.SuspendActor(pb.SuspendActorRequest(actor_ref=r))).actor
    assert suspended.status == S.STATUS_SUSPENDED
    info = suspended.latest_snapshot_info
    assert info.type == pb.SNAPSHOT_TYPE_EXTERNAL
    snapshot = Path(info.external.snapshot_uri_prefix.removeprefix("file://"))
    store = backend.state_dir / "snapshots" / "store"
    assert snapshot.is_relative_to(store / "life")
    assert _listing(snapshot) != []
    # the superseded pause snapshot is gone
    assert _listing(backend.state_dir / "snapshots" / "local") in (None, [])
    await stub.DeleteActor(pb.DeleteActorRequest(actor_ref=r))
    assert _listing(snapshot) is None
    assert _listing(store / "life") is None
    assert await status_code(stub.GetActor(pb.GetActorRequest(actor_ref=r))) == C.NOT_FOUND


@pytest.mark.parametrize("runtime_name", RUNTIMES)
async def test_pause_keeps_memory_and_suspend_keeps_files(
    stub: Any, backend: LocalBackend, http: Any
) -> None:
    await make_actor(stub, "mem")
    r = ref("mem")
    await stub.ResumeActor(pb.ResumeActorRequest(actor_ref=r))
    url = backend.router_url

    async def run(command: str) -> str:
        async with http.post(
            f"{url}/v1/exec?wait=8", json={"command": command}, headers=host("mem")
        ) as response:
            assert response.status == 200, await response.text()
            body = await response.json()
            return str(body["stdout"]).strip()

    # a job holding state in memory, and a file in the working folder
    async with http.post(
        f"{url}/v1/exec",
        json={
            "id": "counter",
            "command": "i=0; while :; do i=$((i+1)); echo $i > n; sleep 0.02; done",
            "timeout_s": 120,
        },
        headers=host("mem"),
    ) as response:
        assert response.status == 202
    await run("echo kept > file.txt")
    await asyncio.sleep(0.2)
    await stub.PauseActor(pb.PauseActorRequest(actor_ref=r))
    await stub.ResumeActor(pb.ResumeActorRequest(actor_ref=r))
    async with http.get(f"{url}/v1/exec/counter", headers=host("mem")) as response:
        assert (await response.json())["state"] == "running"  # the same process, memory kept
    await stub.SuspendActor(pb.SuspendActorRequest(actor_ref=r))
    await stub.ResumeActor(pb.ResumeActorRequest(actor_ref=r))
    assert await run("cat file.txt") == "kept"
    assert backend.runtime is not None
    if backend.runtime.memory_survives_suspend:
        async with http.get(f"{url}/v1/exec/counter", headers=host("mem")) as response:
            assert (await response.json())["state"] == "running"
    await stub.SuspendActor(pb.SuspendActorRequest(actor_ref=r))
    await stub.DeleteActor(pb.DeleteActorRequest(actor_ref=r))


@pytest.mark.parametrize("runtime_name", RUNTIMES)
@pytest.mark.parametrize("backend_options", [{"workers": 1}])
async def test_no_free_workers_and_abort(
    stub: Any, backend: LocalBackend, runtime_name: str
) -> None:
    # a template whose agent takes a second to come up keeps the first resume in flight; the
    # agent's --host/--port stay in argv, where the process runtime points them at the worker
    assert backend.plane is not None
    default = backend.plane.templates["local/sandbox"]
    agent = (sys.executable, "-m", "sandbox_agent", "--host", "0.0.0.0", "--port", "80")
    slow = dataclasses.replace(
        default, name="slow", command=("/bin/sh", "-c", 'sleep 1; exec "$0" "$@"', *agent)
    )
    await backend.plane.add_template(slow)
    await make_actor(stub, "w2")
    await stub.CreateActor(
        pb.CreateActorRequest(
            actor_ref=ref("w1slow"), actor_template_namespace="local", actor_template_name="slow"
        )
    )
    resume = asyncio.ensure_future(
        stub.ResumeActor(pb.ResumeActorRequest(actor_ref=ref("w1slow"), boot=True))
    )
    for _ in range(500):  # wait until the resume is in flight
        actor = (await stub.GetActor(pb.GetActorRequest(actor_ref=ref("w1slow")))).actor
        if actor.status == S.STATUS_RESUMING:
            break
        await asyncio.sleep(0.002)
    assert actor.status == S.STATUS_RESUMING
    for call in (
        stub.PauseActor(pb.PauseActorRequest(actor_ref=ref("w1slow"))),
        stub.ResumeActor(pb.ResumeActorRequest(actor_ref=ref("w1slow"))),
    ):
        assert await status_code(call) == C.ABORTED
    # DeleteActor and UpdateActor take no lock (delete_actor.go, update_actor.go)
    assert await status_code(stub.DeleteActor(pb.DeleteActorRequest(actor_ref=ref("w1slow")))) == (
        C.FAILED_PRECONDITION
    )
    assert await status_code(stub.UpdateActor(pb.UpdateActorRequest(actor_ref=ref("w1slow")))) == (
        C.OK
    )
    # another actor is not blocked by it, but the only worker is taken
    with pytest.raises(grpc.aio.AioRpcError) as full:
        await stub.ResumeActor(pb.ResumeActorRequest(actor_ref=ref("w2")))
    assert full.value.code() == C.FAILED_PRECONDITION
    assert full.value.details() == "no free workers available"
    assert (await resume).actor.status == S.STATUS_RUNNING
    await stub.SuspendActor(pb.SuspendActorRequest(actor_ref=ref("w1slow")))
    assert (await stub.ResumeActor(pb.ResumeActorRequest(actor_ref=ref("w2")))).actor.status == (
        S.STATUS_RUNNING
    )
    await stub.SuspendActor(pb.SuspendActorRequest(actor_ref=ref("w2")))


async def test_update_actor_selector(stub: Any) -> None:
    created = await make_actor(stub, "sel")
    updated = (
        await stub.UpdateActor(
            pb.UpdateActorRequest(
                actor_ref=ref("sel"), worker_selector=pb.Selector(match_labels={"gpu": "yes"})
            )
        )
    ).actor
    assert updated.version == created.version + 1
    assert dict(updated.worker_selector.match_labels) == {"gpu": "yes"}
    # no pool carries gpu=yes: Substrate's "no worker pool matches" precondition
    assert await status_code(stub.ResumeActor(pb.ResumeActorRequest(actor_ref=ref("sel")))) == (
        C.FAILED_PRECONDITION
    )
    fixed = (
        await stub.UpdateActor(
            pb.UpdateActorRequest(
                actor_ref=ref("sel"),
                worker_selector=pb.Selector(match_labels={"ate.dev/worker-pool": "local"}),
            )
        )
    ).actor
    assert fixed.version == updated.version + 1
    for labels in ({"k": "x" * 64}, {"-k": "v"}, {"/k": "v"}, {"Bad_Prefix/k": "v"}, {"k": "v!"}):
        bad = pb.UpdateActorRequest(
            actor_ref=ref("sel"), worker_selector=pb.Selector(match_labels=labels)
        )
        assert await status_code(stub.UpdateActor(bad)) == C.INVALID_ARGUMENT, labels
    many = {f"k{i}": "v" for i in range(11)}
    too_many = pb.UpdateActorRequest(
        actor_ref=ref("sel"), worker_selector=pb.Selector(match_labels=many)
    )
    assert await status_code(stub.UpdateActor(too_many)) == C.INVALID_ARGUMENT
    ok = {"example.com/team": "a-1", "plain": ""}
    fine = pb.UpdateActorRequest(actor_ref=ref("sel"), worker_selector=pb.Selector(match_labels=ok))
    assert await status_code(stub.UpdateActor(fine)) == C.OK


async def test_session_identity_and_debug_clear(stub: Any, backend: LocalBackend) -> None:
    channel = grpc.aio.insecure_channel(backend.api_address)
    identity = pb_grpc.SessionIdentityStub(channel)
    # real: sessionidentity.go; plaintext has no token issuer and no TLS peer (more in
    # test_fidelity_security.py)
    assert await status_code(identity.MintJWT(pb.MintJWTRequest(app_id="a"))) == (C.UNAUTHENTICATED)
    assert await status_code(identity.MintCert(pb.MintCertRequest(app_id="a"))) == (
        C.UNAUTHENTICATED
    )
    await channel.close()
    await make_actor(stub, "gone")
    await stub.DebugClear(pb.DebugClearRequest())
    assert len((await stub.ListActors(pb.ListActorsRequest())).actors) == 0
    assert len((await stub.ListAtespaces(pb.ListAtespacesRequest())).atespaces) == 0


async def test_metrics_use_substrate_names(stub: Any, backend: LocalBackend, http: Any) -> None:
    await make_actor(stub, "m1")
    async with http.get(f"{backend.admin_url}/metrics") as response:
        text = await response.text()
    assert (
        'rpc_server_call_duration_seconds_count{rpc_method="ateapi.Control/CreateActor",'
        'rpc_response_status_code="OK"} 1.0' in text
    )
    # m1 and the golden actor of local/sandbox
    assert 'gym_substrate_local_actors{status="STATUS_SUSPENDED"} 2.0' in text
    assert 'gym_substrate_local_workers{state="free"} 2.0' in text
    for name in ("atenet_router_route_duration_seconds", "atelet_snapshot_size_bytes"):
        assert f"# TYPE {name} histogram" in text


async def test_one_backend_per_state_folder(backend: LocalBackend) -> None:
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


@pytest.mark.parametrize("backend_options", [{"workers": 2, "workflow_timeout_s": 2.0}])
async def test_broken_template_fails_resume_and_suspend_recovers_it(
    stub: Any, backend: LocalBackend, http: Any, tmp_path: Path
) -> None:
    """A command that never answers readyz fails the resume at the workflow deadline (28 s on
    a cluster, 2 s here; test_fidelity_control.py waits the real one) and leaves the actor
    RESUMING on its worker (workflow_resume.go keeps what a failed step left); SuspendActor,
    finding no workload, returns it to SUSPENDED and frees the worker."""
    await stub.CreateAtespace(pb.CreateAtespaceRequest(name="t"))
    body = (
        "metadata: {name: missing, namespace: local}\n"
        "spec:\n  containers: [{name: a, command: [/nonexistent/agent]}]\n"
        f"  snapshotsConfig: {{location: {tmp_path / 'snaps'}}}\n  rootfs: host\n"
    )
    async with http.post(f"{backend.admin_url}/_local/templates", data=body) as response:
        assert response.status == 200, await response.text()
    await stub.CreateActor(
        pb.CreateActorRequest(
            actor_ref=ref("missing"),
            actor_template_namespace="local",
            actor_template_name="missing",
        )
    )
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.ResumeActor(pb.ResumeActorRequest(actor_ref=ref("missing")))
    assert info.value.code() == C.DEADLINE_EXCEEDED
    assert info.value.details() == "context deadline exceeded"
    actor = (await stub.GetActor(pb.GetActorRequest(actor_ref=ref("missing")))).actor
    assert actor.status == S.STATUS_RESUMING
    assert actor.ateom_pod_name
    workers = (await stub.ListWorkers(pb.ListWorkersRequest())).workers
    assert sorted(w.actor_id for w in workers) == ["", "missing"]
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.SuspendActor(pb.SuspendActorRequest(actor_ref=ref("missing")))
    assert info.value.code() == C.INTERNAL
    actor = (await stub.GetActor(pb.GetActorRequest(actor_ref=ref("missing")))).actor
    assert (actor.status, actor.ateom_pod_ip) == (S.STATUS_SUSPENDED, "")
    workers = (await stub.ListWorkers(pb.ListWorkersRequest())).workers
    assert [w.actor_id for w in workers] == ["", ""]  # no slot leaked
    await stub.DeleteActor(pb.DeleteActorRequest(actor_ref=ref("missing")))


def test_down_never_signals_an_embedding_process(backend: LocalBackend) -> None:
    result = CliRunner().invoke(local, ["down", "--state-dir", str(backend.state_dir)])
    assert result.exit_code != 0
    assert "embedded" in result.output
    assert backend.plane is not None  # still serving
