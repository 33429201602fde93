"""The local control plane fails the way a real Agent Substrate fails (timings, codes, messages).

One test per case of the issue "The local backend fails the way real Agent Substrate fails"
(control-plane items), each through the gRPC API of a started local backend, each docstring
naming the real behaviour and the Go file it comes from (paths under
cmd/ateapi/internal/controlapi/ unless said otherwise). The 28 s cases wait out the real
deadline and are marked slow.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import re
import signal
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from local_helpers import (
    RUNTIMES,
    host,
    late_workload,
    make_actor,
    ref,
    register_template,
    status_code,
    workload_actor,
)

from gym_substrate._config import ConnectionConfig
from gym_substrate._grpc import ControlClient
from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.ateapi import ateapi_pb2_grpc as pb_grpc
from gym_substrate.local import LocalBackend
from gym_substrate.local.runtimes.gvisor import GvisorRuntime
from gym_substrate.local.runtimes.process import SANDBOX_ENV
from gym_substrate.local.workflows import WORKFLOW_DEADLINE_S

S = pb.Actor.Status
C = grpc.StatusCode

_LABEL_RULE = (
    "must start and end with a lower case alphanumeric character, and consist only of lower "
    "case alphanumeric characters or '-'"
)


@pytest.fixture(params=RUNTIMES)
def runtime_name(request: pytest.FixtureRequest) -> str:
    """Every backend test here runs on both local runtimes."""
    name: str = request.param
    return name


EXITS = ("/bin/sh", "-c", "exit 1")  # a workload that dies before it is ever ready


async def _resuming(stub: Any, name: str) -> tuple[asyncio.Future[Any], pb.Actor]:
    """Start a ResumeActor of t/<name> and return it once the actor shows RESUMING."""
    resume = asyncio.ensure_future(stub.ResumeActor(pb.ResumeActorRequest(actor_ref=ref(name))))
    return resume, await _wait_status(stub, name, S.STATUS_RESUMING)


async def _error(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value


async def _get(stub: Any, name: str, atespace: str = "t") -> pb.Actor:
    return (await stub.GetActor(pb.GetActorRequest(actor_ref=ref(name, atespace)))).actor


async def _wait_status(stub: Any, name: str, status: int, atespace: str = "t") -> pb.Actor:
    for _ in range(1000):
        actor = await _get(stub, name, atespace)
        if actor.status == status:
            return actor
        await asyncio.sleep(0.005)
    raise AssertionError(f"{name} never reached {S.Name(status)}")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- §1 timing


def test_the_workflow_deadline_is_the_real_one() -> None:
    """Real: a 30 s lock TTL minus 2 s of padding bounds every workflow (workflow.go)."""
    assert WORKFLOW_DEADLINE_S == 28.0
    assert LocalBackend(Path("/nonexistent")).workflow_timeout_s == 28.0


@pytest.mark.slow
async def test_failed_resume_holds_resuming_and_its_worker_until_the_deadline(
    stub: Any, backend: LocalBackend
) -> None:
    """Real: atelet polls readyz for up to 30 s whatever the workload does (internal/readyz/
    readyz.go), so a workload that never gets ready ends only at the 28 s workflow deadline:
    DEADLINE_EXCEEDED "context deadline exceeded". Meanwhile the actor is RESUMING on its worker,
    DeleteActor is FAILED_PRECONDITION naming that status and another ResumeActor ABORTED; after
    the deadline it is still RESUMING on that worker (workflow_resume.go rolls nothing back)."""
    await workload_actor(stub, backend, "never", EXITS)
    started = time.monotonic()
    resume, during = await _resuming(stub, "never")
    assert during.ateom_pod_name
    await asyncio.sleep(2.0)  # the workload has long exited; the resume still holds on
    assert not resume.done()
    delete = await _error(stub.DeleteActor(pb.DeleteActorRequest(actor_ref=ref("never"))))
    assert (delete.code(), delete.details()) == (
        C.FAILED_PRECONDITION,
        "Actor never is not suspended (status: STATUS_RESUMING)",
    )
    again = await _error(stub.ResumeActor(pb.ResumeActorRequest(actor_ref=ref("never"))))
    assert again.code() == C.ABORTED
    error = await _error(resume)
    elapsed = time.monotonic() - started
    assert (error.code(), error.details()) == (C.DEADLINE_EXCEEDED, "context deadline exceeded")
    assert 26.0 <= elapsed <= 34.0, elapsed
    after = await _get(stub, "never")
    assert after.status == S.STATUS_RESUMING
    assert after.ateom_pod_name == during.ateom_pod_name
    workers = (await stub.ListWorkers(pb.ListWorkersRequest())).workers
    assert sorted(w.actor_id for w in workers) == ["", "never"]
    # this backend's way back: SuspendActor finds no workload and frees the worker
    assert await status_code(stub.SuspendActor(pb.SuspendActorRequest(actor_ref=ref("never")))) == (
        C.INTERNAL
    )
    assert (await _get(stub, "never")).status == S.STATUS_SUSPENDED
    await stub.DeleteActor(pb.DeleteActorRequest(actor_ref=ref("never")))


@pytest.mark.slow
async def test_a_start_slower_than_28_s_fails(stub: Any, backend: LocalBackend) -> None:
    """Real: the restore runs under the 28 s workflow deadline (workflow.go), so a workload
    that needs 40 s to answer readyz never becomes RUNNING (this backend allowed 60 s)."""
    await workload_actor(stub, backend, "late", late_workload(40))
    started = time.monotonic()
    error = await _error(stub.ResumeActor(pb.ResumeActorRequest(actor_ref=ref("late"))))
    assert error.code() == C.DEADLINE_EXCEEDED
    assert 26.0 <= time.monotonic() - started <= 34.0
    assert (await _get(stub, "late")).status == S.STATUS_RESUMING
    await status_code(stub.SuspendActor(pb.SuspendActorRequest(actor_ref=ref("late"))))
    await stub.DeleteActor(pb.DeleteActorRequest(actor_ref=ref("late")))


async def test_a_client_deadline_cancels_the_resume_part_way(
    stub: Any, backend: LocalBackend
) -> None:
    """Real: the workflow runs under the request's context (workflow.go), so a client deadline
    stops it where it is: the actor stays RESUMING on its worker, nothing finishes the resume
    in the background, and the next ResumeActor carries on, reusing that worker."""
    await workload_actor(stub, backend, "cut", late_workload(3))
    error = await _error(stub.ResumeActor(pb.ResumeActorRequest(actor_ref=ref("cut")), timeout=1))
    assert error.code() == C.DEADLINE_EXCEEDED
    await asyncio.sleep(4)  # longer than the boot would have taken
    left = await _get(stub, "cut")
    assert left.status == S.STATUS_RESUMING
    assert left.ateom_pod_name
    assert left.ateom_pod_ip  # the worker's IP, set with the worker (workflow_resume.go)
    resumed = (await stub.ResumeActor(pb.ResumeActorRequest(actor_ref=ref("cut")))).actor
    assert resumed.status == S.STATUS_RUNNING
    assert resumed.ateom_pod_name == left.ateom_pod_name
    assert resumed.ateom_pod_ip.partition(":")[0] == left.ateom_pod_ip
    await stub.SuspendActor(pb.SuspendActorRequest(actor_ref=ref("cut")))


async def test_resume_of_a_running_actor_takes_the_lock(stub: Any, backend: LocalBackend) -> None:
    """Real: ResumeActor acquires `lock:actor:<id>` even for a RUNNING actor (workflow.go), so
    concurrent calls on one actor can meet it: 8 threads x 40 resumes see ABORTED, and never
    anything but OK or ABORTED."""
    await make_actor(stub, "hot")
    await stub.ResumeActor(pb.ResumeActorRequest(actor_ref=ref("hot")))
    channel = grpc.insecure_channel(backend.api_address)
    sync_stub = pb_grpc.ControlStub(channel)  # type: ignore[no-untyped-call]

    def hammer() -> list[grpc.StatusCode]:
        codes = []
        for _ in range(40):
            try:
                sync_stub.ResumeActor(pb.ResumeActorRequest(actor_ref=ref("hot")), timeout=30)
                codes.append(C.OK)
            except grpc.RpcError as exc:
                codes.append(exc.code())
        return codes

    loop = asyncio.get_running_loop()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = await asyncio.gather(*(loop.run_in_executor(pool, hammer) for _ in range(8)))
    channel.close()
    codes = [code for result in results for code in result]
    assert len(codes) == 320
    assert set(codes) <= {C.OK, C.ABORTED}
    assert codes.count(C.ABORTED) > 0
    assert codes.count(C.OK) > 0
    await stub.SuspendActor(pb.SuspendActorRequest(actor_ref=ref("hot")))


async def _kill_workload(backend: LocalBackend, handle: str) -> None:
    """SIGKILL what runs the actor behind the control plane's back: under gVisor the sandbox
    process (runsc-sandbox), under the process runtime every process of the sandbox."""
    runtime = backend.runtime
    if isinstance(runtime, GvisorRuntime):
        pids = runtime.runsc.pids(handle)
        assert pids is not None, handle
        victims = [pids[0]]
    else:
        victims = await asyncio.to_thread(_marked_processes, f"{SANDBOX_ENV}={handle}")
    assert victims
    for pid in victims:
        os.kill(pid, signal.SIGKILL)


def _marked_processes(marker: str) -> list[int]:
    """Processes whose environment holds ``marker`` (how the process runtime tags a sandbox)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                environ = (entry / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if marker.encode() in environ:
                found.append(int(entry.name))
    return found


async def test_a_dead_workload_stays_running_and_the_router_answers_503(
    stub: Any, backend: LocalBackend, http: Any
) -> None:
    """Real: nothing watches a workload; when it dies the actor stays RUNNING at its dead
    address and requests get 503 "upstream connect error" until the worker pod is deleted
    (syncer.go). No new boot, no silent state loss: the user sees it. (This backend's way back
    is SuspendActor, which fails, as a checkpoint of nothing does, and frees the worker.)"""
    await make_actor(stub, "dead")
    running = (await stub.ResumeActor(pb.ResumeActorRequest(actor_ref=ref("dead")))).actor
    assert backend.plane is not None
    record = backend.plane.lookup("t", "dead")
    assert record is not None
    await _kill_workload(backend, record.handle)

    async def call() -> tuple[int, str, float]:
        started = time.monotonic()
        async with http.post(
            f"{backend.router_url}/v1/exec?wait=8", json={"command": "true"}, headers=host("dead")
        ) as response:
            return response.status, await response.text(), time.monotonic() - started

    # A process-runtime address refuses at once. A dead gVisor sandbox's address answers
    # nothing (its netstack held it), so Envoy's default 5 s connect timeout ends the wait.
    gvisor = isinstance(backend.runtime, GvisorRuntime)
    reason = "connection timeout" if gvisor else "connection failure"
    expected = "upstream connect error or disconnect/reset before headers. reset reason: " + reason
    for _ in range(2):  # the first calls, then again once the death has been seen
        for status, text, took in await asyncio.gather(call(), call(), call()):
            assert (status, text) == (503, expected)
            assert 4.5 <= took < 8 if gvisor else took < 2, took
    still = await _get(stub, "dead")
    assert (still.status, still.version, still.ateom_pod_ip) == (
        S.STATUS_RUNNING,
        running.version,
        running.ateom_pod_ip,
    )
    resumed = (await stub.ResumeActor(pb.ResumeActorRequest(actor_ref=ref("dead")))).actor
    assert resumed.version == running.version  # RUNNING: nothing to resume
    suspend = await _error(stub.SuspendActor(pb.SuspendActorRequest(actor_ref=ref("dead"))))
    assert suspend.code() == C.INTERNAL
    assert (await _get(stub, "dead")).status == S.STATUS_SUSPENDED
    again = (await stub.ResumeActor(pb.ResumeActorRequest(actor_ref=ref("dead")))).actor
    assert again.status == S.STATUS_RUNNING
    await stub.SuspendActor(pb.SuspendActorRequest(actor_ref=ref("dead")))


# ---------------------------------------------------------------------------- §2 codes


async def test_suspend_of_a_paused_actor_is_internal(stub: Any) -> None:
    """Real: MarkSuspending changes only a RUNNING actor, then CallAteletSuspend finds no
    worker: INTERNAL "internal server error: workflow failed at step CallAteletSuspend: actor is
    in SUSPENDING state but has no active worker" (workflow_suspend.go); it stays PAUSED."""
    await make_actor(stub, "p")
    await stub.ResumeActor(pb.ResumeActorRequest(actor_ref=ref("p")))
    await stub.PauseActor(pb.PauseActorRequest(actor_ref=ref("p")))
    error = await _error(stub.SuspendActor(pb.SuspendActorRequest(actor_ref=ref("p"))))
    assert (error.code(), error.details()) == (
        C.INTERNAL,
        "internal server error: workflow failed at step CallAteletSuspend: actor is in "
        "SUSPENDING state but has no active worker",
    )
    assert (await _get(stub, "p")).status == S.STATUS_PAUSED
    await stub.ResumeActor(pb.ResumeActorRequest(actor_ref=ref("p")))
    await stub.SuspendActor(pb.SuspendActorRequest(actor_ref=ref("p")))


async def test_pause_of_a_suspended_actor_is_internal(stub: Any) -> None:
    """Real: INTERNAL "internal server error: workflow failed at step CallAteletPause: actor is
    in PAUSING state but has no active worker" (workflow_pause.go); it stays SUSPENDED."""
    await make_actor(stub, "s")
    error = await _error(stub.PauseActor(pb.PauseActorRequest(actor_ref=ref("s"))))
    assert (error.code(), error.details()) == (
        C.INTERNAL,
        "internal server error: workflow failed at step CallAteletPause: actor is in PAUSING "
        "state but has no active worker",
    )
    assert (await _get(stub, "s")).status == S.STATUS_SUSPENDED


@pytest.mark.parametrize(
    ("namespace", "name", "message"),
    [
        ("", "sandbox", "actor_template_namespace is required"),
        ("local", "", "actor_template_name is required"),
        ("", "", "actor_template_namespace is required"),
    ],
)
async def test_create_actor_without_a_template_is_invalid_argument(
    stub: Any, namespace: str, name: str, message: str
) -> None:
    """Real: validateCreateActorRequest checks the template's namespace, then its name, before
    anything else: INVALID_ARGUMENT "... is required" (create_actor.go)."""
    await stub.CreateAtespace(pb.CreateAtespaceRequest(name="t"))
    request = pb.CreateActorRequest(
        actor_ref=ref("a"), actor_template_namespace=namespace, actor_template_name=name
    )
    error = await _error(stub.CreateActor(request))
    assert (error.code(), error.details()) == (C.INVALID_ARGUMENT, message)


@pytest.mark.parametrize("name", ["Not_A_Label", "a.b", "x-", "a" * 64, "a\n"])
async def test_names_that_are_not_labels_are_not_found(stub: Any, name: str) -> None:
    """Real: Get, Resume, Suspend, Pause and Update check only that the name is not empty
    (get_actor.go, resume_actor.go, suspend_actor.go, pause_actor.go, update_actor.go), so any
    other name is looked up and NOT_FOUND "Actor <name> not found"."""
    await stub.CreateAtespace(pb.CreateAtespaceRequest(name="t"))
    r = ref(name)
    for call in (
        lambda: stub.GetActor(pb.GetActorRequest(actor_ref=r)),
        lambda: stub.ResumeActor(pb.ResumeActorRequest(actor_ref=r)),
        lambda: stub.SuspendActor(pb.SuspendActorRequest(actor_ref=r)),
        lambda: stub.PauseActor(pb.PauseActorRequest(actor_ref=r)),
        lambda: stub.UpdateActor(pb.UpdateActorRequest(actor_ref=r)),
    ):
        error = await _error(call())
        assert (error.code(), error.details()) == (C.NOT_FOUND, f"Actor {name} not found")


async def test_delete_while_an_operation_is_in_flight_answers_by_state(
    stub: Any, backend: LocalBackend
) -> None:
    """Real: DeleteActor takes no lock (delete_actor.go): during a resume it is
    FAILED_PRECONDITION by the RESUMING status, never ABORTED, and a SUSPENDED actor whose id is
    locked by a workflow in another atespace is deleted (OK)."""
    await workload_actor(stub, backend, "busy", late_workload(2))
    await make_actor(stub, "busy", atespace="other")
    resume, _ = await _resuming(stub, "busy")
    error = await _error(stub.DeleteActor(pb.DeleteActorRequest(actor_ref=ref("busy"))))
    assert (error.code(), error.details()) == (
        C.FAILED_PRECONDITION,
        "Actor busy is not suspended (status: STATUS_RESUMING)",
    )
    await stub.DeleteActor(pb.DeleteActorRequest(actor_ref=ref("busy", "other")))
    assert (await resume).actor.status == S.STATUS_RUNNING
    await stub.SuspendActor(pb.SuspendActorRequest(actor_ref=ref("busy")))


async def test_a_bad_page_token_is_internal(stub: Any) -> None:
    """Real: the token's base64 decode error comes back unmapped: INTERNAL "internal server
    error: while listing actors in db: invalid page token: illegal base64 data at input byte 0"
    (store/ateredis/ateredis.go, list_actors.go)."""
    error = await _error(stub.ListActors(pb.ListActorsRequest(page_token="!!!!")))
    assert (error.code(), error.details()) == (
        C.INTERNAL,
        "internal server error: while listing actors in db: invalid page token: illegal base64 "
        "data at input byte 0",
    )


async def test_every_answer_carries_the_elapsed_trailer(stub: Any) -> None:
    """Real: the interceptor sets x-server-elapsed-us before it returns, errors included; the
    real client reads it off ALREADY_EXISTS (internal/ateinterceptors/ateinterceptors.go)."""
    ok = stub.CreateAtespace(pb.CreateAtespaceRequest(name="t"))
    await ok
    duplicate = stub.CreateAtespace(pb.CreateAtespaceRequest(name="t"))
    assert await status_code(duplicate) == C.ALREADY_EXISTS
    missing = stub.GetActor(pb.GetActorRequest(actor_ref=ref("nobody")))
    assert await status_code(missing) == C.NOT_FOUND
    for call in (ok, duplicate, missing):
        trailers = dict(await call.trailing_metadata())
        assert re.fullmatch(r"\d+", trailers["x-server-elapsed-us"]), trailers


async def test_messages_are_the_real_ones(stub: Any, backend: LocalBackend) -> None:
    """Real: every status text the handlers and workflows return, word for word (create_actor.go,
    get_actor.go, resume_actor.go, suspend_actor.go, pause_actor.go, update_actor.go,
    delete_actor.go, list_actors.go, *_atespace.go, workflow_resume.go, internal/resources/
    actor.go, and k8s.io/apimachinery v0.36 for label keys and values)."""
    await make_actor(stub, "a1")
    await make_actor(stub, "run")
    await stub.ResumeActor(pb.ResumeActorRequest(actor_ref=ref("run")))
    await stub.CreateActor(
        pb.CreateActorRequest(
            actor_ref=ref("picky"),
            actor_template_namespace="local",
            actor_template_name="sandbox",
            worker_selector=pb.Selector(match_labels={"zone": "mars"}),
        )
    )

    def create(
        name: str = "n1", atespace: str = "t", template: str = "sandbox", **labels: str
    ) -> Any:
        return stub.CreateActor(
            pb.CreateActorRequest(
                actor_ref=ref(name, atespace),
                actor_template_namespace="local",
                actor_template_name=template,
                worker_selector=pb.Selector(match_labels=labels),
            )
        )

    key_rule = (
        "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and "
        "end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex "
        "used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
    )
    value_rule = (
        "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' "
        "or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or "
        "'my_value',  or '12345', regex used for validation is "
        "'(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
    )
    eleven = {f"k{i}": "v" for i in range(11)}
    cases: list[tuple[Any, grpc.StatusCode, str]] = [
        (
            stub.GetActor(pb.GetActorRequest(actor_ref=ref(""))),
            C.INVALID_ARGUMENT,
            "id is required",
        ),
        (
            stub.GetActor(pb.GetActorRequest(actor_ref=ref("a1", ""))),
            C.INVALID_ARGUMENT,
            "atespace is required",
        ),
        (
            stub.ResumeActor(pb.ResumeActorRequest(actor_ref=ref(""))),
            C.INVALID_ARGUMENT,
            "id is required",
        ),
        (
            stub.SuspendActor(pb.SuspendActorRequest(actor_ref=ref("a1", ""))),
            C.INVALID_ARGUMENT,
            "atespace is required",
        ),
        (
            stub.PauseActor(pb.PauseActorRequest(actor_ref=ref(""))),
            C.INVALID_ARGUMENT,
            "id is required",
        ),
        (
            stub.UpdateActor(pb.UpdateActorRequest(actor_ref=ref(""))),
            C.INVALID_ARGUMENT,
            "actor_id is required",
        ),
        (
            stub.UpdateActor(pb.UpdateActorRequest(actor_ref=ref("a1", "Bad"))),
            C.INVALID_ARGUMENT,
            f"invalid atespace: {_LABEL_RULE}",
        ),
        (
            stub.DeleteActor(pb.DeleteActorRequest(actor_ref=ref("Bad"))),
            C.INVALID_ARGUMENT,
            f"invalid actor_id: {_LABEL_RULE}",
        ),
        (
            stub.DeleteActor(pb.DeleteActorRequest(actor_ref=ref("a" * 64))),
            C.INVALID_ARGUMENT,
            "invalid actor_id: must be no more than 63 characters",
        ),
        (
            stub.DeleteActor(pb.DeleteActorRequest(actor_ref=ref("a1", ""))),
            C.INVALID_ARGUMENT,
            "atespace is required",
        ),
        (
            stub.DeleteActor(pb.DeleteActorRequest(actor_ref=ref("run"))),
            C.FAILED_PRECONDITION,
            "Actor run is not suspended (status: STATUS_RUNNING)",
        ),
        (
            stub.DeleteActor(pb.DeleteActorRequest(actor_ref=ref("zz"))),
            C.NOT_FOUND,
            "Actor zz not found",
        ),
        (create(""), C.INVALID_ARGUMENT, "actor_id is required"),
        (create("N1"), C.INVALID_ARGUMENT, f"invalid actor_id: {_LABEL_RULE}"),
        (create(atespace=""), C.INVALID_ARGUMENT, "atespace is required"),
        (
            create(atespace="a" * 64),
            C.INVALID_ARGUMENT,
            "invalid atespace: must be no more than 63 characters",
        ),
        (
            create(**eleven),
            C.INVALID_ARGUMENT,
            "worker_selector has 11 match_labels entries, exceeding the limit of 10",
        ),
        (
            create(**{"bad key!": "v"}),
            C.INVALID_ARGUMENT,
            f'invalid worker_selector label key "bad key!": {key_rule}',
        ),
        (
            create(k="v v"),
            C.INVALID_ARGUMENT,
            f'invalid worker_selector label value "v v" for key "k": {value_rule}',
        ),
        (create(template="nope"), C.FAILED_PRECONDITION, "ActorTemplate local/nope not found"),
        (create(atespace="nope"), C.FAILED_PRECONDITION, "Atespace nope not found"),
        (create("a1"), C.ALREADY_EXISTS, "Actor a1 already exists"),
        (
            stub.CreateAtespace(pb.CreateAtespaceRequest(name="")),
            C.INVALID_ARGUMENT,
            "name is required",
        ),
        (
            stub.CreateAtespace(pb.CreateAtespaceRequest(name="Bad")),
            C.INVALID_ARGUMENT,
            f"invalid atespace: {_LABEL_RULE}",
        ),
        (
            stub.CreateAtespace(pb.CreateAtespaceRequest(name="t")),
            C.ALREADY_EXISTS,
            "Atespace t already exists",
        ),
        (
            stub.GetAtespace(pb.GetAtespaceRequest(name="nope")),
            C.NOT_FOUND,
            "Atespace nope not found",
        ),
        (
            stub.DeleteAtespace(pb.DeleteAtespaceRequest(name="t")),
            C.FAILED_PRECONDITION,
            "Atespace t is not empty",
        ),
        (
            stub.ListActors(pb.ListActorsRequest(page_size=-1)),
            C.INVALID_ARGUMENT,
            "page_size cannot be negative",
        ),
        (
            stub.ListActors(pb.ListActorsRequest(page_size=1001)),
            C.INVALID_ARGUMENT,
            "page_size 1001 exceeds maximum page size 1000",
        ),
        (
            stub.ListActors(pb.ListActorsRequest(atespace="Bad")),
            C.INVALID_ARGUMENT,
            f"invalid atespace: {_LABEL_RULE}",
        ),
        (
            stub.ResumeActor(pb.ResumeActorRequest(actor_ref=ref("picky"))),
            C.FAILED_PRECONDITION,
            "no worker pool matches the template's sandboxClass and the template/actor selectors",
        ),
    ]
    for call, code, message in cases:
        error = await _error(call)
        assert (error.code(), error.details()) == (code, message)
    await stub.SuspendActor(pb.SuspendActorRequest(actor_ref=ref("run")))


async def test_the_lock_is_the_actor_id_across_atespaces(stub: Any, backend: LocalBackend) -> None:
    """Real: the workflow lock is `lock:actor:<id>`, without the atespace (workflow.go), so a
    resume of t/x makes ResumeActor of u/x ABORTED while it runs."""
    await workload_actor(stub, backend, "x", late_workload(2))
    await make_actor(stub, "x", atespace="u")
    resume, _ = await _resuming(stub, "x")
    error = await _error(stub.ResumeActor(pb.ResumeActorRequest(actor_ref=ref("x", "u"))))
    assert (error.code(), error.details()) == (
        C.ABORTED,
        "another operation is in progress for this actor",
    )
    await resume
    assert (
        await stub.ResumeActor(pb.ResumeActorRequest(actor_ref=ref("x", "u")))
    ).actor.status == S.STATUS_RUNNING
    for atespace in ("t", "u"):
        await stub.SuspendActor(pb.SuspendActorRequest(actor_ref=ref("x", atespace)))


# ---------------------------------------------------------------------------- §3 listing


async def test_golden_actors_are_listed(stub: Any, backend: LocalBackend) -> None:
    """Real: the template controller keeps one golden actor per template, named by a random
    UUID, in the reserved `ate-golden` atespace (internal/resources/actor.go, cmd/atecontroller/
    internal/controllers/actortemplate_controller.go); a listing of every atespace shows it,
    ListAtespaces shows `ate-golden`, and creating that atespace is ALREADY_EXISTS."""
    await register_template(backend, "second", late_workload(0))
    atespaces = [a.name for a in (await stub.ListAtespaces(pb.ListAtespacesRequest())).atespaces]
    assert "ate-golden" in atespaces
    error = await _error(stub.CreateAtespace(pb.CreateAtespaceRequest(name="ate-golden")))
    assert (error.code(), error.details()) == (
        C.ALREADY_EXISTS,
        "Atespace ate-golden already exists",
    )
    listed = (await stub.ListActors(pb.ListActorsRequest())).actors
    golden = [a for a in listed if a.atespace == "ate-golden"]
    assert sorted(a.actor_template_name for a in golden) == ["sandbox", "second"]
    for actor in golden:
        assert str(uuid.UUID(actor.actor_id)) == actor.actor_id
        assert actor.status == S.STATUS_SUSPENDED
        assert actor.actor_template_namespace == "local"
        assert backend.plane is not None
        key = f"local/{actor.actor_template_name}"
        if backend.plane.golden(key) is not None:  # gVisor: the template's golden snapshot
            assert actor.latest_snapshot_info.type == pb.SNAPSHOT_TYPE_EXTERNAL
    only = (await stub.ListActors(pb.ListActorsRequest(atespace="ate-golden"))).actors
    assert {a.actor_id for a in only} == {a.actor_id for a in golden}


class _ScanLikeControl(pb_grpc.ControlServicer):
    """Pages as a Redis SCAN may: a short page, an empty one, then the rest, tokens between."""

    PAGES = {"": (["a"], "t1"), "t1": ([], "t2"), "t2": (["b", "c"], "")}

    async def ListActors(self, request: Any, context: Any) -> pb.ListActorsResponse:
        names, token = self.PAGES[request.page_token]
        return pb.ListActorsResponse(
            actors=[pb.Actor(actor_id=n, atespace=request.atespace) for n in names],
            next_page_token=token,
        )


@pytest.fixture
async def scan_like_api() -> AsyncIterator[str]:
    server = grpc.aio.server()
    pb_grpc.add_ControlServicer_to_server(_ScanLikeControl(), server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield f"127.0.0.1:{port}"
    await server.stop(None)


async def test_the_provider_pages_until_the_token_is_empty(scan_like_api: str) -> None:
    """Real: ListActors pages a Redis SCAN with soft guarantees (store/ateredis/ateredis.go): a
    page may be short or empty while more remain; only an empty next_page_token ends it."""
    conn = ConnectionConfig(api=scan_like_api, router="http://127.0.0.1:1", tls={"plaintext": True})  # type: ignore[arg-type]
    channel = grpc.aio.insecure_channel(scan_like_api)
    try:
        actors = await ControlClient(channel, conn).list_actors("t")
    finally:
        await channel.close()
    assert [a.actor_id for a in actors] == ["a", "b", "c"]
