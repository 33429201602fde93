"""The router: Host routing, auto-resume, 404/503/504 like atenet, streaming both ways."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import resource
import sys
from typing import Any

import aiohttp
import grpc
import pytest
from local_helpers import RUNTIMES, host, make_actor, ref

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.local import LocalBackend
from gym_substrate.local.router import parse_host

S = pb.Actor.Status


def test_parse_host() -> None:
    domain = "actors.resources.substrate.ate.dev"
    assert parse_host(f"a1.t.{domain}") == ("a1", "t")
    assert parse_host(f"a1.t.{domain}:8080") == ("a1", "t")
    assert parse_host(f"a1.t.{domain}.") == ("a1", "t")
    # case-sensitive, as atenet's parser (extproc_in.go): upper case names no actor
    assert isinstance(parse_host(f"A1.t.{domain}"), str)
    assert isinstance(parse_host(f"a1.t.{domain.upper()}"), str)
    assert isinstance(parse_host(f"a1:t:{domain}"), str)  # too many colons for host:port
    assert isinstance(parse_host(f"a_1.t.{domain}"), str)
    assert isinstance(parse_host(f"x.a1.t.{domain}"), str)
    assert isinstance(parse_host("example.com"), str)


async def _readyz(http: Any, backend: LocalBackend, headers: dict[str, str]) -> tuple[int, Any]:
    async with http.get(f"{backend.router_url}/readyz", headers=headers) as response:
        if response.content_type == "application/json":
            return response.status, await response.json()
        return response.status, await response.text()


@pytest.mark.parametrize("runtime_name", RUNTIMES)
async def test_host_routing_and_auto_resume(stub: Any, backend: LocalBackend, http: Any) -> None:
    await make_actor(stub, "r1")
    await make_actor(stub, "r2")
    # r1 is SUSPENDED: the first request resumes it, like Substrate's router
    status, body = await _readyz(http, backend, host("r1"))
    assert status == 200
    assert body["actor_id"] == "r1"
    actor = (await stub.GetActor(pb.GetActorRequest(actor_ref=ref("r1")))).actor
    assert actor.status == S.STATUS_RUNNING
    await stub.ResumeActor(pb.ResumeActorRequest(actor_ref=ref("r2")))
    port_suffixed = {"Host": host("r2")["Host"] + ":80"}
    status, body = await _readyz(http, backend, port_suffixed)
    assert status == 200
    assert body["actor_id"] == "r2"
    # a paused actor resumes on demand too, keeping its process
    await stub.PauseActor(pb.PauseActorRequest(actor_ref=ref("r1")))
    status, body2 = await _readyz(http, backend, host("r1"))
    assert status == 200
    assert body2["actor_id"] == "r1"
    for name in ("r1", "r2"):
        await stub.SuspendActor(pb.SuspendActorRequest(actor_ref=ref(name)))


async def test_unknown_and_invalid_hosts(stub: Any, backend: LocalBackend, http: Any) -> None:
    await stub.CreateAtespace(pb.CreateAtespaceRequest(name="t"))
    status, text = await _readyz(http, backend, host("ghost"))
    assert (status, text) == (404, 'actor "ghost" not found')
    status, text = await _readyz(http, backend, {"Host": "example.com"})
    assert status == 404
    assert text.startswith('invalid host "example.com"')


@pytest.mark.parametrize("runtime_name", RUNTIMES)
@pytest.mark.parametrize("backend_options", [{"workers": 1, "router_timeout_s": 1.0}])
async def test_503_when_full_and_timeout(stub: Any, backend: LocalBackend, http: Any) -> None:
    await make_actor(stub, "full1")
    await make_actor(stub, "full2")
    await stub.ResumeActor(pb.ResumeActorRequest(actor_ref=ref("full1")))
    status, text = await _readyz(http, backend, host("full2"))
    assert status == 503
    assert text == 'actor "full2" unavailable: no free workers available'
    # the per-request limit (configured to 1 s here; 10 s by default, as in Substrate): the
    # agent would answer 200 after 4 s, so a 504 means the router cut the request
    async with http.post(
        f"{backend.router_url}/v1/exec?wait=5",
        json={"command": "sleep 4"},
        headers=host("full1"),
    ) as response:
        assert response.status == 504
        assert await response.text() == "upstream request timeout"
    await stub.SuspendActor(pb.SuspendActorRequest(actor_ref=ref("full1")))


@pytest.mark.parametrize("runtime_name", RUNTIMES)
async def test_streams_100_mib_download_and_upload(
    stub: Any, backend: LocalBackend, http: aiohttp.ClientSession
) -> None:
    await make_actor(stub, "big")
    await stub.ResumeActor(pb.ResumeActorRequest(actor_ref=ref("big")))
    url = backend.router_url
    async with http.post(
        f"{url}/v1/exec?wait=8",
        json={"command": "head -c 104857600 /dev/urandom > big.bin && sha256sum big.bin && pwd"},
        headers=host("big"),
    ) as response:
        body = await response.json()
    assert body["exit_code"] == 0, body
    expected, _ = body["stdout"].split()[0], None
    folder = body["stdout"].split("\n")[1].strip()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    digest = hashlib.sha256()
    size = 0
    async with http.get(
        f"{url}/v1/files", params={"path": f"{folder}/big.bin"}, headers=host("big")
    ) as response:
        assert response.status == 200
        assert response.headers["Content-Length"] == str(100 * 2**20)
        async for chunk in response.content.iter_chunked(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert size == 100 * 2**20
    assert digest.hexdigest() == expected
    assert grown_mib < 48, f"the router buffered the body (+{grown_mib:.0f} MiB peak RSS)"

    # upload: a streamed 32 MiB request body arrives intact
    payload = bytes(range(256)) * (32 * 4096)

    async def body_chunks() -> Any:
        for start in range(0, len(payload), 1 << 20):
            yield payload[start : start + (1 << 20)]

    async with http.put(
        f"{url}/v1/files",
        params={"path": f"{folder}/up.bin"},
        data=body_chunks(),
        headers=host("big"),
    ) as response:
        assert response.status == 200, await response.text()
        assert (await response.json())["sha256"] == hashlib.sha256(payload).hexdigest()
    await stub.SuspendActor(pb.SuspendActorRequest(actor_ref=ref("big")))


async def test_admin_endpoints(backend: LocalBackend, http: Any) -> None:
    async with http.get(f"{backend.admin_url}/readyz") as response:
        assert response.status == 200
    async with http.get(f"{backend.admin_url}/nothing") as response:
        assert response.status == 404
        assert "GET /_local/status" in (await response.json())["error"]["message"]
    async with http.post(f"{backend.admin_url}/_local/templates", data=b"spec: [") as response:
        assert response.status == 400
        error = (await response.json())["error"]
        assert error["code"] == "bad_request"
        assert "not valid YAML" in error["message"]


@pytest.mark.parametrize("runtime_name", RUNTIMES)
async def test_dead_sandbox_stays_running_and_answers_503(
    stub: Any, backend: LocalBackend, http: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Real: a workload that died leaves its actor RUNNING at its dead address; requests get
    503 "upstream connect error" until the worker pod is deleted (syncer.go). Nothing restarts
    it behind the user's back; SuspendActor brings it back to SUSPENDED here."""
    await make_actor(stub, "dies")
    first = (await stub.ResumeActor(pb.ResumeActorRequest(actor_ref=ref("dies")))).actor
    assert backend.plane is not None
    record = backend.plane.lookup("t", "dies")
    assert record is not None
    assert backend.runtime is not None
    await backend.runtime.stop(record.handle)  # the sandbox dies behind the control plane's back
    for _ in range(2):
        async with http.get(f"{backend.router_url}/readyz", headers=host("dies")) as response:
            assert response.status == 503
            assert (await response.text()).startswith("upstream connect error")
    again = (await stub.GetActor(pb.GetActorRequest(actor_ref=ref("dies")))).actor
    assert (again.status, again.version, again.ateom_pod_ip) == (
        S.STATUS_RUNNING,
        first.version,
        first.ateom_pod_ip,
    )
    assert caplog.text.count("its workload at") == 1  # reported once, not per request
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.SuspendActor(pb.SuspendActorRequest(actor_ref=ref("dies")))
    assert info.value.code() == grpc.StatusCode.INTERNAL
    gone = (await stub.GetActor(pb.GetActorRequest(actor_ref=ref("dies")))).actor
    assert gone.status == S.STATUS_SUSPENDED
    status, body = await _readyz(http, backend, host("dies"))  # resumed on demand
    assert (status, body["actor_id"]) == (200, "dies")
    await stub.SuspendActor(pb.SuspendActorRequest(actor_ref=ref("dies")))


