"""PTY sessions (`/v1/pty`) against the real agent process.

What they stand in for: NeMo Gym 0.7.0's `SupportsSandboxPty` (`nemo_gym/sandbox/providers/
base.py`: `SandboxPtySpec`, `SandboxPtySession.read/read_stderr/write/resize/send_signal/
wait_exit/close`) and its interactive shell (`nemo_gym/sandbox/shell.py`), carried over Agent
Substrate's router, which forwards HTTP/1.1 only and cuts every request at 10 s (real:
cmd/atenet/internal/router/xds.go, the route timeout), hence long polls of at most 8 s and
offsets on both directions so that a lost response can be repeated.
"""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from job_pids import alive, wait_gone

from sandbox_agent.contract import MiB


class Pty:
    """A client for one session: reads and writes by offset, as the provider does."""

    def __init__(self, agent: Any, **fields: Any) -> None:
        self.agent = agent
        resp = agent.request("POST", "/v1/pty", json_body=fields)
        assert resp.status == 200, resp.body
        self.session = resp.json()
        self.id = self.session["id"]
        self.offset = 0
        self.err_offset = 0
        self.sent = 0

    def read(self, wait: float = 2, stream: str = "stdout", offset: int | None = None) -> Any:
        start = self.offset if stream == "stdout" else self.err_offset
        at = start if offset is None else offset
        resp = self.agent.request(
            "GET", f"/v1/pty/{self.id}/output?offset={at}&wait={wait}&stream={stream}"
        )
        assert resp.status == 200, resp.body
        doc = resp.json()
        if offset is None:
            if stream == "stdout":
                self.offset = doc["next_offset"]
            else:
                self.err_offset = doc["next_offset"]
        return doc

    def read_until(self, needle: bytes, timeout: float = 20, stream: str = "stdout") -> bytes:
        seen = b""
        deadline = time.monotonic() + timeout
        while needle not in seen:
            assert time.monotonic() < deadline, f"{needle!r} never came; got {seen!r}"
            doc = self.read(stream=stream)
            seen += base64.b64decode(doc["data"])
            if doc["eof"] and needle not in seen:
                raise AssertionError(f"{needle!r} never came before the end; got {seen!r}")
        return seen

    def drain(self, stream: str = "stdout", timeout: float = 30) -> bytes:
        out = b""
        deadline = time.monotonic() + timeout
        while True:
            assert time.monotonic() < deadline, f"no end after {timeout} s; got {out[-500:]!r}"
            doc = self.read(stream=stream)
            out += base64.b64decode(doc["data"])
            if doc["eof"]:
                return out

    def write(self, data: bytes) -> Any:
        resp = self.agent.request(
            "POST",
            f"/v1/pty/{self.id}/input?offset={self.sent}",
            body=data,
            headers={"Content-Type": "application/octet-stream"},
        )
        assert resp.status == 200, resp.body
        self.sent += len(data)
        return resp.json()

    def state(self, wait: float = 0) -> Any:
        resp = self.agent.request("GET", f"/v1/pty/{self.id}?wait={wait}")
        assert resp.status == 200, resp.body
        return resp.json()

    def post(self, action: str, body: Any) -> Any:
        return self.agent.request("POST", f"/v1/pty/{self.id}/{action}", json_body=body)

    def close(self) -> Any:
        resp = self.agent.request("DELETE", f"/v1/pty/{self.id}")
        assert resp.status == 200, resp.body
        return resp.json()


def test_command_in_a_terminal_reads_input_and_reports_its_exit(
    agent: Any, check_schema: Any
) -> None:
    pty = Pty(agent, command="tty; echo TERM=$TERM; read line; echo got:$line; exit 3")
    check_schema(pty.session, "PtySession")
    assert pty.session["mode"] == "pty"
    assert pty.session["state"] == "running"
    assert b"TERM=xterm-256color" in pty.read_until(b"TERM=xterm-256color")
    reply = pty.write(b"hello\n")
    check_schema(reply, "PtyInputReply")
    assert reply["input_offset"] == 6
    out = pty.drain()
    assert b"hello\r\n" in out, "the terminal echoes typed input"
    assert b"got:hello\r\n" in out
    end = pty.state(wait=8)
    check_schema(end, "PtySession")
    assert (end["state"], end["exit_code"], end["signal"]) == ("exited", 3, None)
    last = pty.read()
    check_schema(last, "PtyOutput")
    assert last["eof"]
    assert last["data"] == ""


