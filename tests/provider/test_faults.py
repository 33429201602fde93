"""Fault injection: each injected gRPC code or HTTP failure yields the documented result.

Faults come from the proxies in conftest (a forwarding gRPC server and an aiohttp reverse proxy in
front of the router), so the provider, the backend and the agent are all real.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import grpc
import pytest

from gym_substrate import SubstrateCreateError, SubstrateCreateVerificationError, TransferError
from gym_substrate.nemo.types import SandboxSpec, SandboxStatus

from .conftest import (
    GrpcFault,
    HttpFault,
    Stack,
    make_stack,
    sandbox_marker,
    sandbox_runs,
)

TRANSIENT = [
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.DEADLINE_EXCEEDED,
]
# No free capacity, as ateapi answers it (pinned by tests/local/test_fidelity_control.py).
NO_ROOM = (grpc.StatusCode.RESOURCE_EXHAUSTED, "no worker has room for the actor")


@pytest.mark.parametrize("code", TRANSIENT, ids=lambda c: c.name)
async def test_create_retries_transient_codes_with_the_same_actor_id(
    stack: Stack, code: grpc.StatusCode
) -> None:
    g = stack.grpc_proxy
    g.inject("CreateAtespace", code)
    g.inject("CreateActor", code, after_forward=True)  # landed, but the reply was lost
    g.inject("ResumeActor", code, times=2)
    p = stack.provider()
    handle = await p.create(SandboxSpec())
    assert g.calls["CreateAtespace"] == 2
    assert g.calls["CreateActor"] == 2  # retried with the same id: ALREADY_EXISTS -> GetActor
    assert g.calls["GetActor"] >= 1
    assert g.calls["ResumeActor"] == 3
    assert await stack.actors() == [handle.sandbox_id]
    await p.close(handle)
    await p.aclose()


async def test_create_actor_replies_lost_until_the_deadline_leaks_nothing(stack: Stack) -> None:
    # Every CreateActor lands but its reply is lost; retries then hit ALREADY_EXISTS -> GetActor,
    # which is failed too, until the retry deadline. The actor exists: it must be cleaned up.
    stack.grpc_proxy.inject(
        "CreateActor", grpc.StatusCode.UNAVAILABLE, after_forward=True, times=1000
    )
    stack.grpc_proxy.inject("GetActor", grpc.StatusCode.UNAVAILABLE, times=1000)
    p = stack.provider(create={"retry": {"initial": 0.01, "maximum": 0.05, "deadline": 0.5}})
    task = asyncio.ensure_future(p.create(SandboxSpec()))
    await asyncio.sleep(0.8)
    stack.grpc_proxy.faults.clear()  # the control plane recovers while create() cleans up
    lost = r"CreateActor gym-\w+ did not succeed within 0\.5 s"
    with pytest.raises(SubstrateCreateError, match=lost):
        await task
    assert await stack.actors() == []
    events = [
        line.split('"event": "')[1].split('"')[0]
        for line in (stack.tmp / "ledger.jsonl").read_text().splitlines()
    ]
    assert events == ["created", "deleted"]
    await p.aclose()


async def test_no_free_capacity_is_waited_out_until_ready(stack: Stack) -> None:
    stack.grpc_proxy.inject("CreateActor", *NO_ROOM, times=2)
    stack.grpc_proxy.inject("ResumeActor", *NO_ROOM, times=5)
    p = stack.provider()
    handle = await p.create(SandboxSpec())
    assert stack.grpc_proxy.calls["CreateActor"] == 3
    assert stack.grpc_proxy.calls["ResumeActor"] == 6
    await p.close(handle)
    await p.aclose()


async def test_internal_on_resume_fails_create_and_cleans_up(stack: Stack) -> None:
    stack.grpc_proxy.inject(
        "ResumeActor", grpc.StatusCode.INTERNAL, "workflow failed at step CallAteletRestore"
    )
    p = stack.provider()
    with pytest.raises(SubstrateCreateError, match="CallAteletRestore") as info:
        await p.create(SandboxSpec())
    assert info.value.__cause__ is not None
    assert await stack.actors() == []
    assert stack.grpc_proxy.calls["DeleteActor"] == 1
    await p.aclose()


async def test_resume_that_never_gets_capacity_fails_create_saying_so(stack: Stack) -> None:
    stack.grpc_proxy.inject("ResumeActor", *NO_ROOM, times=10_000)
    p = stack.provider(create={"ready_timeout_s": 0.5})
    with pytest.raises(SubstrateCreateError, match="no free capacity") as info:
        await p.create(SandboxSpec())
    assert not isinstance(info.value, SubstrateCreateVerificationError)
    stack.grpc_proxy.faults.clear()
    assert await stack.actors() == []
    await p.aclose()


@pytest.mark.parametrize(
    ("kind", "method", "path"),
    [
        ("reset_after", "POST", "/v1/exec"),
        ("reset_before", "POST", "/v1/exec"),
        ("reset_after", "GET", "/v1/exec/"),
        ("reset_before", "GET", "/v1/exec/"),
    ],
    ids=["reset-after-submit", "reset-before-submit", "reset-after-poll", "reset-before-poll"],
)
async def test_connection_resets_never_run_a_command_twice(
    stack: Stack, tmp_path: Path, kind: str, method: str, path: str
) -> None:
    p = stack.provider(exec={"poll_wait_s": 0.2})
    handle = await p.create(SandboxSpec())
    marker = sandbox_marker()
    stack.http_proxy.inject(kind, method=method, path_prefix=path, times=2)
    r = await p.exec(handle, f"echo run >> {marker}; sleep 0.6; echo done")
    assert (r.return_code, r.stdout) == (0, "done\n")
    assert await sandbox_runs(p, handle, marker, tmp_path) == 1
    await p.close(handle)
    await p.aclose()


@pytest.mark.parametrize("status", [502, 504])
async def test_router_gateway_errors_are_retried(stack: Stack, tmp_path: Path, status: int) -> None:
    p = stack.provider()
    handle = await p.create(SandboxSpec())
    marker = sandbox_marker()
    stack.http_proxy.inject("status", status=status, method="POST", path_prefix="/v1/exec", times=3)
    r = await p.exec(handle, f"echo run >> {marker}; echo ok")
    assert (r.return_code, r.stdout) == (0, "ok\n")
    assert await sandbox_runs(p, handle, marker, tmp_path) == 1
    await p.close(handle)
    await p.aclose()


async def test_router_503_resumes_over_grpc_then_resubmits(stack: Stack, tmp_path: Path) -> None:
    p = stack.provider()
    handle = await p.create(SandboxSpec())
    resumes = stack.grpc_proxy.calls["ResumeActor"]
    marker = sandbox_marker()
    stack.http_proxy.inject("status", status=503, method="POST", path_prefix="/v1/exec")
    r = await p.exec(handle, f"echo run >> {marker}; echo ok")
    assert (r.return_code, r.stdout) == (0, "ok\n")
    assert stack.grpc_proxy.calls["ResumeActor"] == resumes + 1
    assert await sandbox_runs(p, handle, marker, tmp_path) == 1
    await p.close(handle)
    await p.aclose()


async def test_actor_deleted_behind_the_providers_back(stack: Stack) -> None:
    p, other = stack.provider(), stack.provider()
    handle = await p.create(SandboxSpec())
    await other.delete_actor(handle.raw.actor_id)  # someone else deletes it
    r = await p.exec(handle, "echo hi")
    assert (r.return_code, r.error_type) == (125, "sandbox")
    assert r.stderr
    assert "not found" in r.stderr.lower()
    assert await p.status(handle) == SandboxStatus.STOPPED
    await p.close(handle)  # NOT_FOUND is success
    for prov in (p, other):
        await prov.aclose()


async def test_status_maps_control_plane_errors_to_unknown(stack: Stack) -> None:
    """A control plane that stays UNAVAILABLE past connection.connect_timeout_s, or refuses the
    call, is UNKNOWN; one UNAVAILABLE (a restart) is looked through."""
    p = stack.provider(connection={"connect_timeout_s": 0.5})
    handle = await p.create(SandboxSpec())
    stack.grpc_proxy.inject("GetActor", grpc.StatusCode.UNAVAILABLE)
    assert await p.status(handle) == SandboxStatus.RUNNING
    assert stack.grpc_proxy.calls["GetActor"] == 2
    stack.grpc_proxy.inject("GetActor", grpc.StatusCode.INTERNAL, "boom")
    assert await p.status(handle) == SandboxStatus.UNKNOWN
    stack.grpc_proxy.inject("GetActor", grpc.StatusCode.UNAVAILABLE, times=10_000)
    assert await p.status(handle) == SandboxStatus.UNKNOWN
    stack.grpc_proxy.faults["GetActor"].clear()
    await p.close(handle)
    await p.aclose()


async def test_close_retries_transient_errors_of_its_one_delete(stack: Stack) -> None:
    p = stack.provider()
    handle = await p.create(SandboxSpec())
    stack.grpc_proxy.inject("DeleteActor", grpc.StatusCode.ABORTED, times=2)
    stack.grpc_proxy.inject("DeleteActor", grpc.StatusCode.UNAVAILABLE, after_forward=True)
    await p.close(handle)  # the last one landed, its reply was lost: NOT_FOUND is done
    assert stack.grpc_proxy.calls["DeleteActor"] == 4
    assert stack.grpc_proxy.calls["SuspendActor"] == 0
    assert await stack.actors() == []
    await p.aclose()


async def test_200_rollouts_with_random_faults_leak_nothing_and_never_double_run(
    tmp_path: Path,
) -> None:
    rng = random.Random(7)
    retryable = [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ABORTED]

    def grpc_fault(method: str) -> GrpcFault | None:
        if method in ("ListActors", "GetActor") or rng.random() > 0.08:
            return None
        return GrpcFault(rng.choice(retryable), "injected", after_forward=rng.random() < 0.5)

    def http_fault(method: str, path: str) -> HttpFault | None:
        if path == "/readyz" or rng.random() > 0.08:
            return None
        kind = rng.choice(["reset_before", "reset_after", "status"])
        return HttpFault(kind, status=rng.choice([502, 503, 504]))

    async with make_stack(tmp_path, workers=8) as stack:
        stack.grpc_proxy.random_fault = grpc_fault
        stack.http_proxy.random_fault = http_fault
        provider = stack.provider(exec={"poll_wait_s": 1})
        failures: list[str] = []
        runs: list[int] = []

        async def rollout(i: int) -> None:
            try:
                h = await provider.create(SandboxSpec())
            except SubstrateCreateError as exc:  # allowed, but must not leak
                failures.append(f"create {i}: {exc}")
                return
            marker = sandbox_marker()
            try:
                r = await provider.exec(h, f"echo x >> {marker}; echo {i}")
                assert (r.return_code, r.stdout) == (0, f"{i}\n"), r
                runs.append(await sandbox_runs(provider, h, marker, tmp_path))
            finally:
                await provider.close(h)

        sem = asyncio.Semaphore(8)

        async def limited(i: int) -> None:
            async with sem:
                await rollout(i)

        await asyncio.wait_for(asyncio.gather(*(limited(i) for i in range(200))), 240)
        stack.grpc_proxy.random_fault = None
        stack.http_proxy.random_fault = None
        assert await stack.actors() == []
        assert max(runs) == 1, "a command ran twice"
        assert len(runs) + len(failures) == 200
        assert len(failures) <= 10, failures
        await provider.aclose()


@pytest.mark.parametrize("chunk", [1, 4], ids=["first-chunk", "final-chunk"])
async def test_upload_survives_a_lost_reply_to_any_chunk(
    stack: Stack, tmp_path: Path, chunk: int
) -> None:
    p = stack.provider(exec={"transfer_chunk_bytes": 64 * 1024})
    handle = await p.create(SandboxSpec())
    src = tmp_path / "src.bin"
    data = random.Random(3).randbytes(3 * 64 * 1024 + 100)  # four chunks
    src.write_bytes(data)
    puts = 0

    def fault(method: str, path: str) -> HttpFault | None:
        nonlocal puts
        if method != "PUT":
            return None
        puts += 1
        return HttpFault("reset_after") if puts == chunk else None

    dst = str(tmp_path / "dst.bin")
    stack.http_proxy.random_fault = fault
    await p.upload_file(handle, src, dst)
    stack.http_proxy.random_fault = None
    back = tmp_path / "back.bin"
    await p.download_file(handle, dst, back)
    assert back.read_bytes() == data
    await p.close(handle)
    await p.aclose()


async def test_upload_lost_final_reply_then_a_different_file_is_a_transfer_error(
    stack: Stack, tmp_path: Path
) -> None:
    p = stack.provider(exec={"transfer_chunk_bytes": 64 * 1024})
    handle = await p.create(SandboxSpec())
    src = tmp_path / "src.bin"
    src.write_bytes(random.Random(4).randbytes(64 * 1024 + 10))  # two chunks
    # the actor's working folder: the process runtime binds it at the same path, so the hook
    # below can replace the file behind the sandbox's back
    dst = Path((await p.exec(handle, "pwd")).stdout.strip()) / "dst.bin"
    puts = 0

    def fault(method: str, path: str) -> HttpFault | None:
        nonlocal puts
        if method != "PUT":
            return None
        puts += 1
        if puts == 3:  # the resent final chunk: someone replaced the file meanwhile
            dst.write_bytes(b"not ours")
        return HttpFault("reset_after") if puts == 2 else None

    stack.http_proxy.random_fault = fault
    with pytest.raises(TransferError, match="offset_mismatch"):
        await p.upload_file(handle, src, str(dst))
    stack.http_proxy.random_fault = None
    await p.close(handle)
    await p.aclose()
