"""Serving, identity, auth, errors and the OpenAPI agreement, against the real agent process."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from job_pids import wait_for_pid, wait_gone

from sandbox_agent import __version__
from sandbox_agent._config import AgentConfig
from sandbox_agent._identity import Identity
from sandbox_agent._openapi import openapi_document
from sandbox_agent._serving import AgentServer
from sandbox_agent.app import App, create_app
from sandbox_agent.contract import MAX_TIMEOUT_S

OPENAPI_FILE = Path(__file__).resolve().parents[2] / "agent" / "openapi.json"


def test_readyz(agent: Any, check_schema: Any) -> None:
    resp = agent.request("GET", "/readyz")
    assert resp.status == 200
    doc = resp.json()
    check_schema(doc, "Readiness")
    assert doc["status"] == "ok"
    assert doc["agent_version"] == __version__
    assert doc["actor_id"] is None
    again = agent.request("GET", "/readyz").json()
    assert again["boot_id"] == doc["boot_id"]
    assert again["uptime_s"] >= doc["uptime_s"]


def test_boot_id_differs_per_process(agent_factory: Any) -> None:
    one = agent_factory().request("GET", "/readyz").json()
    two = agent_factory().request("GET", "/readyz").json()
    assert one["boot_id"] != two["boot_id"]


def test_actor_id_read_at_request_time_and_change_means_new_boot(agent_factory: Any) -> None:
    inst = agent_factory(env={"SANDBOX_AGENT_ACTOR_ID": "from-env"})
    first = inst.request("GET", "/readyz").json()
    assert first["actor_id"] == "from-env"
    id_file = inst.workdir / "actor-id"
    id_file.write_text("actor-a\n")
    second = inst.request("GET", "/readyz").json()
    assert second["actor_id"] == "actor-a", "the file wins over the environment"
    assert second["boot_id"] != first["boot_id"], "a changed actor id means a restored snapshot"
    third = inst.request("GET", "/readyz").json()
    assert third["boot_id"] == second["boot_id"]
    assert third["uptime_s"] < first["uptime_s"] + 60


def test_clock_jump_starts_new_boot(monkeypatch: pytest.MonkeyPatch) -> None:
    ident = Identity(jump_s=2.0)
    boot = ident.boot_id
    ident.check_clock()
    assert ident.boot_id == boot
    real_time = time.time
    monkeypatch.setattr(time, "time", lambda: real_time() + 3600)
    ident.check_clock()
    assert ident.boot_id != boot
    assert ident.uptime_s < 1


def test_actor_guard(agent_factory: Any, tmp_path: Path) -> None:
    inst = agent_factory()
    marker = tmp_path / "ran"
    body = {"command": f"touch {marker}"}
    # No actor id known: the header cannot be checked, the request runs.
    resp = inst.request(
        "POST", "/v1/exec?wait=8", json_body=body, headers={"X-Sandbox-Actor-Id": "anyone"}
    )
    assert resp.status == 200
    marker.unlink()
    (inst.workdir / "actor-id").write_text("actor-1")
    for method, path, payload in [
        ("POST", "/v1/exec?wait=8", body),
        ("GET", "/readyz", None),
        ("PUT", f"/v1/files?path={tmp_path}/f", None),
    ]:
        resp = inst.request(
            method, path, json_body=payload, headers={"X-Sandbox-Actor-Id": "actor-2"}
        )
        assert resp.status == 409, path
        assert resp.json()["error"]["code"] == "actor_mismatch"
    assert not marker.exists(), "nothing runs on a mismatch"
    assert not (tmp_path / "f").exists()
    resp = inst.request(
        "POST", "/v1/exec?wait=8", json_body=body, headers={"X-Sandbox-Actor-Id": "actor-1"}
    )
    assert resp.status == 200
    assert marker.exists()


@pytest.mark.parametrize("how", ["env", "file"])
def test_token_auth(agent_factory: Any, tmp_path: Path, how: str) -> None:
    if how == "env":
        inst = agent_factory(env={"SANDBOX_AGENT_TOKEN": "tok-123"})
    else:
        token_file = tmp_path / "token"
        token_file.write_text("tok-123\n")
        inst = agent_factory("--token-file", str(token_file))
    assert inst.request("GET", "/readyz").status == 200, "readyz never needs the token"
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "tok-123"}):
        for method, path in [
            ("POST", "/v1/exec"),
            ("GET", "/v1/exec/x"),
            ("GET", "/v1/openapi.json"),
            ("GET", "/v1/stat?path=/"),
            ("HEAD", "/v1/files?path=/etc/hostname"),
            ("GET", "/nope"),
        ]:
            resp = inst.request(
                method, path, headers=headers, body=b"{}" if method == "POST" else None
            )
            assert resp.status == 401, (method, path, headers)
            if method != "HEAD":
                assert resp.json()["error"]["code"] == "unauthorized"
    ok = inst.request(
        "POST",
        "/v1/exec?wait=8",
        json_body={"command": "echo hi"},
        headers={"Authorization": "Bearer tok-123"},
    )
    assert ok.status == 200
    assert ok.json()["stdout"] == "hi\n"


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b"{not json", "not valid JSON"),
        (b"", "got nothing"),
        (b"[1, 2]", "JSON object"),
        (b'"echo"', "JSON object"),
        (b"{}", "command is required"),
        (b'{"command": 5}', "command must be"),
        (b'{"command": []}', "non-empty list"),
        (b'{"command": ["ls", 1]}', "command[1] must be a string"),
        (b'{"command": ""}', "must not be empty"),
        (b'{"command": "ls", "cwd": "relative"}', "absolute"),
        (b'{"command": "ls", "env": {"A": 1}}', "must be a string"),
        (b'{"command": "ls", "env": {"A=B": "x"}}', "invalid"),
        (b'{"command": "ls", "env": ["A"]}', "env must be an object"),
        (b'{"command": "ls", "timeout_s": 0}', "timeout_s"),
        (b'{"command": "ls", "timeout_s": "5"}', "timeout_s"),
        (b'{"command": "ls", "timeout_s": true}', "timeout_s"),
        (b'{"command": "ls", "timeout_s": 100000000.5}', "at most 100000000"),
        (b'{"command": "ls", "timeout_s": 1e300}', "at most 100000000"),
        (b'{"command": "ls", "stdin": 5}', "stdin"),
        (b'{"command": "ls", "user": true}', "user"),
        (b'{"command": "ls", "user": -1}', "user"),
        (b'{"command": "ls", "user": ""}', "user"),
        (b'{"command": "ls", "max_output_bytes": -1}', "max_output_bytes"),
        (b'{"command": "ls", "max_output_bytes": 1.5}', "max_output_bytes"),
        (b'{"command": "ls", "id": "has space"}', "id must be"),
        (b'{"command": "ls", "id": 7}', "id must be"),
        (b'{"command": "ls", "shell": ""}', "shell"),
        (b'{"command": "ls", "comand": "typo"}', "unknown field"),
        (b'{"command": "a\\u0000b"}', "NUL"),
        (b'{"command": "ls", "env": {"A": "\\ud800"}}', "lone surrogates"),
        (b'{"command": "cat", "stdin": "\\udc80x\\ud800"}', "lone surrogates"),
    ],
)
def test_bad_exec_bodies_are_400(agent: Any, check_schema: Any, body: bytes, fragment: str) -> None:
    resp = agent.request(
        "POST", "/v1/exec", body=body, headers={"Content-Type": "application/json"}
    )
    assert resp.status == 400, body
    doc = resp.json()
    check_schema(doc, "ErrorBody")
    assert doc["error"]["code"] == "bad_request"
    assert fragment in doc["error"]["message"]


def test_timeout_limit_is_the_documented_maximum(agent: Any, openapi: dict[str, Any]) -> None:
    schema = openapi["components"]["schemas"]["ExecRequest"]["properties"]["timeout_s"]
    assert schema["maximum"] == MAX_TIMEOUT_S
    job = agent.exec(command="true", timeout_s=MAX_TIMEOUT_S).json()
    assert job["state"] == "exited"
    assert job["exit_code"] == 0


def test_oversize_json_is_413(agent: Any) -> None:
    body = json.dumps({"command": "true", "stdin": "x" * (17 * 1024 * 1024)}).encode()
    resp = agent.request("POST", "/v1/exec", body=body, timeout=60)
    assert resp.status == 413
    assert resp.json()["error"]["code"] == "too_large"


def test_unknown_path_and_method(agent: Any, check_schema: Any) -> None:
    resp = agent.request("GET", "/v2/nothing")
    assert resp.status == 404
    check_schema(resp.json(), "ErrorBody")
    resp = agent.request("PATCH", "/v1/exec")
    assert resp.status == 405
    check_schema(resp.json(), "ErrorBody")
    assert resp.json()["error"]["code"] == "method_not_allowed"
    assert "POST" in resp.headers["allow"]


def test_one_log_line_per_request(agent_factory: Any) -> None:
    inst = agent_factory()
    inst.request("GET", "/readyz")
    inst.request("POST", "/v1/exec?wait=8", json_body={"command": "echo secret-command-text"})
    inst.request("GET", "/v1/exec/missing")
    time.sleep(0.1)
    lines = [ln for ln in inst.log_text().splitlines() if "sandbox_agent.access" in ln]
    assert len(lines) == 3
    assert "GET /readyz 200" in lines[0]
    assert "POST /v1/exec 200" in lines[1]
    assert "GET /v1/exec/missing 404" in lines[2]
    assert all(ln.rstrip().endswith("ms") for ln in lines)
    assert "secret-command-text" not in inst.log_text(), "command text only at debug level"


def test_sigterm_kills_jobs_and_exits_cleanly(agent_factory: Any, tmp_path: Path) -> None:
    inst = agent_factory()
    inst.request(
        "POST",
        "/v1/exec?wait=0",
        json_body={"command": f"sleep 300 & echo $! > {tmp_path}/pid; wait"},
    )
    pid = wait_for_pid(tmp_path / "pid")
    assert inst.stop() == 0
    assert wait_gone(pid, 3)  # gone, or a zombie nobody reaped yet
    assert "Traceback" not in inst.log_text()


def test_cli_version_and_bad_flags(tmp_path: Path) -> None:
    run = [sys.executable, "-m", "sandbox_agent"]
    out = subprocess.run([*run, "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"sandbox-agent {__version__}"
    empty = tmp_path / "empty"
    empty.write_text("\n")
    bad = subprocess.run([*run, "--token-file", str(empty)], capture_output=True, text=True)
    assert bad.returncode == 2
    assert "is empty" in bad.stderr
    env = {**os.environ, "SANDBOX_AGENT_PORT": "http"}
    bad = subprocess.run(run, capture_output=True, text=True, env=env)
    assert bad.returncode != 0
    assert "SANDBOX_AGENT_PORT" in bad.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        busy = subprocess.run(
            [*run, "--host", "127.0.0.1", "--port", port, "--log-level", "error"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert busy.returncode == 1
    assert "cannot listen" in busy.stderr
    assert "Traceback" not in busy.stderr


def test_openapi_file_matches_code_and_server(agent: Any, openapi: dict[str, Any]) -> None:
    assert openapi == openapi_document(), (
        "agent/openapi.json is stale: run "
        "`uv run --all-extras python -m sandbox_agent._openapi > agent/openapi.json`"
    )
    served = agent.request("GET", "/v1/openapi.json")
    assert served.status == 200
    assert served.json() == openapi
    assert OPENAPI_FILE.read_text().endswith("\n")


def test_openapi_paths_match_routes(openapi: dict[str, Any]) -> None:
    app = create_app(AgentConfig())
    routes = {(path, method.lower()) for method, path in app.router.routes()}
    documented = {(path, method) for path, ops in openapi["paths"].items() for method in ops}
    # Every GET route also answers HEAD; only /v1/files documents it as meaningful.
    served = routes - {(p, "head") for p, m in routes if m == "head" and p != "/v1/files"}
    assert served == documented


def test_openapi_error_codes_cover_the_contract(openapi: dict[str, Any]) -> None:
    codes = set(
        openapi["components"]["schemas"]["ErrorBody"]["properties"]["error"]["properties"]["code"][
            "enum"
        ]
    )
    for needed in (
        "bad_request",
        "unauthorized",
        "not_found",
        "method_not_allowed",
        "id_conflict",
        "actor_mismatch",
        "too_large",
        "internal",
    ):
        assert needed in codes


def test_contract_doc_mentions_every_path(openapi: dict[str, Any]) -> None:
    contract = (OPENAPI_FILE.parent / "contract.md").read_text()
    for path in openapi["paths"]:
        assert path.split("{")[0] in contract, path
    for code in openapi["components"]["schemas"]["ErrorBody"]["properties"]["error"]["properties"][
        "code"
    ]["enum"]:
        assert f"`{code}`" in contract, code


async def test_app_factory_has_no_shared_state() -> None:
    one, two = create_app(AgentConfig()), create_app(AgentConfig())
    assert isinstance(one, App)
    assert one.jobs is not two.jobs


async def test_connections_use_tcp_nodelay() -> None:
    """Without TCP_NODELAY keep-alive responses stall ~40 ms (Nagle + delayed ACK)."""
    import socket

    import aiohttp

    config = AgentConfig()
    server = AgentServer(create_app(config), config)
    _, port = await server.start("127.0.0.1", 0)
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}/readyz") as resp:
                assert resp.status == 200
            conns = list(server.connections)
            assert conns
            for conn in conns:
                assert conn.transport is not None
                sock = conn.transport.get_extra_info("socket")
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    finally:
        await server.close()