def test_no_command_is_an_interactive_bash_with_job_control(agent: Any) -> None:
    """Gym's interactive shell (`shell.py`) opens `create()` with no command."""
    pty = Pty(agent, rows=30, cols=100)
    pty.write(b"echo shell=$0; stty size; sleep 30\n")
    assert b"bash\r\n30 100" in pty.read_until(b"30 100")
    time.sleep(0.3)
    # \x03 through the line discipline: only works with the PTY as controlling terminal.
    pty.write(b"\x03")
    pty.write(b"echo status=$?\n")
    pty.read_until(b"status=130")
    pty.write(b"exit 7\n")
    pty.drain()
    assert pty.state(wait=8)["exit_code"] == 7


def test_resize_reaches_the_terminal_and_its_foreground_job(agent: Any) -> None:
    pty = Pty(
        agent,
        command="trap 'stty size; exit 0' WINCH; stty size; echo ready; "
        "while :; do sleep 0.05; done",
        rows=24,
        cols=80,
    )
    assert b"24 80\r\nready" in pty.read_until(b"ready")
    resp = pty.post("resize", {"rows": 50, "cols": 132})
    assert resp.status == 200
    assert (resp.json()["rows"], resp.json()["cols"]) == (50, 132)
    assert b"50 132" in pty.drain(), "SIGWINCH reached the job, and stty sees the new size"


def test_signal_goes_to_the_process_group(agent: Any) -> None:
    pty = Pty(agent, command="trap 'echo got-term; exit 9' TERM; echo ready; sleep 30 & wait")
    pty.read_until(b"ready")
    resp = pty.post("signal", {"signal": "SIGTERM"})
    assert resp.status == 200, resp.body
    assert b"got-term" in pty.drain()
    assert pty.state(wait=8)["exit_code"] == 9
    killed = Pty(agent, command="echo ready; exec sleep 30")
    killed.read_until(b"ready")
    assert killed.post("signal", {"signal": "SIGKILL"}).status == 200
    end = killed.state(wait=8)
    assert (end["state"], end["exit_code"], end["signal"]) == ("exited", None, 9)


def test_session_runs_as_the_asked_user_never_root(agent: Any) -> None:
    """The same user switch as exec jobs: uid, primary group, supplementary groups, HOME."""
    pty = Pty(agent, command="id -u; id -G; echo home=$HOME", user="nobody")
    out = pty.drain().decode()
    uid, groups, home = out.split("\r\n")[:3]
    assert uid == "65534"
    assert "0" not in groups.split(), "root's groups must not leak to the user"
    assert home.startswith("home=")
    assert home != "home=/root"
    by_uid = Pty(agent, command=["id", "-u"], user=4321)
    assert by_uid.drain().strip() == b"4321"


def test_pipe_mode_keeps_stdout_and_stderr_apart(agent: Any) -> None:
    pty = Pty(agent, command="read x; echo out:$x; echo err:$x >&2; exit 5", pty=False)
    assert pty.session["mode"] == "pipe"
    pty.write(b"abc\n")
    assert pty.drain() == b"out:abc\n", "no terminal: no echo, no \\r"
    assert pty.drain(stream="stderr") == b"err:abc\n"
    assert pty.state(wait=8)["exit_code"] == 5
    tty = Pty(agent, command="tty; echo err >&2")
    assert b"/dev/pts/" in tty.drain(), "pty mode: stderr is the terminal too"
    assert tty.drain(stream="stderr") == b""


def test_a_lost_response_is_read_again_from_its_offset(agent: Any) -> None:
    pty = Pty(agent, command="printf 'abcdef'; sleep 30")
    first = pty.read(offset=0, wait=8)
    while base64.b64decode(first["data"]) != b"abcdef":
        time.sleep(0.05)
        first = pty.read(offset=0, wait=8)
    again = pty.read(offset=0)
    assert again["data"] == first["data"]
    assert again["skipped"] == 0
    part = pty.read(offset=2)
    assert base64.b64decode(part["data"]) == b"cdef"
    assert (part["offset"], part["next_offset"]) == (2, 6)
    past = agent.request("GET", f"/v1/pty/{pty.id}/output?offset=7")
    assert past.status == 409
    assert past.json()["error"]["code"] == "offset_mismatch"
    assert "offset 6" in past.json()["error"]["message"]
    pty.close()


