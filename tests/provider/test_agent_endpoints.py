"""One table of the agent's endpoints (`sandbox_agent.endpoints`) for the server, the document and
the client (issue 33): the three agree, and a reply that breaks the table fails in the client.

The agent registers its routes from the table and the OpenAPI document is written from it; the
provider's `AgentClient` builds every request from it and checks every reply against it. These
tests hold each side to the table: the routes the server registers, the paths the document
lists, the calls the client makes against the real agent app (its query names and values
accepted, its replies checked), and a server that answers a body the table does not declare.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest

from gym_substrate.nemo.agent_client import (
    AgentClient,
    AiohttpTransport,
    HttpResponse,
    HttpTransport,
)
from gym_substrate.nemo.errors import AgentProtocolError, AgentResponseError
from sandbox_agent._config import AgentConfig
from sandbox_agent._openapi import openapi_document
from sandbox_agent._serving import AgentServer
from sandbox_agent.app import create_app
from sandbox_agent.endpoints import (
    ENDPOINTS,
    EXEC_GET,
    FILE_HEAD,
    FILE_PUT,
    OPENAPI,
    Endpoint,
)

ACTOR = "a1"


def _served_routes() -> set[tuple[str, str]]:
    return create_app(AgentConfig()).router.routes()


def test_the_server_registers_exactly_the_tables_routes() -> None:
    table = {(e.method, e.path) for e in ENDPOINTS}
    declared_heads = {path for method, path in table if method == "HEAD"}
    # the agent answers HEAD on every GET path; the table declares it only where it means something
    implicit = {("HEAD", p) for m, p in table if m == "GET" and p not in declared_heads}
    assert _served_routes() == table | implicit


def test_the_document_lists_exactly_the_tables_endpoints() -> None:
    paths = openapi_document()["paths"]
    documented = {
        (method.upper(), path, op["operationId"])
        for path, ops in paths.items()
        for method, op in ops.items()
    }
    assert documented == {(e.method, e.path, e.name) for e in ENDPOINTS}


def _endpoint_of(method: str, path: str) -> Endpoint:
    for endpoint in ENDPOINTS:
        pattern = re.sub(r"\\\{[a-z_]+\\\}", "[^/]+", re.escape(endpoint.path))
        if endpoint.method == method and re.fullmatch(pattern, path):
            return endpoint
    raise AssertionError(f"the client sent {method} {path}, which the table does not declare")


class Recording:
    """A transport that records which endpoint each request went to, then sends it."""

    def __init__(self, inner: HttpTransport) -> None:
        self.inner = inner
        self.used: list[tuple[Endpoint, Mapping[str, str]]] = []

    async def request(self, method: str, url: str, **kwargs: Any) -> HttpResponse:
        endpoint = _endpoint_of(method, urlsplit(url).path)
        self.used.append((endpoint, dict(kwargs["params"] or {})))
        return await self.inner.request(method, url, **kwargs)


@pytest.fixture
async def real_agent(tmp_path: Path) -> AsyncIterator[tuple[AgentClient, Recording]]:
    """The agent's own app on loopback, and a client whose every request is recorded."""
    actor_file = tmp_path / "actor-id"
    actor_file.write_text(ACTOR)
    config = AgentConfig(actor_id_file=str(actor_file))
    server = AgentServer(create_app(config), config)
    host, port = await server.start("127.0.0.1", 0)
    try:
        async with aiohttp.ClientSession() as session:
            recording = Recording(AiohttpTransport(session))
            router = f"http://{host}:{port}"
            yield AgentClient(recording, router, ACTOR, "ns"), recording
    finally:
        await server.close()


