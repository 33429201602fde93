"""`local up --pause-tier freeze` as a real process: frozen actors give their worker back, survive
a SIGKILL of the backend, and `local down` (of the running backend, or after its crash) parks
them into images, leaving nothing on the host.

The backend runs 2 workers of 1 actor; three actors each start a job (`sleep`) whose entry in the
agent's job table lives only in memory, so "the job still runs" after a resume means memory and
processes were kept. Substrate's PauseActor frees the actor's worker
(kagent:controlapi/workflow_pause.go@2559ec02): a third actor must find room once one pauses.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import grpc
import pytest
from click.testing import CliRunner
from gvisor_helpers import kernel_leftovers
from local_helpers import (
    new_actor_request,
    new_atespace_request,
    object_ref,
    snapshots,
    state_of,
    target,
)

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.ateapi import ateapi_pb2_grpc as pb_grpc
from gym_substrate.cli.local import local
from gym_substrate.local.control.store import Store
from gym_substrate.local.statedir import read_backend_info, state_leftovers

pytestmark = pytest.mark.runsc


class _Up:
    def __init__(self, state: Path, *extra: str) -> None:
        self.log = state.parent / f"up-{time.monotonic_ns()}.log"
        argv = [
            sys.executable, "-m", "gym_substrate.cli", "local", "up", "--state-dir", str(state),
            "--runtime", "gvisor", "--rootfs", "host", "--workers", "2",
            "--actors-per-worker", "1", "--api-port", "0", "--router-port", "0",
            "--admin-port", "0", "--pause-tier", "freeze", *extra,
        ]  # fmt: skip
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
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

    def http(self, actor: str, path: str, body: dict[str, Any] | None = None) -> Any:
        request = urllib.request.Request(
            self.info["router"] + path,
            data=json.dumps(body).encode() if body is not None else None,
            headers={**target(actor), "Content-Type": "application/json"},
            method="POST" if body is not None else "GET",
        )
        with urllib.request.urlopen(request, timeout=60) as response:  # noqa: S310
            return json.loads(response.read())

    def call(self, rpc: str, name: str) -> Any:
        request = getattr(pb, f"{rpc}Request")(actor=object_ref(name))
        return getattr(self.stub, rpc)(request).actor

    def actors(self) -> dict[str, Any]:
        listed = self.stub.ListActors(pb.ListActorsRequest(atespace="t"))
        return {a.metadata.name: a for a in listed.actors}

    def wait_golden(self) -> None:
        ref = object_ref("sandbox", "local")
        while True:
            found = self.stub.GetActorTemplate(pb.GetActorTemplateRequest(actor_template=ref))
            golden = found.status.golden_snapshot_status
            assert not golden.error_message, golden.error_message
            if golden.HasField("golden_tag"):
                return
            time.sleep(0.05)

    def kill(self) -> None:
        self.channel.close()
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        self.channel.close()
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(180)


def _instance(state: Path) -> str:
    store = Store(state / "state.db")
    try:
        return store.get_meta("instance") or ""
    finally:
        store.close()


def _storage(actor: Any) -> list[str]:
    """The actor's own snapshots' storage, e.g. ["LOCAL:COMPLETED"] for a paused actor."""
    return [entry for gen, owner, entries in snapshots(actor.status) if owner == "ACTOR"
            for entry in entries]  # fmt: skip


def test_frozen_actors_survive_sigkill_and_down_parks_them(tmp_path: Path) -> None:
    state = tmp_path / "state"
    names = ["f1", "f2", "f3"]
    up = _Up(state)
    try:
        up.wait_golden()
        up.stub.CreateAtespace(new_atespace_request("t"))
        for name in names:
            up.stub.CreateActor(new_actor_request(name))
        for name in names:  # 3 actors, 2 workers: each pause must give its worker back
            assert state_of(up.call("ResumeActor", name)) == "RUNNING"
            job = up.http(name, "/v1/exec", {"id": "j", "command": "sleep 600", "timeout_s": 900})
            assert job["state"] == "running"
            paused = up.call("PauseActor", name)
            assert state_of(paused) == "PAUSED"
            assert not paused.status.HasField("worker_assignment")
        before = up.actors()
        assert [_storage(before[n]) for n in names] == [["LOCAL:COMPLETED"]] * 3
        up.kill()
        assert asyncio.run(state_leftovers(state)), "frozen sandboxes outlive a SIGKILL"

        up = _Up(state)
        after = up.actors()
        for name in names:
            assert state_of(after[name]) == "PAUSED"
            assert _storage(after[name]) == _storage(before[name])
        assert state_of(up.call("ResumeActor", "f1")) == "RUNNING"
        assert up.http("f1", "/v1/exec/j")["state"] == "running"  # thawed: memory, processes

        up.kill()  # again, with f2 and f3 frozen: `local down` of the dead backend parks them
        down = CliRunner().invoke(local, ["down", "--state-dir", str(state)])
        assert down.exit_code == 0, down.output
        assert asyncio.run(state_leftovers(state)) == []
        assert kernel_leftovers(_instance(state), state / "runtime" / "gvisor") == []

        up = _Up(state)
        after = up.actors()
        assert state_of(after["f1"]) == "CRASHED"  # it was running when its worker went
        for name in ("f2", "f3"):
            assert state_of(after[name]) == "PAUSED"
            assert state_of(up.call("ResumeActor", name)) == "RUNNING"  # restored from its image
            assert up.http(name, "/v1/exec/j")["state"] == "running"
        up.call("PauseActor", "f2")  # frozen again
        up.stop()  # `local down`'s signal: f2 is checkpointed, then every sandbox goes
        assert up.proc.returncode == 0, up.log.read_text()
        assert asyncio.run(state_leftovers(state)) == []
        assert kernel_leftovers(_instance(state), state / "runtime" / "gvisor") == []

        up = _Up(state)
        assert state_of(up.call("ResumeActor", "f2")) == "RUNNING"
        assert up.http("f2", "/v1/exec/j")["state"] == "running"
        up.stop()
        assert asyncio.run(state_leftovers(state)) == []
    finally:
        if up.proc.poll() is None:
            up.kill()
        CliRunner().invoke(local, ["down", "--state-dir", str(state)])
