"""The contract fuzzers (`gym-substrate fuzz`): they find what they claim to, and the local
backend's API and router give them no finding (issue 14: "0 server errors").

The contract is the current API's (ateapi.proto at 2179589f; codes from /work notes on
upstream-actors.md): no capacity is RESOURCE_EXHAUSTED `no free workers available`, a step that
crashes an actor answers INTERNAL `actor <ref> crashed: ...`, the local policy RPCs answer
UNIMPLEMENTED with their reason. The bounded runs here use fixed seeds; the closing note's full
runs are `gym-substrate fuzz --requests 2000 --seed 14`.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from click.testing import CliRunner
from local_helpers import create_actor, golden_tag, object_ref

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.cli import main
from gym_substrate.lab.tools.fuzz import Tally, delete_everything, fuzz_api, fuzz_router
from gym_substrate.lab.tools.fuzz.api import _classify
from gym_substrate.local import LocalBackend
from gym_substrate.local.servicer import POLICY_RPCS


async def test_api_fuzzing_finds_nothing_and_reaches_the_state_machine(
    backend: LocalBackend,
) -> None:
    async with grpc.aio.insecure_channel(backend.api_address) as channel:
        tally = await fuzz_api(channel, requests=400, seed=14)
        await delete_everything(channel)
    assert tally.total == 400
    assert tally.finding_count == 0, tally.findings
    # the generated calls got past validation into real lookups and transitions
    for code in ("OK", "NOT_FOUND", "INVALID_ARGUMENT", "ALREADY_EXISTS"):
        assert tally.counts[code] > 0, tally.counts


async def test_router_fuzzing_finds_nothing(backend: LocalBackend, stub: Any) -> None:
    await golden_tag(stub)
    await create_actor(stub, "r0", "fz")
    host, port = backend.router_url.removeprefix("http://").rsplit(":", 1)
    tally = await asyncio.to_thread(
        fuzz_router, (host, int(port)), ["fz/r0"], requests=300, seed=14
    )
    async with grpc.aio.insecure_channel(backend.api_address) as channel:
        await delete_everything(channel)
    assert tally.finding_count == 0, tally.findings
    assert tally.counts["2xx"] > 0, "routed cases reached the actor's agent"
    assert tally.counts["4xx"] > 0


class _Error(grpc.aio.AioRpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


_POLICY = "GetActorEgressPolicy"


@pytest.mark.parametrize(
    ("method", "code", "details", "is_finding"),
    [
        ("GetActor", grpc.StatusCode.UNKNOWN, "Exception calling application: boom", True),
        ("SuspendActor", grpc.StatusCode.UNKNOWN, "actor is CRASHED because it was in", True),
        ("SuspendActor", grpc.StatusCode.INTERNAL, "actor is CRASHED because it was in", False),
        ("GetActor", grpc.StatusCode.INTERNAL, "internal server error: KeyError: 'x'", True),
        ("ResumeActor", grpc.StatusCode.INTERNAL, "actor t/a crashed: atelet Restore: x", False),
        ("GetActor", grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded", True),
        ("ResumeActor", grpc.StatusCode.DEADLINE_EXCEEDED, "context deadline exceeded", False),
        ("ResumeActor", grpc.StatusCode.RESOURCE_EXHAUSTED, "no free workers available", False),
        ("GetActor", grpc.StatusCode.RESOURCE_EXHAUSTED, "received metadata size exceeds", True),
        ("GetActor", grpc.StatusCode.UNIMPLEMENTED, "Method not found!", True),
        (_POLICY, grpc.StatusCode.UNIMPLEMENTED, POLICY_RPCS[_POLICY], False),
        (_POLICY, grpc.StatusCode.UNIMPLEMENTED, "Method not found!", True),
        ("GetActor", grpc.StatusCode.UNAVAILABLE, "Socket closed", True),
        ("GetActor", grpc.StatusCode.NOT_FOUND, "Actor t/a not found", False),
        ("CreateActor", grpc.StatusCode.INVALID_ARGUMENT, "actor.metadata.name: Required", False),
        ("CreateTag", grpc.StatusCode.FAILED_PRECONDITION, "Actor t/a is not SUSPENDED", False),
        ("ResumeActor", grpc.StatusCode.ABORTED, "concurrent update conflict", False),
    ],
)
def test_api_answers_outside_the_contract_are_findings(
    method: str, code: grpc.StatusCode, details: str, is_finding: bool
) -> None:
    tally = Tally(server="ateapi", seed=0)
    _classify(tally, f"/ateapi.Control/{method}", object(), _Error(code, details))
    assert tally.counts[code.name] == 1
    assert (tally.finding_count == 1) is is_finding


async def test_cleanup_empties_the_server_but_for_its_own(backend: LocalBackend, stub: Any) -> None:
    """Actors in any state, tags, templates and atespaces go; local/sandbox and its golden
    tag stay."""
    golden = await golden_tag(stub)
    await create_actor(stub, "idle", "fz")
    await create_actor(stub, "busy", "fz2")
    await stub.ResumeActor(pb.ResumeActorRequest(actor=object_ref("busy", "fz2")))
    await stub.CreateTag(
        pb.CreateTagRequest(
            tag=pb.Tag(
                metadata=pb.ResourceMetadata(atespace="fz", name="t0"),
                scope=pb.TAG_SCOPE_ATESPACE,
                source_actor=object_ref("idle", "fz"),
            )
        )
    )
    async with grpc.aio.insecure_channel(backend.api_address) as channel:
        await delete_everything(channel)
    actors = await stub.ListActors(pb.ListActorsRequest())
    assert list(actors.actors) == []
    tags = await stub.ListTags(pb.ListTagsRequest())
    assert [f"{t.metadata.atespace}/{t.metadata.name}" for t in tags.tags] == [golden]
    templates = await stub.ListActorTemplates(pb.ListActorTemplatesRequest())
    assert [t.metadata.name for t in templates.actor_templates] == ["sandbox"]
    spaces = await stub.ListAtespaces(pb.ListAtespacesRequest())
    assert sorted(a.metadata.name for a in spaces.atespaces) == ["ate-golden", "local"]


@pytest.fixture
def broken_server() -> Iterator[tuple[str, int]]:
    """A server that answers every connection with a 500, or (path /hang) never answers."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield listener.getsockname()[:2]
    stop.set()
    thread.join()
    listener.close()


def test_router_fuzzer_reports_500s(broken_server: tuple[str, int]) -> None:
    tally = fuzz_router(broken_server, ["fz/a"], requests=20, seed=1, concurrency=2)
    assert tally.counts["5xx"] == 20
    assert tally.finding_count == 20
    assert len(tally.findings) == 5, "examples are capped; the count is not"


def test_fuzz_command_prints_tallies_as_json() -> None:
    result = CliRunner().invoke(main, ["fuzz", "api", "--requests", "60", "--json"])
    assert result.exit_code == 0, result.output
    (tally,) = json.loads(result.stdout)
    assert tally["server"] == "ateapi"
    assert tally["total"] == 60
    assert tally["findings"] == 0
    assert tally["process_after_cleanup"]["fds"] > 0


def test_fuzz_command_refuses_bad_input() -> None:
    result = CliRunner().invoke(main, ["fuzz", "nginx"])
    assert result.exit_code == 2
    assert "'nginx' is not one of 'api', 'router'" in result.output
    result = CliRunner().invoke(main, ["fuzz", "--requests", "0"])
    assert result.exit_code == 2
    assert "--requests" in result.output
