"""Property-based test: thousands of generated requests, never a 5xx, never a crash.

Generated requests mix well-formed and malformed calls to every endpoint. Commands come from a
fixed set of harmless programs and uploads only target a scratch directory, so the fuzzing can
break the agent's validation but never the machine it runs on.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

MIN_REQUESTS = 2000

_json_leaf = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12)
_json_any = st.recursive(
    _json_leaf,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)

_commands = st.sampled_from(
    [
        "true",
        "echo hi",
        "exit 3",
        "cat",
        "printf '%s' \"$X\"",
        "echo err >&2; exit 1",
        ["true"],
        ["echo", "a", "b"],
        ["sh", "-c", "exit 2"],
        ["/nonexistent/program"],
        ["seq", "1", "500"],
    ]
)

_exec_body = st.fixed_dictionaries(
    {},
    optional={
        "id": st.none()
        | st.from_regex(r"[A-Za-z0-9._-]{1,12}", fullmatch=True)
        | st.text(max_size=8)
        | st.integers(),
        "command": _commands
        | st.integers()
        | st.lists(st.integers(), max_size=2)
        | st.just("")
        | st.just([])
        | st.text(max_size=5).map(lambda t: ["echo", t]),
        "shell": st.sampled_from([None, "/bin/sh", "/bin/bash", "", 3, "/no/such/shell"]),
        "cwd": st.sampled_from(
            [None, "/", "/tmp", "relative", "/nonexistent-dir", 5, "/etc/hostname"]
        ),
        "env": st.none()
        | st.dictionaries(st.text(max_size=5), st.text(max_size=5) | st.integers(), max_size=3)
        | st.lists(st.text(max_size=3), max_size=2),
        "timeout_s": st.none()
        | st.floats()
        | st.integers(-2, 3)
        | st.text(max_size=3)
        | st.booleans(),
        "stdin": st.none() | st.text(max_size=40) | st.integers(),
        "user": st.none()
        | st.sampled_from(["root", "nobody", "no-such-user", "", "0"])
        | st.integers(-5, 70000)
        | st.booleans(),
        "max_output_bytes": st.none() | st.integers(-10, 200) | st.floats() | st.text(max_size=3),
        "extra": _json_any,
    },
)

# Well-formed requests with every optional field exercised, so that the generated traffic also
# runs commands (in every mode) and not only fails validation.
_valid_exec_body = st.fixed_dictionaries(
    {"command": _commands},
    optional={
        "id": st.from_regex(r"[A-Za-z0-9._-]{1,12}", fullmatch=True),
        "shell": st.sampled_from(["/bin/sh", "/bin/bash"]),
        "cwd": st.sampled_from(["/", "/tmp", "/nonexistent-dir"]),
        "env": st.dictionaries(
            st.from_regex(r"[A-Z][A-Z0-9_]{0,6}", fullmatch=True), st.text(max_size=8), max_size=3
        ),
        "timeout_s": st.floats(min_value=0.001, max_value=5),
        "stdin": st.text(max_size=200),
        "user": st.sampled_from(["root", "nobody", 0, 65534, 4242]),
        "max_output_bytes": st.integers(0, 300),
    },
)

_wait = st.none() | st.sampled_from(["0", "0.01", "8", "9", "-1", "x", "nan", "1e400", ""])
_job_ids = st.sampled_from(["a", "b", "fuzz-1"]) | st.text(min_size=1, max_size=12)


@st.composite
def _requests(draw: st.DrawFn, root: str) -> tuple[str, str, bytes | None, dict[str, str]]:
    headers: dict[str, str] = {}
    if draw(st.integers(0, 9)) == 0:
        headers["X-Sandbox-Actor-Id"] = draw(st.from_regex(r"[a-z0-9-]{0,10}", fullmatch=True))
    kind = draw(
        st.sampled_from(["exec", "exec", "valid", "valid", "job", "put", "get", "stat", "any"])
    )
    wait = draw(_wait)
    wait_q = "" if wait is None else f"?wait={quote(wait)}"
    scratch = st.from_regex(r"[a-z0-9._-]{1,10}", fullmatch=True).map(lambda n: f"{root}/{n}")
    paths = scratch | st.sampled_from([root, "relative/x", "", f"{root}/d/e/f", "/etc/hostname"])
    if kind == "valid":
        return "POST", "/v1/exec" + wait_q, json.dumps(draw(_valid_exec_body)).encode(), headers
    if kind == "exec":
        if draw(st.integers(0, 5)) == 0:
            body = draw(st.binary(max_size=40))
        else:
            body = json.dumps(draw(_exec_body)).encode()
        return "POST", "/v1/exec" + wait_q, body, headers
    if kind == "job":
        method = draw(st.sampled_from(["GET", "DELETE"]))
        return method, f"/v1/exec/{quote(draw(_job_ids), safe='')}" + wait_q, None, headers
    if kind == "put":
        query: dict[str, str] = {"path": draw(paths)}
        for name, values in (
            ("offset", st.sampled_from(["0", "1", "5", "-1", "x", "99999999999999999999"])),
            ("final", st.sampled_from(["true", "false", "1", "no"])),
            ("mode", st.sampled_from(["0644", "755", "0o600", "9", "77777", ""])),
        ):
            if draw(st.booleans()):
                query[name] = draw(values)
        if draw(st.integers(0, 4)) == 0:
            scratch_root = Path(root)
            query["path"] = str(scratch_root / draw(st.sampled_from(["x", "y"])))
        return "PUT", "/v1/files?" + urlencode(query), draw(st.binary(max_size=64)), headers
    if kind == "get":
        method = draw(st.sampled_from(["GET", "HEAD"]))
        if draw(st.booleans()):
            headers["Range"] = draw(
                st.sampled_from(
                    [
                        "bytes=0-3",
                        "bytes=-2",
                        "bytes=5-",
                        "bytes=9-1",
                        "bytes=a-b",
                        "bytes=0-1,2-3",
                        "lines=1-2",
                        "bytes=99999-",
                    ]
                )
                | st.text(alphabet="bytes=0123456789-,", max_size=12)
            )
        return method, "/v1/files?" + urlencode({"path": draw(paths)}), None, headers
    if kind == "stat":
        target = draw(paths | st.text(max_size=10).map(lambda t: "/" + t))
        return "GET", "/v1/stat?" + urlencode({"path": target}), None, headers
    method = draw(st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"]))
    path = draw(
        st.sampled_from(
            [
                "/",
                "/readyz",
                "/v1/exec",
                "/v1/files",
                "/v1/stat",
                "/v1/openapi.json",
                "/v1",
                "/v1/exec/",
            ]
        )
        | st.text(max_size=10).map(lambda t: "/" + quote(t, safe=""))
    )
    body = draw(st.none() | st.binary(max_size=20))
    return method, path, body, headers


def test_generated_requests_never_5xx(agent: Any, check_schema: Any, tmp_path: Path) -> None:
    root = str(tmp_path / "fuzz")
    Path(root).mkdir()
    sent: list[int] = []

    @settings(
        max_examples=MIN_REQUESTS + 100,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(request=_requests(root))
    def one(request: tuple[str, str, bytes | None, dict[str, str]]) -> None:
        method, path, body, headers = request
        resp = agent.request(method, path, body=body, headers=headers)
        sent.append(resp.status)
        assert resp.status < 500, (method, path, body, resp.body[:300])
        if resp.headers.get("content-type", "").startswith("application/json") and resp.body:
            doc = json.loads(resp.body)
            if resp.status >= 400:
                check_schema(doc, "ErrorBody")
            elif path.startswith("/v1/exec"):
                check_schema(doc, "Job")
            elif path.startswith("/v1/stat"):
                check_schema(doc, "FileStat")
            elif method == "PUT":
                check_schema(doc, "UploadReply")

    one()
    assert len(sent) >= MIN_REQUESTS
    assert len({s for s in sent if s < 300}) >= 2, "the generator must also produce valid calls"
    assert agent.request("GET", "/readyz").status == 200
    log = agent.log_text()
    assert "Traceback" not in log
    assert "internal error" not in log
