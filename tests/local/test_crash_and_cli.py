"""`local up` as a real process: SIGKILL loses no record, a restart adopts running sandboxes
and crashes the ones it cannot, `down` crashes running actors unless `--suspend`, and leaves
nothing behind; a June state folder is refused until purged.

These run the CLI exactly as a user does (`python -m gym_substrate.cli local up ...`) and kill it
with SIGKILL, because only a separate process shows what survives a crash of the control plane.
Crash semantics are upstream's (cmd/ateapi/internal/controlapi/crash.go): an
actor whose worker goes away is CRASHED with `status.crash`, refuses resume until RevertActor
takes it back to SUSPENDED at its last durable snapshot.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from click.testing import CliRunner
from local_helpers import (
    RUNTIMES,
    late_workload,
    new_actor_request,
    new_atespace_request,
    object_ref,
    state_of,
    target,
)

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.ateapi import ateapi_pb2_grpc as pb_grpc
from gym_substrate.cli.local import local
from gym_substrate.local.control.store import Store
from gym_substrate.local.statedir import (
    REGISTRY_ENV,
    read_backend_info,
    runtime_for_state,
    state_leftovers,
)

WORKER_GONE = "worker pod went away while hosting the actor"
ATEOM_RESTARTED = "ateom restarted while hosting the actor"


class Up:
    """One `local up` process in the foreground, its log captured to a file."""

    def __init__(self, state: Path, runtime: str, *extra: str, workers: int = 3) -> None:
        self.state = state
        self.log = state.parent / f"up-{time.monotonic_ns()}.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gym_substrate.cli",
                    "local",
                    "up",
                    "--state-dir",
                    str(state),
                    "--runtime",
                    runtime,
                    "--workers",
                    str(workers),
                    "--actors-per-worker",
                    "1",
                    "--api-port",
                    "0",
                    "--router-port",
                    "0",
                    "--admin-port",
                    "0",
                    *extra,
                ],  # fmt: skip
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 120
        while True:
            info = read_backend_info(state)
            if info is not None and info["pid"] == self.proc.pid:
                break
            assert self.proc.poll() is None, self.log.read_text()
            assert time.monotonic() < deadline, "local up did not start in 120 s"
            time.sleep(0.05)
        self.info = info
        self.channel = grpc.insecure_channel(info["api"])
        self.stub: Any = pb_grpc.ControlStub(self.channel)

    def kill(self) -> None:
        self.channel.close()
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        self.channel.close()
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(120)

    def http(self, actor: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """A request to the actor through the router (`ate-target-actor`)."""
        request = urllib.request.Request(
            self.info["router"] + path,
            data=json.dumps(body).encode() if body is not None else None,
            headers={**target(actor), "Content-Type": "application/json"},
            method="POST" if body is not None else "GET",
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.loads(response.read())

    def actors(self) -> dict[str, Any]:
        listed = self.stub.ListActors(pb.ListActorsRequest(atespace="t"))  # not the golden ones
        return {a.metadata.name: a for a in listed.actors}

    def create(self, *names: str, template: str = "sandbox") -> None:
        try:
            self.stub.CreateAtespace(new_atespace_request("t"))
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.ALREADY_EXISTS:
                raise
        for name in names:
            self.stub.CreateActor(new_actor_request(name, template=object_ref(template, "local")))

    def resume(self, name: str) -> Any:
        return self.stub.ResumeActor(pb.ResumeActorRequest(actor=object_ref(name))).actor

    def wait_golden(self, template: str = "sandbox") -> None:
        _wait_golden(self.stub, template)


def _wait_golden(stub: Any, template: str = "sandbox") -> None:
    """Until local/<template> has its golden tag (its build runs in the background)."""
    ref = object_ref(template, "local")
    while True:
        found = stub.GetActorTemplate(pb.GetActorTemplateRequest(actor_template=ref))
        golden = found.status.golden_snapshot_status
        assert not golden.error_message, golden.error_message
        if golden.HasField("golden_tag"):
            return
        time.sleep(0.05)


def _cli(*args: str) -> Any:
    return CliRunner().invoke(local, list(args))


@pytest.fixture
def state(tmp_path: Path, runtime_name: str) -> Iterator[Path]:
    folder = tmp_path / "state"
    yield folder
    # whatever happened, leave nothing running
    _cli("down", "--state-dir", str(folder))


def _stop_sandbox(state: Path, name: str) -> None:
    """Make an actor's sandbox vanish behind the control plane's back."""
    store = Store(state / "state.db")
    try:
        from gym_substrate.local.control.records import ActorRecord

        (record,) = [r for r in store.load(ActorRecord) if r.key == f"t/{name}"]
    finally:
        store.close()
    runtime = runtime_for_state(state)
    assert runtime is not None
    assert record.handle

    async def stop() -> None:
        await runtime.stop(record.handle)
        await runtime.close()

    asyncio.run(stop())


def _snapshots(actor: Any) -> list[tuple[int, int]]:
    return [(s.generation, s.owner) for s in actor.status.snapshots]


@pytest.mark.parametrize("runtime_name", RUNTIMES)
def test_sigkill_loses_nothing_and_restart_adopts(state: Path, runtime_name: str) -> None:
    up = Up(state, runtime_name, "--rootfs", "host")
    up.wait_golden()
    up.create("run1", "paused1", "susp1", "new1")
    for name in ("run1", "paused1", "susp1"):
        up.resume(name)
    job = up.http("run1", "/v1/exec", {"id": "ctr", "command": "sleep 300", "timeout_s": 600})
    assert job["state"] == "running"
    up.stub.PauseActor(pb.PauseActorRequest(actor=object_ref("paused1")))
    up.stub.SuspendActor(pb.SuspendActorRequest(actor=object_ref("susp1")))
    before = up.actors()

    up.kill()
    assert asyncio.run(state_leftovers(state)), "a crash must leave running sandboxes to adopt"

    up = Up(state, runtime_name, "--rootfs", "host")
    after = up.actors()
    assert sorted(after) == sorted(before) == ["new1", "paused1", "run1", "susp1"]
    for name, actor in after.items():
        assert state_of(actor) == state_of(before[name]), name
        assert actor.metadata.version >= before[name].metadata.version
        assert _snapshots(actor) == _snapshots(before[name]), name
    assert [state_of(after[n]) for n in ("run1", "paused1", "susp1", "new1")] == [
        "RUNNING", "PAUSED", "SUSPENDED", "SUSPENDED",
    ]  # fmt: skip
    # adopted, not restarted: the same worker address, the job's process still there
    before_ips = before["run1"].status.worker_assignment.worker_pod_ips
    assert after["run1"].status.worker_assignment.worker_pod_ips == before_ips
    assert up.http("run1", "/v1/exec/ctr")["state"] == "running"
    assert state_of(up.resume("paused1")) == "RUNNING"

    # the sandbox of run1 vanishes while the control plane is down: CRASHED, not silently older
    up.kill()
    _stop_sandbox(state, "run1")
    up = Up(state, runtime_name, "--rootfs", "host")
    after = up.actors()
    assert state_of(after["run1"]) == "CRASHED"
    assert after["run1"].status.crash.message == ATEOM_RESTARTED
    assert state_of(after["paused1"]) == "RUNNING"
    with pytest.raises(grpc.RpcError) as refused:
        up.resume("run1")
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    reverted = up.stub.RevertActor(pb.RevertActorRequest(actor=object_ref("run1"))).actor
    assert state_of(reverted) == "SUSPENDED"
    assert not reverted.status.HasField("crash")
    assert state_of(up.resume("run1")) == "RUNNING"

    # SIGKILL in the middle of a resume: the actor was RESUMING on a worker that went away
    slow = pb.ActorTemplate()
    slow.CopyFrom(
        up.stub.GetActorTemplate(
            pb.GetActorTemplateRequest(actor_template=object_ref("sandbox", "local"))
        )
    )
    slow.metadata.Clear()
    slow.metadata.atespace, slow.metadata.name = "local", "slow"
    slow.ClearField("status")
    del slow.containers[0].command[:]
    del slow.containers[0].args[:]
    slow.containers[0].command.extend(late_workload(3))
    up.stub.CreateActorTemplate(pb.CreateActorTemplateRequest(actor_template=slow))
    up.wait_golden("slow")  # its golden actor holds a worker until then
    up.create("mid", template="slow")
    pending = up.stub.ResumeActor.future(pb.ResumeActorRequest(actor=object_ref("mid")))
    while state_of(up.stub.GetActor(pb.GetActorRequest(actor=object_ref("mid")))) != "RESUMING":
        time.sleep(0.01)
    up.kill()
    pending.cancel()
    up = Up(state, runtime_name, "--rootfs", "host")
    after = up.actors()
    assert sorted(after) == ["mid", "new1", "paused1", "run1", "susp1"]
    # Killed while RESUMING: a sandbox the resume had already started is adopted once it is
    # ready (issue 24: it used to be killed), one it had not is CRASHED; never silently
    # anything else (test_crash_consistency.py pins each case down with a crash phase).
    if state_of(after["mid"]) == "RUNNING":
        assert up.http("mid", "/readyz")["actor_id"] == "mid"
    else:
        assert state_of(after["mid"]) == "CRASHED"
        assert after["mid"].status.crash.message == f"resume failed: {ATEOM_RESTARTED}"
        assert not after["mid"].status.HasField("worker_assignment")
    up.stop()
    assert up.proc.returncode == 0, up.log.read_text()
    assert asyncio.run(state_leftovers(state)) == []


@pytest.mark.parametrize("runtime_name", RUNTIMES)
def test_down_crashes_running_actors_unless_suspend(state: Path, runtime_name: str) -> None:
    common = ("--state-dir", str(state))
    up = Up(state, runtime_name, "--rootfs", "host", workers=2)
    up.wait_golden()
    up.create("kept")
    up.resume("kept")
    assert up.http("kept", "/v1/exec?wait=8", {"command": "echo one > f"})["exit_code"] == 0
    down = _cli("down", *common)
    assert down.exit_code == 0, down.output
    assert f"stopped the backend (pid {up.proc.pid})" in down.output
    up.proc.wait(60)
    assert asyncio.run(state_leftovers(state)) == []
    stored = json.loads(_cli("status", "--json", *common).output)
    (kept,) = [a for a in stored["actors"] if a["actor"] == "kept"]
    assert (kept["state"], kept["crash"]) == ("CRASHED", WORKER_GONE)
    shown = _cli("status", *common)
    assert WORKER_GONE in shown.output

    # the next start keeps it CRASHED until a revert (to the golden snapshot it started from)
    up = Up(state, runtime_name, "--rootfs", "host", workers=2)
    actor = up.actors()["kept"]
    assert state_of(actor) == "CRASHED"
    assert actor.status.crash.message == WORKER_GONE
    with pytest.raises(grpc.RpcError) as refused:
        up.resume("kept")
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    up.stub.RevertActor(pb.RevertActorRequest(actor=object_ref("kept")))
    up.resume("kept")
    assert up.http("kept", "/v1/exec?wait=8", {"command": "cat f"})["exit_code"] != 0

    # `down --suspend` suspends it first: the next start resumes it where it was
    assert up.http("kept", "/v1/exec?wait=8", {"command": "echo two > f"})["exit_code"] == 0
    up.http("kept", "/v1/exec", {"id": "ctr", "command": "sleep 300", "timeout_s": 600})
    down = _cli("down", "--suspend", *common)
    assert down.exit_code == 0, down.output
    up.proc.wait(60)
    assert asyncio.run(state_leftovers(state)) == []
    up = Up(state, runtime_name, "--rootfs", "host", workers=2)
    actor = up.actors()["kept"]
    assert state_of(actor) == "SUSPENDED"
    assert not actor.status.HasField("crash")
    up.resume("kept")
    assert up.http("kept", "/v1/exec?wait=8", {"command": "cat f"})["stdout"] == "two\n"
    if runtime_name == "gvisor":  # memory survives suspend: the job is still there
        assert up.http("kept", "/v1/exec/ctr")["state"] == "running"
    up.stop()
    assert asyncio.run(state_leftovers(state)) == []


@pytest.mark.parametrize("runtime_name", RUNTIMES)
def test_down_after_a_crash_adopts_first_and_says_what_it_did(
    state: Path, runtime_name: str
) -> None:
    """Issue 24: `local down` after a `kill -9` used to remove running sandboxes unseen (the
    next start found their actors gone). Now it adopts them as `up` would, then suspends them
    (`--suspend`: nothing lost) or crashes them as a live backend's `down` does, printing each;
    `--discard` drops them without adopting, and says so."""
    common = ("--state-dir", str(state))
    up = Up(state, runtime_name, "--rootfs", "host", workers=2)
    up.wait_golden()
    up.create("kept", "gone")
    for name in ("kept", "gone"):
        up.resume(name)
        assert up.http(name, "/v1/exec?wait=8", {"command": "echo one > f"})["exit_code"] == 0
    up.http("kept", "/v1/exec", {"id": "ctr", "command": "sleep 300", "timeout_s": 600})
    up.stub.PauseActor(pb.PauseActorRequest(actor=object_ref("gone")))
    up.resume("gone")
    up.kill()

    down = _cli("down", "--suspend", *common)
    assert down.exit_code == 0, down.output
    assert "actor t/kept (RUNNING): its sandbox was adopted, now SUSPENDED" in down.output
    assert "actor t/gone (RUNNING): its sandbox was adopted, now SUSPENDED" in down.output
    assert asyncio.run(state_leftovers(state)) == []
    up = Up(state, runtime_name, "--rootfs", "host", workers=2)
    assert {n: state_of(a) for n, a in up.actors().items()} == {
        "kept": "SUSPENDED",
        "gone": "SUSPENDED",
    }
    up.resume("kept")
    assert up.http("kept", "/v1/exec?wait=8", {"command": "cat f"})["stdout"] == "one\n"
    if runtime_name == "gvisor":  # memory survives suspend: the job is still there
        assert up.http("kept", "/v1/exec/ctr")["state"] == "running"
    up.kill()

    down = _cli("down", *common)  # no --suspend: CRASHED, as a live backend's down does
    assert down.exit_code == 0, down.output
    assert f"actor t/kept (RUNNING): CRASHED: {WORKER_GONE}" in down.output
    assert "`local down --suspend` keeps a running actor's state" in down.output
    stored = json.loads(_cli("status", "--json", *common).output)
    (kept,) = [a for a in stored["actors"] if a["actor"] == "kept"]
    assert (kept["state"], kept["crash"]) == ("CRASHED", WORKER_GONE)

    up = Up(state, runtime_name, "--rootfs", "host", workers=2)
    up.resume("gone")
    up.kill()
    assert _cli("down", "--suspend", "--discard", *common).exit_code == 1
    down = _cli("down", "--discard", *common)
    assert down.exit_code == 0, down.output
    assert "discarded: actor t/gone RUNNING: its sandbox is removed without a checkpoint" in (
        down.output
    )
    assert asyncio.run(state_leftovers(state)) == []


def test_daemon_status_down(state: Path, runtime_name: str) -> None:
    common = ["--state-dir", str(state)]
    ports = ["--api-port", "0", "--router-port", "0", "--admin-port", "0"]
    result = _cli(
        "up", "--daemon", "--runtime", runtime_name, "--workers", "2", "--actors-per-worker", "3",
        "--parked-requests", "8", "--resume-budget-s", "2", *ports, *common,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "capacity: 2 workers x 3 actors (6 running at once)" in result.output
    assert "connection:" in result.output
    assert "plaintext: true" in result.output
    assert "router (header ate-target-actor: <atespace>/<actor>)" in result.output
    info = read_backend_info(state)
    assert info is not None
    assert info["admin"].startswith("http://127.0.0.1:")
    assert info["admin"] != info["router"]
    assert f"{info['admin']}/metrics" in result.output
    again = _cli("up", "--runtime", runtime_name, *common)
    assert again.exit_code != 0
    assert "already runs" in again.output

    channel = grpc.insecure_channel(info["api"])
    stub: Any = pb_grpc.ControlStub(channel)
    _wait_golden(stub)  # then no golden actor holds a worker
    stub.CreateAtespace(new_atespace_request("t"))
    stub.CreateActor(new_actor_request("a1"))
    stub.ResumeActor(pb.ResumeActorRequest(actor=object_ref("a1")))
    channel.close()

    status = _cli("status", "--json", *common)
    assert status.exit_code == 0, status.output
    data = json.loads(status.output)
    assert data["running"] is True
    assert data["runtime"] == runtime_name
    assert data["admin"] == info["admin"]
    assert [(w["capacity"], w["state"]) for w in data["workers"]] == [(3, "ACTIVE")] * 2
    (holder,) = [w for w in data["workers"] if w["allocated"]]
    assert holder["actors"] == ["t/a1"]
    (a1,) = [a for a in data["actors"] if a["actor"] == "a1"]
    assert (a1["state"], a1["worker"], a1["crash"]) == ("RUNNING", holder["worker"], "")
    (template,) = data["templates"]
    assert template["template"] == "local/sandbox"
    shown = _cli("status", *common)
    assert info["admin"] in shown.output
    assert "2 workers x 3 actors" in shown.output
    assert holder["worker"] in shown.output

    down = _cli("down", *common)
    assert down.exit_code == 0, down.output
    assert read_backend_info(state) is None
    with pytest.raises(ProcessLookupError):
        os.kill(int(info["pid"]), 0)
    gone = _cli("status", "--json", *common)
    stored = json.loads(gone.output)
    assert stored["running"] is False
    assert [t["template"] for t in stored["templates"]] == ["local/sandbox"]  # kept on disk
    (a1,) = [a for a in stored["actors"] if a["actor"] == "a1"]
    assert (a1["state"], a1["crash"]) == ("CRASHED", WORKER_GONE)
    table = _cli("status", *common)
    assert table.exit_code == 0
    assert "no backend is running" in table.output


def test_up_refuses_more_actors_than_the_backend_runs(tmp_path: Path) -> None:
    result = _cli(
        "up", "--workers", "5", "--actors-per-worker", "60", "--state-dir", str(tmp_path / "s")
    )
    assert result.exit_code == 1
    assert "--workers 5 x --actors-per-worker 60 is 300 actors" in result.output
    assert not (tmp_path / "s").exists()
    for flag, value in (("--parked-requests", "-1"), ("--resume-budget-s", "0")):
        result = _cli("up", flag, value, "--state-dir", str(tmp_path / "s"))
        assert result.exit_code == 2, result.output
        assert f"Invalid value for '{flag}'" in result.output
    assert not (tmp_path / "s").exists()


# the June backend's tables (store.py before the current API), enough for a stale folder
_JUNE_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE atespaces (name TEXT PRIMARY KEY, created_at REAL NOT NULL);
CREATE TABLE actors (atespace TEXT NOT NULL, actor_id TEXT NOT NULL, body TEXT NOT NULL,
    PRIMARY KEY (atespace, actor_id));
CREATE TABLE workers (slot INTEGER PRIMARY KEY, uid TEXT NOT NULL, version INTEGER NOT NULL);
"""