def test_resent_input_is_not_typed_twice(agent: Any) -> None:
    pty = Pty(agent, command="head -c 5; echo; exit 0", pty=False)
    headers = {"Content-Type": "application/octet-stream"}
    path = f"/v1/pty/{pty.id}/input"
    assert agent.request("POST", f"{path}?offset=0", body=b"ab", headers=headers).status == 200
    resent = agent.request("POST", f"{path}?offset=0", body=b"abc", headers=headers)
    assert resent.json()["input_offset"] == 3, "only the new byte is taken"
    gap = agent.request("POST", f"{path}?offset=9", body=b"x", headers=headers)
    assert gap.status == 409
    assert gap.json()["error"]["code"] == "offset_mismatch"
    assert "offset 3" in gap.json()["error"]["message"]
    assert agent.request("POST", f"{path}?offset=3", body=b"de", headers=headers).status == 200
    assert pty.drain() == b"abcde\n"


def test_flow_control_bounds_memory_and_loses_nothing(agent: Any) -> None:
    """3 MiB through a 1 MiB buffer: the program waits for the reader, no byte is dropped."""
    size = 3 * MiB
    pty = Pty(agent, command=f"head -c {size} /dev/zero | tr '\\0' a; echo done >&2", pty=False)
    time.sleep(1.0)
    held = pty.state()
    assert held["state"] == "running", "the writer is blocked, not finished"
    assert MiB <= held["stdout_offset"] <= MiB + 512 * 1024
    total = b""
    while True:
        doc = pty.read()
        assert doc["skipped"] == 0
        total += base64.b64decode(doc["data"])
        if doc["eof"]:
            break
    assert len(total) == size
    assert total == b"a" * size
    assert pty.drain(stream="stderr") == b"done\n"
    old = pty.read(offset=0)
    assert old["skipped"] >= MiB, "bytes read long ago are dropped; the newest 1 MiB is kept"
    assert old["offset"] <= size - MiB


@pytest.mark.slow
def test_long_poll_answers_as_soon_as_output_comes(agent: Any) -> None:
    """A read waiting for output answers when the output comes, not at the end of its wait:
    the output only exists after the input is typed, and the answer comes well inside the 8 s
    wait (a one-sided bound: the real limit)."""
    pty = Pty(agent, command="read x; echo got:$x; sleep 30", pty=False)
    # The writer needs a connection of its own: the fixture's client is one keep-alive socket.
    other = type(agent)(agent.proc, agent.port, agent.log_path, agent.workdir)
    writer = threading.Thread(target=_type_later, args=(other, pty.id))
    started = time.monotonic()
    writer.start()
    doc = pty.read(wait=8)
    elapsed = time.monotonic() - started
    writer.join()
    other.close_conn()
    assert base64.b64decode(doc["data"]) == b"got:x\n"
    assert elapsed < 6, elapsed
    pty.close()


def _type_later(client: Any, session_id: str) -> None:
    time.sleep(0.3)  # the read is waiting by then
    client.request(
        "POST",
        f"/v1/pty/{session_id}/input?offset=0",
        body=b"x\n",
        headers={"Content-Type": "application/octet-stream"},
    )


@pytest.mark.slow
def test_idle_long_poll_returns_empty_after_wait(agent: Any) -> None:
    """A quiet read is held for its whole wait and answers empty; wait is capped at 8 s, under
    the router's 10 s (real: cmd/atenet/internal/router/xds.go), so no held read outlives the
    router's cut. Scaled down to a 1 s wait; the bound is one-sided (it waited, at least)."""
    pty = Pty(agent, command="sleep 30")
    started = time.monotonic()
    doc = pty.read(wait=1)
    elapsed = time.monotonic() - started
    assert doc["data"] == ""
    assert not doc["eof"]
    assert doc["next_offset"] == doc["offset"] == 0
    assert elapsed >= 0.9, elapsed
    too_long = agent.request("GET", f"/v1/pty/{pty.id}/output?wait=9")
    assert too_long.status == 400
    pty.close()