async def test_response_headers_pass_through(stub: Any, backend: LocalBackend, http: Any) -> None:
    await make_actor(stub, "hdr")
    async with http.post(
        f"{backend.router_url}/v1/exec?wait=8", json={"command": "echo x"}, headers=host("hdr")
    ) as response:
        assert response.status == 200
        assert response.headers.getall("Content-Type") == ["application/json"]
        assert int(response.headers["Content-Length"]) == len(await response.read())
    async with http.get(
        f"{backend.router_url}/v1/stat", params={"path": "relative"}, headers=host("hdr")
    ) as response:
        assert response.status == 400  # the agent's own error passes through unchanged
        assert (await response.json())["error"]["code"] == "bad_request"
    async with http.post(
        f"{backend.router_url}/v1/exec?wait=8", json={"command": "pwd"}, headers=host("hdr")
    ) as response:
        folder = (await response.json())["stdout"].strip()
    path = f"{folder.rstrip('/')}/h é+%.bin"  # quoting survives the router
    for size in (10, 200_000):  # below and above the router's small-body path
        async with http.put(
            f"{backend.router_url}/v1/files",
            params={"path": path},
            data=b"z" * size,
            headers=host("hdr"),
        ) as response:
            assert response.status == 200
        async with http.head(
            f"{backend.router_url}/v1/files", params={"path": path}, headers=host("hdr")
        ) as response:
            assert response.status == 200
            assert response.headers["Content-Length"] == str(size)
        async with http.get(
            f"{backend.router_url}/v1/files",
            params={"path": path},
            headers={**host("hdr"), "Range": "bytes=2-5"},
        ) as response:
            assert response.status == 206
            assert await response.read() == b"zzzz"
    async with http.post(
        f"{backend.router_url}/v1/exec?wait=8", json={"command": "ls"}, headers=host("hdr")
    ) as response:
        assert "h é+%.bin" in (await response.json())["stdout"].splitlines()
    await stub.SuspendActor(pb.SuspendActorRequest(actor_ref=ref("hdr")))


