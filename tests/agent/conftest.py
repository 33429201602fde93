"""Fixtures that run the real agent (`python -m sandbox_agent`) on a free loopback port."""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from ci_policy import missing

REPO = Path(__file__).resolve().parents[2]
OPENAPI_FILE = REPO / "agent" / "openapi.json"
_LISTEN_RE = re.compile(rb"listening on http://[^:]+:(\d+)")


@dataclass
class Resp:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Agent:
    """A running agent process plus a keep-alive HTTP/1.1 connection to it."""

    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path
    workdir: Path
    _conn: http.client.HTTPConnection | None = field(default=None, repr=False)

    def request(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        timeout: float = 30.0,
    ) -> Resp:
        hdrs = dict(headers or {})
        if json_body is not None:
            body = json.dumps(json_body).encode()
            hdrs.setdefault("Content-Type", "application/json")
        for attempt in (0, 1):
            if self._conn is None:
                self._conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
            self._conn.timeout = timeout
            try:
                self._conn.request(method, path, body=body, headers=hdrs)
                raw = self._conn.getresponse()
                data = raw.read()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                self._conn.close()
                self._conn = None
                if attempt:
                    raise
                continue
            resp_headers = {k.lower(): v for k, v in raw.getheaders()}
            if raw.will_close:
                self._conn.close()
                self._conn = None
            return Resp(raw.status, resp_headers, data)
        raise AssertionError("unreachable")

    def exec(self, wait: float = 8, **fields: Any) -> Resp:
        return self.request("POST", f"/v1/exec?wait={wait}", json_body=fields)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def close_conn(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def stop(self) -> int:
        self.close_conn()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


# bubblewrap: a read-only view of the host, a private /tmp, /dev and /proc, its own pid, ipc and
# uts namespaces, and only the capabilities the agent uses (switching users, signalling its jobs,
# owning files in /tmp). Never CAP_SYS_ADMIN: root with it could remount the view read-write.
BWRAP = shutil.which("bwrap")
_BWRAP_ARGS = (
    *("--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"),
    *("--unshare-pid", "--unshare-ipc", "--unshare-uts", "--die-with-parent", "--chdir", "/tmp"),
    *("--cap-drop", "ALL"),
    *(
        arg
        for cap in ("SETUID", "SETGID", "KILL", "CHOWN", "DAC_OVERRIDE", "FOWNER")
        for arg in ("--cap-add", f"CAP_{cap}")
    ),
)


def _under_tmp() -> list[str]:
    """The checkout and its venv show through the private /tmp when they live under it (a CI
    clone in /tmp): without them the sandbox has no python to run."""
    binds: list[str] = []
    for path in sorted({Path(sys.prefix).resolve(), Path(__file__).resolve().parents[2]}):
        if path.is_relative_to("/tmp"):
            binds += ["--ro-bind", str(path), str(path)]
    return binds


def start_agent(
    workdir: Path,
    *args: str,
    env: dict[str, str] | None = None,
    sandbox: bool = False,
    mounts: tuple[str, ...] = (),
) -> Agent:
    """Start `python -m sandbox_agent` on a free port; `sandbox=True` runs it under bubblewrap,
    with `mounts` (bubblewrap arguments such as a small tmpfs) added to its view."""
    workdir.mkdir(parents=True, exist_ok=True)
    log_path = workdir / "agent.log"
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOX_AGENT_")}
    full_env.update(env or {})
    if not any(a == "--actor-id-file" for a in args):
        args = ("--actor-id-file", str(workdir / "actor-id"), *args)
    with open(log_path, "wb") as log:
        argv = [sys.executable, "-m", "sandbox_agent", "--host", "127.0.0.1", "--port", "0", *args]
        if sandbox:
            if BWRAP is None:
                missing("needs bubblewrap: apt-get install bubblewrap (.ci/install-deps)")
            argv = [BWRAP, *_BWRAP_ARGS, *_under_tmp(), *mounts, "--", *argv]
        proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=full_env,
        )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        match = _LISTEN_RE.search(log_path.read_bytes())
        if match:
            return Agent(proc, int(match.group(1)), log_path, workdir)
        if proc.poll() is not None:
            raise AssertionError(f"agent exited early:\n{log_path.read_text()}")
        time.sleep(0.02)
    proc.kill()
    raise AssertionError(f"agent did not start:\n{log_path.read_text()}")


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agent]:
    """One plain agent (no token) shared by a test module."""
    instance = start_agent(tmp_path_factory.mktemp("agent"))
    yield instance
    instance.stop()


@pytest.fixture(scope="module")
def sandboxed_agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agent]:
    """One agent inside bubblewrap: the host read-only, its own /tmp (see `_BWRAP_ARGS`)."""
    instance = start_agent(tmp_path_factory.mktemp("sandboxed"), sandbox=True)
    yield instance
    instance.stop()


@pytest.fixture
def agent_factory(tmp_path: Path) -> Iterator[Any]:
    """Start agents with special flags or env; all are stopped after the test."""
    started: list[Agent] = []

    def factory(
        *args: str,
        env: dict[str, str] | None = None,
        sandbox: bool = False,
        mounts: tuple[str, ...] = (),
    ) -> Agent:
        workdir = tmp_path / f"agent{len(started)}"
        instance = start_agent(workdir, *args, env=env, sandbox=sandbox, mounts=mounts)
        started.append(instance)
        return instance

    yield factory
    for instance in started:
        instance.stop()


@pytest.fixture(scope="session")
def openapi() -> dict[str, Any]:
    return json.loads(OPENAPI_FILE.read_text())


@pytest.fixture(scope="session")
def check_schema(openapi: dict[str, Any]) -> Any:
    """check_schema(doc, "Job") validates a response body against the OpenAPI components."""
    validators: dict[str, jsonschema.Draft202012Validator] = {}

    def check(doc: Any, name: str) -> None:
        if name not in validators:
            schema = {"$ref": f"#/components/schemas/{name}", "components": openapi["components"]}
            validators[name] = jsonschema.Draft202012Validator(schema)
        validators[name].validate(doc)

    return check