def test_stragglers_do_not_hold_the_session_open(agent: Any, tmp_path: Path) -> None:
    """As on any terminal, the session leader's exit hangs up its foreground group; a process
    that ignores SIGHUP and still holds the terminal does not keep the session open."""
    hup, immune = tmp_path / "hup.pid", tmp_path / "immune.pid"
    pty = Pty(
        agent,
        command=f"sleep 30 & echo $! > {hup}; "
        f"sh -c 'trap \"\" HUP; echo $$ > {immune}; exec sleep 30' & "
        f"while [ ! -s {immune} ]; do sleep 0.01; done",
    )
    end = pty.state(wait=8)  # answers at the change, else at 8 s with the session still running
    assert end["state"] == "exited"
    assert end["exit_code"] == 0
    hup_pid, immune_pid = int(hup.read_text()), int(immune.read_text())
    assert wait_gone(hup_pid, 5), "the hang-up reached the foreground group"
    assert alive(immune_pid), "closing the terminal kills nothing by itself"
    os.kill(immune_pid, signal.SIGKILL)


def test_delete_kills_the_whole_tree_and_is_idempotent(agent: Any, tmp_path: Path) -> None:
    pidfile = tmp_path / "escaped.pid"
    pty = Pty(agent, command=f"setsid sleep 300 & echo $! > {pidfile}; echo ready; sleep 300")
    pty.read_until(b"ready")
    escaped = int(pidfile.read_text())
    closed = pty.close()
    assert closed["state"] == "killed"
    # sh dies of SIGHUP at once: after the 2 s grace it would have died of SIGKILL
    assert closed["signal"] in (signal.SIGHUP, signal.SIGTERM)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and Path(f"/proc/{escaped}").exists():
        time.sleep(0.05)
    assert not Path(f"/proc/{escaped}").exists(), "a setsid descendant is killed too"
    assert pty.close() == closed
    after = pty.read(offset=0)
    assert after["eof"]
    assert after["data"] == ""
    assert after["skipped"] == closed["stdout_offset"]
    for action, body in (("input", None), ("resize", {"rows": 1, "cols": 1})):
        resp = (
            agent.request("POST", f"/v1/pty/{pty.id}/input", body=b"x")
            if body is None
            else pty.post(action, body)
        )
        assert resp.status == 409, action
        assert resp.json()["error"]["code"] == "session_ended"
    resp = pty.post("signal", {"signal": "SIGINT"})
    assert resp.json()["error"]["code"] == "session_ended"


def test_interactive_shell_is_ended_by_delete_without_waiting_for_sigkill(agent: Any) -> None:
    pty = Pty(agent)  # bash ignores SIGTERM when interactive; SIGHUP ends it
    pty.write(b"echo ready\n")
    pty.read_until(b"ready\r\n")
    closed = pty.close()
    assert closed["state"] == "killed"
    assert closed["signal"] == signal.SIGHUP, "ended by the hang-up, not SIGKILL after the grace"


def test_same_id_is_the_same_session_and_a_different_body_conflicts(
    agent: Any, tmp_path: Path
) -> None:
    marker = tmp_path / "runs"
    body = {"id": "pty-once", "command": f"echo x >> {marker}; sleep 30"}
    first = agent.request("POST", "/v1/pty", json_body=body).json()
    second = agent.request("POST", "/v1/pty", json_body=body).json()
    assert first["id"] == second["id"] == "pty-once"
    other = agent.request("POST", "/v1/pty", json_body={**body, "rows": 40})
    assert other.status == 409
    assert other.json()["error"]["code"] == "id_conflict"
    time.sleep(0.3)
    assert marker.read_text() == "x\n", "one process, whatever the retries"
    agent.request("DELETE", "/v1/pty/pty-once")