async def test_every_client_call_is_a_table_endpoint_the_real_agent_accepts(
    real_agent: tuple[AgentClient, Recording], tmp_path: Path
) -> None:
    """Each call's path, method and query names are the table's, the agent accepts its query
    values (else a 400), and its reply passes the client's check (else AgentProtocolError)."""
    client, recording = real_agent
    assert (await client.readyz())["actor_id"] == ACTOR
    job = await client.submit({"id": "j1", "command": "echo hi"}, wait_s=5.0)
    assert (await client.poll(job["id"], wait_s=5.0))["stdout"] == "hi\n"
    assert (await client.kill(job["id"]))["state"] == "exited"
    target = str(tmp_path / "f.bin")
    await client.put_chunk(target, 0, b"abc", final=False, mode=0o600)
    assert (await client.put_chunk(target, 3, b"def", final=True, mode=0o600))["size"] == 6
    assert (await client.stat(target))["mode"] == 0o600
    assert (await client.get_range(target, 1, 3))[0] == b"bcd"
    session = await client.pty_create({"id": "p1", "command": ["cat"], "pty": False})
    sid = session["id"]
    assert (await client.pty_input(sid, 0, b"x\n"))["input_offset"] == 2
    output = await client.pty_output(sid, "stdout", 0, wait_s=5.0)
    assert output["data"]
    assert (await client.pty_resize(sid, 30, 100))["rows"] == 30
    assert (await client.pty_get(sid))["state"] == "running"
    await client.pty_signal(sid, "SIGTERM")
    assert (await client.pty_close(sid))["id"] == sid
    used = {endpoint for endpoint, _ in recording.used}
    assert used == set(ENDPOINTS) - {OPENAPI, FILE_HEAD}, "a client call is missing or new"
    for endpoint, params in recording.used:
        assert set(params) <= {p.name for p in endpoint.query_params}, endpoint.name


class Answering:
    """A transport that answers every request with one canned reply."""

    def __init__(self, status: int, body: Any, content_type: str = "application/json") -> None:
        payload = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.reply = HttpResponse(status, {"content-type": content_type}, payload)

    async def request(self, method: str, url: str, **kwargs: Any) -> HttpResponse:
        return self.reply


def _job(**changes: Any) -> dict[str, Any]:
    job: dict[str, Any] = {
        "id": "j1",
        "state": "exited",
        "exit_code": 0,
        "signal": None,
        "stdout": "",
        "stderr": "",
        "stdout_truncated": False,
        "stderr_truncated": False,
        "started_at": 1.0,
        "duration_ms": 1.0,
        "error": None,
    }
    job.update(changes)
    return {k: v for k, v in job.items() if v is not ...}


@pytest.mark.parametrize(
    ("status", "body", "says"),
    [
        (200, _job(state=...), "state is missing"),
        (200, _job(exit_code="0"), "exit_code must be an integer or null"),
        (200, _job(state="done"), "state must be one of running"),
        (200, _job(duration_ms=-1), "duration_ms must be a number >= 0"),
        (200, [], "the reply must be a JSON object"),
        (201, _job(), "answered 201; the contract says [200]"),
        (200, b"<html>ok</html>", "with no JSON"),
    ],
)
async def test_a_reply_that_breaks_the_table_fails_in_the_client(
    status: int, body: Any, says: str
) -> None:
    client = AgentClient(Answering(status, body), "http://router", ACTOR, "ns")
    with pytest.raises(AgentProtocolError) as caught:
        await client.poll("j1", wait_s=0.0)
    error = caught.value
    assert isinstance(error, AgentResponseError)
    assert error.code == "bad_reply"
    assert error.status == status
    assert "GET /v1/exec/{job_id}" in str(error), "the message names the endpoint"
    assert says in str(error)


async def test_a_field_the_table_does_not_name_is_let_through() -> None:
    """A newer agent may add a field to a reply; an older client reads the rest."""
    client = AgentClient(Answering(200, _job(cpu_ms=3)), "http://router", ACTOR, "ns")
    assert (await client.poll("j1", wait_s=0.0))["state"] == "exited"


def test_a_query_the_table_does_not_declare_is_refused_before_sending() -> None:
    with pytest.raises(TypeError, match="declares no query parameter"):
        EXEC_GET.query({"wiat": 1.0})
    with pytest.raises(ValueError, match="wait must be a number of seconds 0..8"):
        EXEC_GET.query({"wait": 9.0})
    assert FILE_PUT.query({"path": "/a", "offset": 0, "final": True, "mode": 0o644}) == {
        "path": "/a",
        "offset": "0",
        "final": "true",
        "mode": "644",
    }
