"""Issue 14, "The agent": each hostile input exactly as reported, and the contract's answer."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import jsonschema
import pytest

from sandbox_agent._config import AgentConfig
from sandbox_agent._jobs import ExecSpec, JobManager
from sandbox_agent._serving import AgentServer
from sandbox_agent.app import create_app
from sandbox_agent.contract import MAX_FILE_OFFSET, MAX_UID


def _q(path: Path | str) -> str:
    return quote(str(path), safe="/")


def _error(resp: Any, status: int, code: str, check_schema: Any) -> str:
    assert resp.status == status, (resp.status, resp.body[:300])
    doc = resp.json()
    check_schema(doc, "ErrorBody")
    assert doc["error"]["code"] == code, doc
    return str(doc["error"]["message"])


# ----- 1. a numeric user is that user, never root by accident -----


@pytest.mark.parametrize("user", ["4294967295", 4294967295, "-1", -1, "4294967296", "1e3", "0x10"])
def test_uid_outside_0_to_max_uid_is_400(agent: Any, check_schema: Any, user: Any) -> None:
    resp = agent.exec(command=["id", "-u"], user=user)
    message = _error(resp, 400, "bad_request", check_schema)
    assert "user" in message


@pytest.mark.parametrize("user", ["0", 0, "4321", 4321, "0004321", str(MAX_UID), MAX_UID])
def test_id_u_prints_the_requested_uid(agent: Any, user: Any) -> None:
    job = agent.exec(command=["id", "-u"], user=user).json()
    assert job["state"] == "exited", job
    assert job["stdout"] == f"{int(user)}\n"


# ----- 2. numbers are ASCII digits, nothing else -----


@pytest.mark.parametrize("user", ["١٢", "٣", "12 ", " 12", "1_2", "+12", "１２"])
def test_user_with_non_ascii_or_decorated_digits_is_not_a_uid(
    agent: Any, check_schema: Any, user: str
) -> None:
    # Not ASCII digits, so it is a user name, and no such user exists here.
    message = _error(agent.exec(command=["id", "-u"], user=user), 400, "bad_request", check_schema)
    assert "unknown user" in message


@pytest.mark.parametrize(
    "wait", ["0_1", " 1 ", "1 ", "١", "٣", "+1", "0x1", "1e", ".5", "Infinity"]
)
def test_wait_is_a_plain_number(agent: Any, check_schema: Any, wait: str) -> None:
    query = quote(wait, safe="")
    resp = agent.request("POST", f"/v1/exec?wait={query}", json_body={"command": "true"})
    assert "wait" in _error(resp, 400, "bad_request", check_schema)
    resp = agent.request("GET", f"/v1/exec/nope?wait={query}")
    assert "wait" in _error(resp, 400, "bad_request", check_schema)


@pytest.mark.parametrize(
    "wait",
    ["0", "0.5", "8", "8.0", "2e0", "1E-3", "-0", "0.37861788686614883", "2.225073858507203e-309"]
    + ["0.00012345678901234567"],  # how Python (and so schemathesis) writes floats
)
def test_wait_accepts_json_number_forms(agent: Any, wait: str) -> None:
    resp = agent.request("POST", f"/v1/exec?wait={wait}", json_body={"command": "true"})
    assert resp.status in (200, 202), resp.body


@pytest.mark.parametrize(
    "query",
    ["offset=٣", "offset= 3", "offset=3_0", "offset=+3", f"offset={MAX_FILE_OFFSET + 1}"]
    + ["mode=0O7", "mode=0O644", "mode=٦٤٤", "mode=0x1ff", "mode=+644", "mode=0o"]
    + ["final=True", "final=FALSE", "final=yes"],
)
def test_put_parameters_are_strict(
    agent: Any, check_schema: Any, tmp_path: Path, query: str
) -> None:
    target = tmp_path / "f"
    name, value = query.split("=")
    resp = agent.request(
        "PUT", f"/v1/files?path={_q(target)}&{name}={quote(value, safe='')}", body=b"x"
    )
    assert name in _error(resp, 400, "bad_request", check_schema)
    assert not target.exists()


@pytest.mark.parametrize(("mode", "bits"), [("7", 0o7), ("644", 0o644), ("0644", 0o644)])
def test_mode_forms(agent: Any, tmp_path: Path, mode: str, bits: int) -> None:
    target = tmp_path / "m"
    for form in (mode, f"0o{mode}"):
        resp = agent.request("PUT", f"/v1/files?path={_q(target)}&mode={form}", body=b"x")
        assert resp.status == 200, (form, resp.body)
        assert target.stat().st_mode & 0o7777 == bits


def test_offset_up_to_the_largest_file_offset_is_a_number(agent: Any, tmp_path: Path) -> None:
    # 19 digits: a valid offset past what was received, so the contract's answer is 409.
    target = tmp_path / "o"
    resp = agent.request("PUT", f"/v1/files?path={_q(target)}&offset={MAX_FILE_OFFSET}", body=b"")
    assert resp.status == 409
    assert resp.json()["error"]["code"] == "offset_mismatch"


@pytest.mark.parametrize(
    "header",
    ["bytes=٠-١", "bytes=0-١", "bytes= 0-1", "bytes=0 -1", "bytes=+0-1", "bytes=0x0-1"]
    + [f"bytes=0-{MAX_FILE_OFFSET + 1}", "bytes=" + "9" * 5000 + "-", "bytes=0-" + "9" * 5000],
)
def test_range_numbers_are_ascii_and_bounded(
    agent: Any, check_schema: Any, tmp_path: Path, header: str
) -> None:
    target = tmp_path / "r"
    target.write_bytes(b"0123456789")
    # Sent as UTF-8 bytes, as a raw client would.
    resp = agent.request(
        "GET",
        f"/v1/files?path={_q(target)}",
        headers={"Range": header.encode()},  # type: ignore[dict-item]
    )
    assert "Range" in _error(resp, 400, "bad_request", check_schema)


def test_range_up_to_the_largest_file_offset(agent: Any, tmp_path: Path) -> None:
    target = tmp_path / "r"
    target.write_bytes(b"0123456789")
    url = f"/v1/files?path={_q(target)}"
    resp = agent.request("GET", url, headers={"Range": f"bytes=3-{MAX_FILE_OFFSET}"})
    assert (resp.status, resp.body) == (206, b"3456789")
    resp = agent.request("GET", url, headers={"Range": f"bytes={MAX_FILE_OFFSET}-"})
    assert resp.status == 416


# ----- 3. a spawn failure never leaves a ghost job -----


def test_out_of_range_user_is_400_and_leaves_no_job(agent: Any, check_schema: Any) -> None:
    body = {"id": "g1", "command": "true", "user": "99999999999"}
    for _ in range(3):  # a retry with the same id gets the same answer, never a 202
        resp = agent.request("POST", "/v1/exec", json_body=body)
        _error(resp, 400, "bad_request", check_schema)
    _error(agent.request("GET", "/v1/exec/g1"), 404, "not_found", check_schema)
    _error(agent.request("DELETE", "/v1/exec/g1"), 404, "not_found", check_schema)


@pytest.mark.slow  # a one-sided bound on a measured time
async def test_a_spawn_failure_is_a_failed_job_that_ends() -> None:
    """Behind validation: whatever makes the spawn itself fail ends the job as `failed`."""
    jobs = JobManager(AgentConfig())
    spec = ExecSpec(
        command=("true",),
        shell="/bin/sh",
        cwd=None,
        env=(),
        timeout_s=None,
        stdin=None,
        user=99_999_999_999,  # what parse_exec_request now refuses; Popen raises OverflowError
        max_output_bytes=1024,
    )
    job = await jobs.submit("g1", spec)
    assert job.finished
    doc = json.loads(job.body())
    assert doc["state"] == "failed"
    assert (doc["exit_code"], doc["signal"]) == (None, None)
    assert "could not start" in doc["error"]
    assert jobs.running == 0
    assert await jobs.submit("g1", spec) is jobs.get("g1"), "a retry returns the finished job"
    start = time.monotonic()
    assert json.loads((await jobs.kill(jobs.get("g1"))).body())["state"] == "failed"  # type: ignore[arg-type]
    await jobs.shutdown()
    assert time.monotonic() - start < 0.5, "DELETE and shutdown wait for nothing"


# ----- 4. input never causes a 500 -----


def test_5000_digit_user_is_400(agent: Any, check_schema: Any) -> None:
    for user in ("9" * 5000, "1" * 5000):
        resp = agent.exec(command="true", user=user)
        assert "user" in _error(resp, 400, "bad_request", check_schema)


@pytest.mark.parametrize("depth", [900, 3000, 100_000])
def test_deeply_nested_json_is_400(agent: Any, check_schema: Any, depth: int) -> None:
    for body in ("[" * depth + "]" * depth, '{"a":' * depth + "1" + "}" * depth):
        resp = agent.request(
            "POST", "/v1/exec", body=body.encode(), headers={"Content-Type": "application/json"}
        )
        _error(resp, 400, "bad_request", check_schema)
    assert "Traceback" not in agent.log_text()


def test_huge_json_numbers_are_400(agent: Any, check_schema: Any) -> None:
    for field in ("timeout_s", "max_output_bytes", "user"):
        body = f'{{"command": "true", "{field}": {"9" * 5000}}}'
        resp = agent.request(
            "POST", "/v1/exec", body=body.encode(), headers={"Content-Type": "application/json"}
        )
        _error(resp, 400, "bad_request", check_schema)


def test_name_too_long_is_400(agent: Any, check_schema: Any, tmp_path: Path) -> None:
    long_name = tmp_path / ("n" * 300)
    for method, url in (
        ("GET", f"/v1/files?path={_q(long_name)}"),
        ("GET", f"/v1/stat?path={_q(long_name)}"),
        ("PUT", f"/v1/files?path={_q(long_name)}"),
        ("PUT", f"/v1/files?path={_q(long_name / 'x')}"),
        ("GET", f"/v1/files?path={_q('/' + 'd/' * 2100 + 'f')}"),  # over PATH_MAX
    ):
        resp = agent.request(method, url, body=b"x" if method == "PUT" else None)
        _error(resp, 400, "name_too_long", check_schema)
    assert agent.request("HEAD", f"/v1/files?path={_q(long_name)}").status == 400


def test_longest_name_uploads(agent: Any, tmp_path: Path) -> None:
    """255 bytes is a valid name, even though its hidden temporary sibling would not be."""
    target = tmp_path / ("n" * 255)
    for offset, chunk, final in ((0, b"ab", "false"), (2, b"cd", "true")):
        url = f"/v1/files?path={_q(target)}&offset={offset}&final={final}"
        assert agent.request("PUT", url, body=chunk).status == 200
    assert target.read_bytes() == b"abcd"
    assert sorted(p.name for p in tmp_path.iterdir()) == [target.name], "no temporary left"


def test_symlink_loop_is_400(agent: Any, check_schema: Any, tmp_path: Path) -> None:
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    loop = tmp_path / "a"
    for method, url in (
        ("GET", f"/v1/files?path={_q(loop)}"),
        ("GET", f"/v1/stat?path={_q(loop / 'x')}"),
        ("PUT", f"/v1/files?path={_q(loop / 'x')}"),
    ):
        resp = agent.request(method, url, body=b"x" if method == "PUT" else None)
        _error(resp, 400, "too_many_links", check_schema)
    resp = agent.request("GET", f"/v1/stat?path={_q(loop)}")
    assert resp.json()["type"] == "symlink", "stat does not follow the last link"


def test_read_only_target_is_403(sandboxed_agent: Any, check_schema: Any) -> None:
    # The sandbox's root is a read-only bind of the host's; only its /tmp is writable.
    for path in ("/etc/sandbox-agent-probe", "/usr/new-dir/file"):
        resp = sandboxed_agent.request("PUT", f"/v1/files?path={path}", body=b"x")
        _error(resp, 403, "read_only", check_schema)
    private = f"/tmp/sandbox-agent-{uuid.uuid4().hex}"
    assert sandboxed_agent.request("PUT", f"/v1/files?path={private}", body=b"x").status == 200
    assert not Path(private).exists(), "the sandbox has its own /tmp"


def test_full_file_system_is_507_and_the_upload_resumes(
    agent_factory: Any, check_schema: Any
) -> None:
    """ENOSPC is the sandbox's state, not a bug: 507 `no_space`, and the failed chunk is cut back
    to its offset, so the client frees space and resends it."""
    agent = agent_factory(sandbox=True, mounts=("--size", "65536", "--tmpfs", "/tmp/small"))
    first = agent.request(
        "PUT", "/v1/files?path=/tmp/small/f&offset=0&final=false", body=b"a" * 1000
    )
    assert first.status == 200
    resp = agent.request(
        "PUT", "/v1/files?path=/tmp/small/f&offset=1000&final=false", body=b"b" * 200_000
    )
    message = _error(resp, 507, "no_space", check_schema)
    assert "/tmp/small/f" in message
    # the 1000 bytes received before are kept: the next chunk continues at offset 1000
    resp = agent.request("PUT", "/v1/files?path=/tmp/small/f&offset=1000&final=true", body=b"c")
    assert resp.status == 200, resp.body
    assert agent.request("GET", "/v1/files?path=/tmp/small/f").body == b"a" * 1000 + b"c"


def test_upload_onto_a_mount_point_is_409_busy(
    agent_factory: Any, check_schema: Any, tmp_path: Path
) -> None:
    """Replacing a bind-mounted file fails with EBUSY; that is the request's target, not a
    server fault."""
    source = tmp_path / "mounted"
    source.write_text("kept")
    agent = agent_factory(sandbox=True, mounts=("--bind", str(source), "/tmp/mounted"))
    resp = agent.request("PUT", "/v1/files?path=/tmp/mounted", body=b"new")
    _error(resp, 409, "busy", check_schema)
    assert source.read_text() == "kept"


# ----- 5. every error is the JSON error object, also the HTTP parser's -----


def _raw_exchange(port: int, data: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send raw bytes, read until the agent closes; (status, headers, body) of the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines)}
    return int(status_line.split()[1]), headers, body


@pytest.mark.parametrize(
    "raw",
    [
        b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",  # request line over the limit
        b"GET /readyz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n",  # one header
        b"GET /readyz HTTP/1.1\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(200)) + b"\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n",  # TLS to a plain HTTP port
        b"GET /readyz HTTP/1.1\r\nHo st: x\r\n\r\n",
        b"POST /v1/exec HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
    ],
    ids=["request-line", "header", "header-count", "tls", "header-name", "content-length"],
)
def test_http_parser_errors_are_json(agent: Any, check_schema: Any, raw: bytes) -> None:
    status, headers, body = _raw_exchange(agent.port, raw)
    assert status == 400
    assert headers["content-type"].startswith("application/json")  # and then it closed
    doc = json.loads(body)
    check_schema(doc, "ErrorBody")
    assert doc["error"]["code"] == "bad_request"
    assert "Traceback" not in agent.log_text()


# ----- 6. stuck clients are cut: header, body and idle timeouts -----


@contextlib.asynccontextmanager
async def _serving(**timeouts: float) -> AsyncIterator[int]:
    """The agent in this event loop, as `serve()` runs it, with small timeouts; yields the port."""
    config = AgentConfig(host="127.0.0.1", port=0, **timeouts)
    server = AgentServer(create_app(config), config)
    _, port = await server.start("127.0.0.1", 0)
    try:
        yield port
    finally:
        await server.close()


async def _read_until_closed(reader: asyncio.StreamReader, limit_s: float) -> tuple[bytes, float]:
    """Everything the agent sends until it closes, and how long that took (fails past limit)."""
    start = time.monotonic()
    received = b""
    async with asyncio.timeout(limit_s):
        with contextlib.suppress(ConnectionResetError):
            while chunk := await reader.read(65536):
                received += chunk
    return received, time.monotonic() - start


def _json_408(received: bytes, check_schema: Any) -> None:
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 "), received[:200]
    assert b"application/json" in head.lower()
    doc = json.loads(body)
    check_schema(doc, "ErrorBody")
    assert doc["error"]["code"] == "request_timeout"


@pytest.mark.slow  # a one-sided bound on a measured time
async def test_slowloris_headers_are_cut(check_schema: Any) -> None:
    async with _serving(header_timeout_s=2, idle_timeout_s=60) as port:

        async def slowloris() -> tuple[bytes, float]:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)

            async def drip() -> None:
                for byte in b"GET /readyz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 60:
                    writer.write(bytes([byte]))
                    await asyncio.sleep(1.0)  # one byte per second

            dripping = asyncio.create_task(drip())
            try:
                return await _read_until_closed(reader, limit_s=6)
            finally:
                dripping.cancel()
                writer.close()

        results = await asyncio.gather(*(slowloris() for _ in range(64)))
    for received, took in results:
        assert took < 2 + 2, "cut within the header timeout (plus scheduling slack)"
        _json_408(received, check_schema)


@pytest.mark.slow  # a one-sided bound on a measured time
async def test_idle_connections_are_cut() -> None:
    async with _serving(idle_timeout_s=1) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        received, took = await _read_until_closed(reader, limit_s=4)
        assert (received, took < 1 + 2) == (b"", True), "a connection that never sends is closed"
        writer.close()
        # After a complete request, keep-alive lasts the idle timeout too.
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
        received, took = await _read_until_closed(reader, limit_s=4)
        assert received.startswith(b"HTTP/1.1 200 ")
        assert took < 1 + 2
        writer.close()


@pytest.mark.slow  # a one-sided bound on a measured time
@pytest.mark.parametrize(
    ("method", "path"), [("POST", "/v1/exec?wait=0"), ("PUT", "/v1/files?path=/tmp/never")]
)
async def test_stalled_body_is_408_and_closed(check_schema: Any, method: str, path: str) -> None:
    async with _serving(body_timeout_s=1) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n".encode())
        writer.write(b'{"command":')  # and then nothing
        received, took = await _read_until_closed(reader, limit_s=5)
        writer.close()
    assert took < 1 + 2, "answered and closed at the body timeout, without lingering"
    _json_408(received, check_schema)


# ----- 7. the OpenAPI document and the server agree -----


def _param_schema(openapi: dict[str, Any], path: str, method: str, name: str) -> Any:
    for param in openapi["paths"][path][method]["parameters"]:
        if param["name"] == name:
            return jsonschema.Draft202012Validator(param["schema"])
    raise AssertionError(name)


@pytest.mark.parametrize(
    ("path", "valid"),
    [("/", False), ("/tmp/", False), ("/tmp/..", False), ("/a\x00b", False), ("/tmp/x", True)]
    + [("/tmp/...", True), ("/tmp/.x", True), ("//tmp//y", True), ("/../tmp/z", True)],
)
def test_file_path_rule_is_the_documents(
    agent: Any, openapi: dict[str, Any], path: str, valid: bool
) -> None:
    for method in ("put", "get", "head"):
        assert _param_schema(openapi, "/v1/files", method, "path").is_valid(path) is valid
    resp = agent.request("PUT", f"/v1/files?path={quote(path)}", body=b"x")
    assert (resp.status == 200) is valid, (path, resp.status, resp.body)
    if not valid:
        assert resp.status == 400
    stat = _param_schema(openapi, "/v1/stat", "get", "path")
    assert stat.is_valid(path) is ("\x00" not in path)


def test_exec_body_rules_are_the_documents(agent: Any, openapi: dict[str, Any]) -> None:
    schema = {"$ref": "#/components/schemas/ExecRequest", "components": openapi["components"]}
    validator = jsonschema.Draft202012Validator(schema)
    cases = [
        ({"command": "   "}, True),  # runs the shell on a blank script: exit 0
        ({"command": ["true", ""]}, True),
        ({"command": ["", "x"]}, False),
        ({"command": "a\x00b"}, False),
        # the program itself: prefixItems, which `items` does not cover (the full schemathesis
        # run's one finding)
        ({"command": ["tru\x00e"]}, False),
        ({"command": ["true", "a\x00"]}, False),
        ({"command": "true", "env": {"": "x"}}, False),
        ({"command": "true", "env": {"A=B": "x"}}, False),
        ({"command": "true", "env": {"A": "x\x00"}}, False),
        ({"command": "true", "shell": ""}, False),
        ({"command": "true", "cwd": "/\x00"}, False),
        ({"command": "true", "user": MAX_UID + 1}, False),
        ({"command": "true", "user": "a\x00"}, False),
        ({"command": "true", "user": 4321.0}, True),  # JSON Schema: an integer
        ({"command": "true", "max_output_bytes": 1e3}, True),
        ({"command": "true", "max_output_bytes": 1.5}, False),
    ]
    for body, valid in cases:
        assert validator.is_valid(body) is valid, body
        resp = agent.exec(**body)
        assert resp.status == (200 if valid else 400), (body, resp.body)


def test_19_digit_offset_is_in_the_document(agent: Any, openapi: dict[str, Any]) -> None:
    schema = _param_schema(openapi, "/v1/files", "put", "offset")
    assert schema.is_valid(MAX_FILE_OFFSET)
    assert not schema.is_valid(MAX_FILE_OFFSET + 1)


def test_put_body_may_be_omitted(agent: Any, openapi: dict[str, Any], tmp_path: Path) -> None:
    assert openapi["paths"]["/v1/files"]["put"]["requestBody"]["required"] is False
    resp = agent.request("PUT", f"/v1/files?path={_q(tmp_path / 'empty')}")  # no body at all
    assert resp.status == 200
    assert resp.json()["size"] == 0


def test_head_answers_are_documented(agent_factory: Any, openapi: dict[str, Any]) -> None:
    inst = agent_factory(env={"SANDBOX_AGENT_TOKEN": "t0ken"})
    target = inst.workdir / "data"
    target.write_bytes(b"0123")
    responses = openapi["paths"]["/v1/files"]["head"]["responses"]
    resp = inst.request("HEAD", f"/v1/files?path={_q(target)}")
    assert resp.status == 401
    assert "401" in responses
    ok = inst.request(
        "HEAD",
        f"/v1/files?path={_q(target)}",
        headers={"Authorization": "Bearer t0ken", "Range": "bytes=0-0"},
    )
    assert ok.status == 206
    assert "206" in responses
    assert all("content" not in answer for answer in responses.values()), "HEAD has no body"


def test_unknown_method_is_405_before_the_actor_guard(agent_factory: Any) -> None:
    inst = agent_factory(env={"SANDBOX_AGENT_ACTOR_ID": "actor-a"})
    wrong = {"X-Sandbox-Actor-Id": "actor-b"}
    resp = inst.request("TRACE", "/readyz", headers=wrong)
    assert resp.status == 405
    assert resp.headers["allow"]
    assert inst.request("GET", "/v2/nothing", headers=wrong).status == 404
    assert inst.request("GET", "/readyz", headers=wrong).status == 409