def test_a_process_that_cannot_start_is_a_failed_session(agent: Any, tmp_path: Path) -> None:
    missing = agent.request("POST", "/v1/pty", json_body={"command": ["no-such-program-xyz"]})
    assert missing.status == 200
    assert missing.json()["state"] == "failed"
    assert "not found" in missing.json()["error"]
    out = agent.request("GET", f"/v1/pty/{missing.json()['id']}/output?wait=8").json()
    assert out["eof"], "a failed session answers at once, never waits"
    nocwd = agent.request(
        "POST", "/v1/pty", json_body={"command": "true", "cwd": str(tmp_path / "nope")}
    )
    assert nocwd.json()["state"] == "failed"
    assert "does not exist" in nocwd.json()["error"]
    user = agent.request("POST", "/v1/pty", json_body={"user": "no-such-user-xyz"})
    assert user.status == 400
    assert "unknown user" in user.json()["error"]["message"]


@pytest.mark.parametrize(
    ("method", "path", "body", "fragment"),
    [
        ("POST", "/v1/pty", {"rows": 0}, "rows must be an integer 1..65535"),
        ("POST", "/v1/pty", {"cols": 65536}, "cols must be an integer 1..65535"),
        ("POST", "/v1/pty", {"rows": "24"}, "rows must be an integer"),
        ("POST", "/v1/pty", {"cols": 1.5}, "cols must be an integer"),
        ("POST", "/v1/pty", {"rows": True}, "rows must be an integer"),
        ("POST", "/v1/pty", {"pty": "yes"}, "pty must be true"),
        ("POST", "/v1/pty", {"tty": True}, "unknown field(s) ['tty']"),
        ("POST", "/v1/pty", {"command": ""}, "command must not be empty"),
        ("POST", "/v1/pty", {"command": []}, "non-empty list of strings"),
        ("POST", "/v1/pty", {"env": {"A=B": "x"}}, "env name 'A=B' is invalid"),
        ("POST", "/v1/pty", {"cwd": "tmp"}, "cwd must be an absolute path"),
        ("POST", "/v1/pty", {"user": -1}, "out of range"),
        ("POST", "/v1/pty", [1], "the body must be a JSON object"),
        ("POST", "{s}/resize", {"rows": 10}, "rows and cols are both required"),
        ("POST", "{s}/resize", {"rows": 10, "cols": 0}, "cols must be an integer 1..65535"),
        ("POST", "{s}/signal", {"signal": "SIGFOO"}, "signal must be one of SIGHUP"),
        ("POST", "{s}/signal", {"signal": 9}, "signal must be one of"),
        ("GET", "{s}/output?stream=both", None, "stream must be stdout or stderr"),
        ("GET", "{s}/output?offset=-1", None, "offset must be an integer"),
        ("GET", "{s}/output?offset=%D9%A1", None, "offset must be an integer"),
        ("GET", "{s}/output?max_bytes=0", None, "max_bytes must be an integer 1.."),
        ("GET", "{s}/output?wait=nan", None, "wait must be a number"),
        ("GET", "{s}?wait=9", None, "wait must be a number"),
    ],
)
def test_bad_input_is_a_400_that_says_why(
    agent: Any, check_schema: Any, method: str, path: str, body: Any, fragment: str
) -> None:
    target = path
    if "{s}" in path:
        session = agent.request("POST", "/v1/pty", json_body={"command": "sleep 30"}).json()
        target = path.replace("{s}", f"/v1/pty/{session['id']}")
    resp = agent.request(method, target, json_body=body)
    assert resp.status == 400, resp.body
    check_schema(resp.json(), "ErrorBody")
    assert resp.json()["error"]["code"] == "bad_request"
    assert fragment in resp.json()["error"]["message"]
    if "{s}" in path:
        agent.request("DELETE", f"/v1/pty/{session['id']}")


def test_unknown_session_is_404_and_oversized_input_413(agent: Any) -> None:
    for method, path in (
        ("GET", "/v1/pty/nope"),
        ("GET", "/v1/pty/nope/output"),
        ("DELETE", "/v1/pty/nope"),
        ("POST", "/v1/pty/nope/input"),
    ):
        resp = agent.request(method, path)
        assert resp.status == 404, path
        assert resp.json()["error"]["code"] == "not_found"
    pty = Pty(agent, command="sleep 30")
    big = agent.request(
        "POST",
        f"/v1/pty/{pty.id}/input",
        body=b"x" * (MiB + 1),
        headers={"Content-Type": "application/octet-stream"},
    )
    assert big.status == 413
    assert big.json()["error"]["code"] == "too_large"
    pty.close()


