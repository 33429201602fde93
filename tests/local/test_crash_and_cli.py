"""`local up` as a real process: SIGKILL loses no record, restarts adopt, `down` leaves nothing.

These run the CLI exactly as a user does (`python -m gym_substrate.local up ...`) and kill it
with SIGKILL, because only a separate process shows what survives a crash of the control plane.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
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
from local_helpers import RUNTIMES, host

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.ateapi import ateapi_pb2_grpc as pb_grpc
from gym_substrate.cli.local import local
from gym_substrate.local.statedir import (
    REGISTRY_ENV,
    read_backend_info,
    runtime_for_state,
    state_leftovers,
)
from gym_substrate.local.store import Store

S = pb.Actor.Status


class Up:
    """One `local up` process in the foreground, its log captured to a file."""

    def __init__(self, state: Path, runtime: str, workers: int = 3) -> None:
        self.state = state
        self.log = state.parent / f"up-{time.monotonic_ns()}.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gym_substrate.local",
                    "up",
                    "--state-dir",
                    str(state),
                    "--runtime",
                    runtime,
                    "--workers",
                    str(workers),
                    "--api-port",
                    "0",
                    "--router-port",
                    "0",
                    "--admin-port",
                    "0",
                ],  # fmt: skip
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 60
        while True:
            info = read_backend_info(state)
            if info is not None and info["pid"] == self.proc.pid:
                break
            assert self.proc.poll() is None, self.log.read_text()
            assert time.monotonic() < deadline, "local up did not start in 60 s"
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
        self.proc.wait(60)

    def http(self, actor: str, path: str, body: dict[str, Any] | None = None) -> Any:
        request = urllib.request.Request(
            self.info["router"] + path,
            data=json.dumps(body).encode() if body is not None else None,
            headers={**host(actor), "Content-Type": "application/json"},
            method="POST" if body is not None else "GET",
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    def actors(self) -> dict[str, Any]:
        listed = self.stub.ListActors(pb.ListActorsRequest(atespace="t"))  # not the golden one
        return {a.actor_id: a for a in listed.actors}


@pytest.fixture
def state(tmp_path: Path, runtime_name: str) -> Iterator[Path]:
    folder = tmp_path / "state"
    yield folder
    # whatever happened, leave nothing running
    CliRunner().invoke(local, ["down", "--state-dir", str(folder)])


def _ref(name: str) -> pb.ActorRef:
    return pb.ActorRef(atespace="t", name=name)


def _stop_sandbox(state: Path, actor_id: str) -> None:
    """Make an actor's sandbox vanish behind the control plane's back."""
    store = Store(state / "state.db")
    try:
        (record,) = [r for r in store.actors() if r.actor_id == actor_id]
    finally:
        store.close()
    runtime = runtime_for_state(state)
    assert runtime is not None
    assert record.handle

    async def stop() -> None:
        await runtime.stop(record.handle)
        await runtime.close()

    asyncio.run(stop())


@pytest.mark.parametrize("runtime_name", RUNTIMES)
def test_sigkill_loses_nothing_and_restart_adopts(state: Path, runtime_name: str) -> None:
    up = Up(state, runtime_name)
    stub = up.stub
    stub.CreateAtespace(pb.CreateAtespaceRequest(name="t"))
    for name in ("run1", "paused1", "susp1", "new1"):
        stub.CreateActor(
            pb.CreateActorRequest(
                actor_ref=_ref(name),
                actor_template_namespace="local",
                actor_template_name="sandbox",
            )
        )
    for name in ("run1", "paused1", "susp1"):
        stub.ResumeActor(pb.ResumeActorRequest(actor_ref=_ref(name)))
    job = up.http("run1", "/v1/exec", {"id": "ctr", "command": "sleep 300", "timeout_s": 600})
    assert job["state"] == "running"
    stub.PauseActor(pb.PauseActorRequest(actor_ref=_ref("paused1")))
    stub.SuspendActor(pb.SuspendActorRequest(actor_ref=_ref("susp1")))
    before = up.actors()

    up.kill()
    assert asyncio.run(state_leftovers(state)), "a crash must leave running sandboxes to adopt"

    up = Up(state, runtime_name)
    after = up.actors()
    assert sorted(after) == sorted(before) == ["new1", "paused1", "run1", "susp1"]
    for name, actor in after.items():
        assert actor.status == before[name].status, name
        assert actor.version >= before[name].version
        assert actor.latest_snapshot_info == before[name].latest_snapshot_info
    assert after["run1"].ateom_pod_ip == before["run1"].ateom_pod_ip  # adopted, not restarted
    assert up.http("run1", "/v1/exec/ctr")["state"] == "running"  # its memory is intact
    resumed = up.stub.ResumeActor(pb.ResumeActorRequest(actor_ref=_ref("paused1"))).actor
    assert resumed.status == S.STATUS_RUNNING

    # now the sandbox of run1 vanishes while the control plane is down
    up.kill()
    _stop_sandbox(state, "run1")
    up = Up(state, runtime_name)
    after = up.actors()
    assert after["run1"].status == S.STATUS_SUSPENDED
    assert after["paused1"].status == S.STATUS_RUNNING
    deadline = time.monotonic() + 10
    while "t/run1 was STATUS_RUNNING but its sandbox is gone" not in up.log.read_text():
        assert time.monotonic() < deadline, up.log.read_text()
        time.sleep(0.05)

    # SIGKILL in the middle of a resume: the record survives, the half-started sandbox does not.
    # The template's agent takes a second to start, so the kill lands inside the resume.
    # --host/--port stay in argv, where the process runtime points them at the worker's address
    slow = (
        "metadata: {name: slow, namespace: local}\n"
        "spec:\n  containers: [{name: a, command: [/bin/sh, -c, "
        f'\'sleep 1; exec "$0" "$@"\', {sys.executable}, -m, sandbox_agent, '
        "--host, 0.0.0.0, --port, '80']}]\n"
        f"  snapshotsConfig: {{location: {state / 'slow'}}}\n  rootfs: host\n"
    )
    request = urllib.request.Request(
        up.info["admin"] + "/_local/templates", data=slow.encode(), method="POST"
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        assert response.status == 200
    up.stub.CreateActor(
        pb.CreateActorRequest(
            actor_ref=_ref("mid"), actor_template_namespace="local", actor_template_name="slow"
        )
    )
    pending = up.stub.ResumeActor.future(pb.ResumeActorRequest(actor_ref=_ref("mid"), boot=True))
    deadline = time.monotonic() + 10
    while up.stub.GetActor(pb.GetActorRequest(actor_ref=_ref("mid"))).actor.status != (
        S.STATUS_RESUMING
    ):
        assert time.monotonic() < deadline, "the resume never showed RESUMING"
    up.kill()
    pending.cancel()
    up = Up(state, runtime_name)
    after = up.actors()
    assert sorted(after) == ["mid", "new1", "paused1", "run1", "susp1"]
    assert after["mid"].status == S.STATUS_SUSPENDED
    assert after["mid"].ateom_pod_ip == ""
    up.stop()
    assert up.proc.returncode == 0, up.log.read_text()
    assert asyncio.run(state_leftovers(state)) == []


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
    up = Up(state, runtime_name, workers=2)
    up.stub.CreateAtespace(pb.CreateAtespaceRequest(name="t"))
    up.stub.CreateActor(
        pb.CreateActorRequest(
            actor_ref=_ref("orph"), actor_template_namespace="local", actor_template_name="sandbox"
        )
    )
    up.stub.ResumeActor(pb.ResumeActorRequest(actor_ref=_ref("orph")))
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
    target = ["--state-dir", str(state)] if how == "state-dir" else ["--orphans"]
    result = CliRunner().invoke(local, ["down", *target])
    assert result.exit_code == 0, result.output
    assert "removed leftover" in result.output
    assert asyncio.run(state_leftovers(state)) == []
    if how == "orphans":
        assert list((tmp_path / "registry").iterdir()) == []


def test_daemon_status_down(state: Path, runtime_name: str) -> None:
    runner = CliRunner()
    common = ["--state-dir", str(state)]
    result = runner.invoke(
        local,
        ["up", "--daemon", "--runtime", runtime_name, "--api-port", "0", "--router-port", "0"]
        + ["--admin-port", "0"]
        + common,
    )
    assert result.exit_code == 0, result.output
    assert "connection:" in result.output
    assert "plaintext: true" in result.output
    info = read_backend_info(state)
    assert info is not None
    # the admin listener is its own port, recorded in backend.json and shown by `up`
    assert info["admin"].startswith("http://127.0.0.1:")
    assert info["admin"] != info["router"]
    assert f"{info['admin']}/metrics" in result.output
    again = runner.invoke(local, ["up", "--runtime", runtime_name] + common)
    assert again.exit_code != 0
    assert "already runs" in again.output
    status = runner.invoke(local, ["status", "--json"] + common)
    assert status.exit_code == 0, status.output
    data = json.loads(status.output)
    assert data["running"] is True
    assert data["runtime"] == runtime_name
    assert data["admin"] == info["admin"]
    shown = runner.invoke(local, ["status"] + common)
    assert info["admin"] in shown.output
    assert [t["template"] for t in data["templates"]] == ["local/sandbox"]
    assert len(data["workers"]) == 4
    down = runner.invoke(local, ["down"] + common)
    assert down.exit_code == 0, down.output
    assert read_backend_info(state) is None
    with pytest.raises(ProcessLookupError):
        os.kill(int(info["pid"]), 0)
    gone = runner.invoke(local, ["status", "--json"] + common)
    stored = json.loads(gone.output)
    assert stored["running"] is False
    assert [t["template"] for t in stored["templates"]] == ["local/sandbox"]  # kept on disk
    table = runner.invoke(local, ["status"] + common)
    assert table.exit_code == 0
    assert "no backend is running" in table.output


@pytest.mark.parametrize("runtime_name", RUNTIMES)
def test_down_suspends_running_actors_and_up_resumes_them(state: Path, runtime_name: str) -> None:
    up = Up(state, runtime_name, workers=2)
    up.stub.CreateAtespace(pb.CreateAtespaceRequest(name="t"))
    up.stub.CreateActor(
        pb.CreateActorRequest(
            actor_ref=_ref("kept"), actor_template_namespace="local", actor_template_name="sandbox"
        )
    )
    up.stub.ResumeActor(pb.ResumeActorRequest(actor_ref=_ref("kept")))
    assert up.http("kept", "/v1/exec?wait=8", {"command": "echo kept > f"})["exit_code"] == 0
    up.http("kept", "/v1/exec", {"id": "ctr", "command": "sleep 300", "timeout_s": 600})
    up.stop()  # what `local down` sends
    assert up.proc.returncode == 0, up.log.read_text()
    assert asyncio.run(state_leftovers(state)) == []

    up = Up(state, runtime_name, workers=2)
    actor = up.actors()["kept"]
    assert actor.status == S.STATUS_SUSPENDED
    assert actor.latest_snapshot_info.type == pb.SNAPSHOT_TYPE_EXTERNAL  # suspended, not lost
    up.stub.ResumeActor(pb.ResumeActorRequest(actor_ref=_ref("kept")))
    assert up.http("kept", "/v1/exec?wait=8", {"command": "cat f"})["stdout"] == "kept\n"
    if runtime_name == "gvisor":  # memory survives suspend: the job is still there
        assert up.http("kept", "/v1/exec/ctr")["state"] == "running"
    up.stop()
    assert asyncio.run(state_leftovers(state)) == []


def test_orphan_cleanup_spares_a_backend_that_is_still_starting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`down --orphans` must judge liveness by the state folder's lock: a backend that holds
    it but has not written backend.json yet (golden snapshots still being taken) is alive."""
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
        result = CliRunner().invoke(local, ["down", "--state-dir", str(state)])
        assert result.exit_code == 1, result.output
        assert "still holds" in result.output
        assert sandbox.poll() is None, "the starting backend's sandbox was killed"
        os.close(lock_fd)
        lock_fd = -1
        result = CliRunner().invoke(local, ["down", "--state-dir", str(state)])
        assert result.exit_code == 0, result.output
        assert sandbox.wait(timeout=10) is not None
    finally:
        if lock_fd >= 0:
            os.close(lock_fd)
        if sandbox.poll() is None:
            sandbox.kill()
            sandbox.wait()