def test_a_june_state_folder_is_refused_until_purged(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    db = sqlite3.connect(state / "state.db")
    db.executescript(_JUNE_SCHEMA)
    db.executemany(
        "INSERT INTO meta VALUES (?, ?)",
        [("runtime", "process"), ("instance", "gsjune0"), ("workers", "1")],
    )
    db.execute("INSERT INTO actors VALUES ('t', 'a', '{\"status\": \"STATUS_SUSPENDED\"}')")
    db.commit()
    db.close()
    (state / "snapshots").mkdir()
    (state / "rootfs").mkdir()  # the shared Debian build of the default state folder stays
    common = ["--state-dir", str(state)]
    stale = "was written by a local backend that spoke the June 2026 ateapi"
    fix = "Remove it with `gym-substrate local down --purge` or pick a new --state-dir"
    for args in (
        ["up", "--runtime", "process", "--rootfs", "host", "--api-port", "0",
         "--router-port", "0", "--admin-port", "0"],
        ["status"],
        ["status", "--json"],
    ):  # fmt: skip
        result = _cli(*args, *common)
        assert result.exit_code == 1, result.output
        assert stale in result.output
        assert fix in result.output
    assert not (state / "state.db-wal").exists(), "a refused state.db is left as it was"
    purged = _cli("down", "--purge", *common)
    assert purged.exit_code == 0, purged.output
    assert f"purged: {state / 'state.db'}" in purged.output
    assert sorted(p.name for p in state.iterdir()) == ["rootfs"]
    fresh = _cli("status", "--json", *common)
    assert json.loads(fresh.output) == {"running": False, "state_dir": str(state)}

    not_state = tmp_path / "home"
    not_state.mkdir()
    (not_state / "notes.txt").write_text("mine")
    refused = _cli("down", "--purge", "--state-dir", str(not_state))
    assert refused.exit_code == 1
    assert "not a gym-substrate state folder; nothing was removed" in refused.output
    assert (not_state / "notes.txt").exists()
    both = _cli("down", "--orphans", "--purge")
    assert both.exit_code == 1
    assert "--orphans cleans up every dead backend" in both.output


@pytest.mark.parametrize(
    ("runtime_name", "how"),
    [
        ("process", "state-dir"),
        ("process", "orphans"),
        pytest.param("gvisor", "state-dir", marks=pytest.mark.runsc),
    ],
)
def test_down_after_interrupted_run_leaves_nothing(
    state: Path, runtime_name: str, how: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a private registry: `down --orphans` must not touch other test sessions' backends
    monkeypatch.setenv(REGISTRY_ENV, str(tmp_path / "registry"))
    up = Up(state, runtime_name, "--rootfs", "host", workers=2)
    up.wait_golden()
    up.create("orph")
    up.resume("orph")
    # a job with a grandchild, then the agent itself dies too: only the marker finds the rest
    up.http("orph", "/v1/exec", {"command": "sh -c 'sleep 300 & sleep 300'", "timeout_s": 600})
    up.kill()
    if runtime_name == "process":
        # the agent dies too, orphaning its job's processes: only their marker finds them now
        for entry in (state / "runtime" / runtime_name / "procs").glob("*.json"):
            os.kill(json.loads(entry.read_text())["pid"], signal.SIGKILL)
        time.sleep(0.2)
    assert asyncio.run(state_leftovers(state)), "the orphaned job processes should still run"
    assert [p.name for p in (tmp_path / "registry").iterdir()] == [up.info["instance"]]
    chosen = ["--state-dir", str(state)] if how == "state-dir" else ["--orphans"]
    result = _cli("down", *chosen)
    assert result.exit_code == 0, result.output
    assert "removed leftover" in result.output
    assert asyncio.run(state_leftovers(state)) == []
    if how == "orphans":
        assert list((tmp_path / "registry").iterdir()) == []


def test_orphan_cleanup_spares_a_backend_that_is_still_starting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`down --orphans` must judge liveness by the state folder's lock: a backend that holds
    it but has not written backend.json yet (still starting) is alive."""
    import fcntl
    import secrets

    from gym_substrate.local.runtimes.process import INSTANCE_ENV
    from gym_substrate.local.statedir import cleanup_orphans

    registry = tmp_path / "registry"
    registry.mkdir()
    monkeypatch.setenv(REGISTRY_ENV, str(registry))
    instance = "gsorph" + secrets.token_hex(2)
    state = tmp_path / "state"
    state.mkdir()
    (registry / instance).write_text(
        json.dumps({"state_dir": str(state), "runtime": "process", "workers": 1})
    )
    # one of its sandboxes, already running while the backend finishes starting
    sandbox = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)"],
        env={**os.environ, INSTANCE_ENV: instance},
    )
    lock_fd = os.open(state / "backend.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(lock_fd, fcntl.LOCK_EX)
    try:
        asyncio.run(cleanup_orphans())
        assert sandbox.poll() is None, "the starting backend's sandbox was killed"
        assert (registry / instance).exists()
        os.close(lock_fd)
        lock_fd = -1
        # once nobody holds the lock the backend is dead, and its leftovers go
        asyncio.run(cleanup_orphans())
        assert sandbox.wait(timeout=10) is not None
        asyncio.run(cleanup_orphans())  # a SIGKILLed process may outlive the first check
        assert not (registry / instance).exists()
    finally:
        if lock_fd >= 0:
            os.close(lock_fd)
        if sandbox.poll() is None:
            sandbox.kill()
            sandbox.wait()


def test_down_spares_a_backend_that_is_still_starting(tmp_path: Path) -> None:
    """`local down` finds no backend.json while a backend is still starting; it must not tear
    down that backend's sandboxes from under it."""
    import fcntl
    import secrets

    from gym_substrate.local.runtimes.process import INSTANCE_ENV

    instance = "gsdown" + secrets.token_hex(2)
    state = tmp_path / "state"
    store = Store(state / "state.db")
    for key, value in (("runtime", "process"), ("instance", instance), ("workers", "1")):
        store.set_meta(key, value)
    store.close()
    sandbox = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)"],
        env={**os.environ, INSTANCE_ENV: instance},
    )
    lock_fd = os.open(state / "backend.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(lock_fd, fcntl.LOCK_EX)
    try:
        result = _cli("down", "--state-dir", str(state))
        assert result.exit_code == 1, result.output
        assert "still holds" in result.output
        assert sandbox.poll() is None, "the starting backend's sandbox was killed"
        os.close(lock_fd)
        lock_fd = -1
        result = _cli("down", "--state-dir", str(state))
        assert result.exit_code == 0, result.output
        assert sandbox.wait(timeout=10) is not None
    finally:
        if lock_fd >= 0:
            os.close(lock_fd)
        if sandbox.poll() is None:
            sandbox.kill()
            sandbox.wait()


def test_two_backends_side_by_side_with_free_chosen_ports(tmp_path: Path) -> None:
    """Issue 29: `local up --api-port 0 --router-port 0` still bound the admin listener to
    47090, so a second backend on the machine failed to start. With the other two free-chosen
    the admin port is too: both run at once, each printing its own admin address."""
    folders = [tmp_path / "one", tmp_path / "two"]
    ports = ["--api-port", "0", "--router-port", "0"]
    try:
        admins = []
        for folder in folders:
            result = _cli(
                "up", "--daemon", "--runtime", "process", "--rootfs", "host", "--workers", "1",
                *ports, "--state-dir", str(folder),
            )  # fmt: skip
            assert result.exit_code == 0, result.output
            info = read_backend_info(folder)
            assert info is not None
            assert f"{info['admin']}/metrics" in result.output  # printed
            admins.append(info["admin"])
        assert len(set(admins)) == 2
        assert not any(a.endswith(":47090") for a in admins)
        for folder in folders:
            status = _cli("status", "--json", "--state-dir", str(folder))
            assert status.exit_code == 0, status.output
            assert json.loads(status.output)["running"] is True
    finally:
        for folder in folders:
            _cli("down", "--state-dir", str(folder))