def test_unread_input_is_bounded(agent: Any) -> None:
    """A program that never reads its input gets at most 1 MiB queued for it."""
    pty = Pty(agent, command="sleep 30", pty=False)
    chunk = b"y" * (512 * 1024)
    answers = []
    for _ in range(4):
        answers.append(
            agent.request(
                "POST",
                f"/v1/pty/{pty.id}/input?offset={pty.sent}",
                body=chunk,
                headers={"Content-Type": "application/octet-stream"},
            )
        )
        if answers[-1].status == 200:
            pty.sent += len(chunk)
    refused = [a for a in answers if a.status != 200]
    assert refused, "more than 1 MiB plus the pipe's buffer must not be accepted"
    assert refused[0].status == 409
    assert refused[0].json()["error"]["code"] == "busy"
    assert pty.state()["input_pending"] <= MiB
    pty.close()


def test_at_most_64_sessions_run_at_once(agent_factory: Any) -> None:
    inst = agent_factory()
    ids = []
    for _ in range(64):
        resp = inst.request("POST", "/v1/pty", json_body={"command": ["sleep", "60"]})
        assert resp.status == 200
        ids.append(resp.json()["id"])
    over = inst.request("POST", "/v1/pty", json_body={"command": ["sleep", "60"]})
    assert over.status == 429
    assert over.json()["error"]["code"] == "too_many_sessions"
    assert inst.request("DELETE", f"/v1/pty/{ids.pop()}").status == 200
    assert inst.request("POST", "/v1/pty", json_body={"command": ["true"]}).status == 200


def test_sigterm_ends_every_session(agent_factory: Any, tmp_path: Path) -> None:
    inst = agent_factory()
    pidfile = tmp_path / "shell.pid"
    pty = Pty(inst, command=f"echo $$ > {pidfile}; echo ready; sleep 300")
    pty.read_until(b"ready")
    pid = int(pidfile.read_text())
    assert inst.stop() == 0
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
        time.sleep(0.05)
    assert not Path(f"/proc/{pid}").exists()
    assert "Traceback" not in inst.log_text()


def test_no_zombies_after_sessions(agent: Any) -> None:
    for _ in range(5):
        Pty(agent, command="exit 0").state(wait=8)
    children = subprocess.run(
        ["ps", "-o", "stat=", "--ppid", str(agent.proc.pid)],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    assert not [s for s in children if s.startswith("Z")]


def test_no_terminal_device_is_a_failed_session_that_says_why(agent_factory: Any) -> None:
    """An image whose /dev has no devpts: the session fails and names what is missing, and
    pipe mode still works."""
    inst = agent_factory(sandbox=True, mounts=("--tmpfs", "/dev/pts"))
    resp = inst.request("POST", "/v1/pty", json_body={"command": "true"})
    assert resp.status == 200
    assert resp.json()["state"] == "failed"
    assert "/dev/ptmx" in resp.json()["error"]
    piped = Pty(inst, command="echo piped", pty=False)
    assert piped.drain() == b"piped\n"


def _ignored_signals(text: str) -> int:
    """The SigIgn mask from a /proc/<pid>/status dump."""
    for line in text.splitlines():
        if line.startswith("SigIgn:"):
            return int(line.split()[1], 16)
    raise AssertionError(f"no SigIgn line in {text!r}")


def test_a_launcher_s_ignored_hangup_does_not_reach_the_sandbox(agent_factory: Any) -> None:
    """An agent started under nohup (SIGHUP ignored, and SIG_IGN survives exec) still gives
    its sessions and jobs the default dispositions a terminal's processes have, so a hang-up
    ends a session's foreground job; the agent itself keeps ignoring the hang-up."""
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        started = agent_factory()
    finally:
        signal.signal(signal.SIGHUP, before)
    hup = 1 << (signal.SIGHUP - 1)
    pty = Pty(started, command="cat /proc/self/status")
    assert pty.state(wait=8)["state"] == "exited"
    assert not _ignored_signals(pty.read_until(b"SigIgn").decode()) & hup
    job = started.exec(command=["cat", "/proc/self/status"]).json()
    assert not _ignored_signals(job["stdout"]) & hup, job
    started.proc.send_signal(signal.SIGHUP)
    time.sleep(0.2)
    assert started.proc.poll() is None, "the agent keeps ignoring the hang-up it was told to"