async def test_request_during_an_explicit_resume_waits_for_it(
    stub: Any, backend: LocalBackend, http: Any
) -> None:
    assert backend.plane is not None
    default = backend.plane.templates["local/sandbox"]
    # --host/--port stay in argv, where the process runtime points them at the worker's address
    agent = (sys.executable, "-m", "sandbox_agent", "--host", "0.0.0.0", "--port", "80")
    slow = dataclasses.replace(
        default, name="slow", command=("/bin/sh", "-c", 'sleep 1; exec "$0" "$@"', *agent)
    )
    await backend.plane.add_template(slow)
    await stub.CreateAtespace(pb.CreateAtespaceRequest(name="t"))
    await stub.CreateActor(
        pb.CreateActorRequest(
            actor_ref=ref("late"), actor_template_namespace="local", actor_template_name="slow"
        )
    )
    resume = asyncio.ensure_future(stub.ResumeActor(pb.ResumeActorRequest(actor_ref=ref("late"))))
    for _ in range(400):  # until the resume is in flight
        actor = (await stub.GetActor(pb.GetActorRequest(actor_ref=ref("late")))).actor
        if actor.status == S.STATUS_RESUMING:
            break
        await asyncio.sleep(0.005)
    assert actor.status == S.STATUS_RESUMING
    status, body = await _readyz(http, backend, host("late"))  # ABORTED inside: it waits
    assert status == 200
    assert body["actor_id"] == "late"
    running = (await resume).actor
    assert running.status == S.STATUS_RUNNING
    after = (await stub.GetActor(pb.GetActorRequest(actor_ref=ref("late")))).actor
    assert after.version == running.version  # one resume, not two
    await stub.SuspendActor(pb.SuspendActorRequest(actor_ref=ref("late")))


async def test_resume_still_aborted_after_retries_is_500_like_atenet(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """atenet retries ABORTED, then maps it like any other error: 500 (reference §4.3).

    Over real gRPC, to an API server whose every ResumeActor is ABORTED, as the router's
    resumer calls ateapi (real: cmd/atenet/internal/router/resumer.go).
    """
    from gym_substrate.ateapi import ateapi_pb2_grpc as pb_grpc
    from gym_substrate.local import router as router_mod
    from gym_substrate.local.metrics import Metrics
    from gym_substrate.local.resume_client import ResumeClient

    class AlwaysBusy(pb_grpc.ControlServicer):  # type: ignore[misc]
        calls = 0

        async def ResumeActor(self, request: Any, context: Any) -> None:  # noqa: N802
            AlwaysBusy.calls += 1
            await context.abort(grpc.StatusCode.ABORTED, "another operation is in progress")

    server = grpc.aio.server()
    pb_grpc.add_ControlServicer_to_server(AlwaysBusy(), server)
    api_port = server.add_insecure_port("127.0.0.1:0")
    await server.start()

    class NoActors:
        sandbox_listeners: list[Any] = []

    monkeypatch.setattr(router_mod, "_BACKOFF_FIRST_S", 0.01)  # atenet's: 200 ms
    plane: Any = NoActors()
    router = router_mod.Router(plane, ResumeClient(f"127.0.0.1:{api_port}"), Metrics())
    port = await router.start("127.0.0.1", 0)
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{port}/readyz", headers=host("busy")) as response,
        ):
            assert (response.status, await response.text()) == (
                500,
                'error resuming actor "busy"',
            )
    finally:
        await router.close()
        await server.stop(None)
    assert AlwaysBusy.calls == 7  # atenet's resumer tries 7 times (resumer.go)
