"""A backend killed (SIGKILL) in the middle of a park or a resume loses nothing silently.

`GYM_SUBSTRATE_TEST_CRASH_AT=<phase>` makes `local up` kill itself at that phase
(`gym_substrate/local/crashpoint.py`); the test restarts `local up` on the same state folder and
checks each acknowledged command's effect: it is there, or the actor is CRASHED with a message
that says what is lost. Issue 24 saw the opposite: a complete checkpoint deleted at restart and
the actor quietly back at its previous snapshot, and a restored sandbox killed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import grpc
import pytest
from local_helpers import RUNTIMES, new_actor_request, object_ref, state_of
from test_crash_and_cli import Up

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.local.crashpoint import CRASH_ENV

pytestmark = pytest.mark.slow


def _append(up: Up, name: str, line: str) -> None:
    job = up.http(name, "/v1/exec?wait=8", {"command": f"echo {line} >> /tmp/log"})
    assert job["exit_code"] == 0, job


def _log(up: Up, name: str) -> str:
    job = up.http(name, "/v1/exec?wait=8", {"command": "cat /tmp/log"})
    assert job["exit_code"] == 0, job
    return str(job["stdout"])


def _dies(up: Up, call: Any, request: Any) -> None:
    """``call`` is the backend's last: the RPC fails and the process is gone."""
    with pytest.raises(grpc.RpcError) as failed:
        call(request, timeout=120)
    assert failed.value.code() == grpc.StatusCode.UNAVAILABLE, failed.value
    up.proc.wait(60)
    up.channel.close()


def _crashing(state: Path, runtime: str, phase: str, monkeypatch: pytest.MonkeyPatch) -> Up:
    monkeypatch.setenv(CRASH_ENV, phase)
    try:
        return Up(state, runtime, "--rootfs", "host", workers=2)
    finally:
        monkeypatch.delenv(CRASH_ENV)


def _prepared(state: Path, runtime: str, name: str) -> None:
    """A state folder with the golden build done (it parks an actor too, so the crash phase is
    set only after it) and actor ``name`` RUNNING with one line appended; the backend killed."""
    up = Up(state, runtime, "--rootfs", "host", workers=2)
    up.wait_golden()
    up.create(name)
    up.resume(name)
    _append(up, name, "one")
    up.kill()


def _partials(state: Path) -> list[Path]:
    return [p for p in (state / "snapshots").rglob("*.partial")]


@pytest.fixture
def state(tmp_path: Path) -> Any:
    from test_crash_and_cli import _cli

    folder = tmp_path / "state"
    yield folder
    _cli("down", "--state-dir", str(folder))


@pytest.mark.parametrize("runtime_name", RUNTIMES)
def test_a_kill_after_the_checkpoint_keeps_the_new_image(
    state: Path, runtime_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pause, suspend and the upload of a paused image, each killed once its image is on disk
    but before the record says so: the restart finishes the park at the new image."""
    phase = "after-checkpoint-before-record"
    _prepared(state, runtime_name, "a")
    up = _crashing(state, runtime_name, phase, monkeypatch)
    _dies(up, up.stub.PauseActor, pb.PauseActorRequest(actor=object_ref("a")))

    up = _crashing(state, runtime_name, phase, monkeypatch)
    actor = up.actors()["a"]
    assert state_of(actor) == "PAUSED", actor
    assert not actor.status.HasField("crash")
    up.resume("a")
    assert _log(up, "a") == "one\n"
    _append(up, "a", "two")
    _dies(up, up.stub.SuspendActor, pb.SuspendActorRequest(actor=object_ref("a")))

    up = Up(state, runtime_name, "--rootfs", "host", workers=2)
    assert state_of(up.actors()["a"]) == "SUSPENDED"
    up.resume("a")
    assert _log(up, "a") == "one\ntwo\n"
    _append(up, "a", "three")
    up.stub.PauseActor(pb.PauseActorRequest(actor=object_ref("a")))
    up.kill()

    up = _crashing(state, runtime_name, phase, monkeypatch)
    _dies(up, up.stub.SuspendActor, pb.SuspendActorRequest(actor=object_ref("a")))  # upload
    up = Up(state, runtime_name, "--rootfs", "host", workers=2)
    assert state_of(up.actors()["a"]) == "SUSPENDED"
    up.resume("a")
    assert _log(up, "a") == "one\ntwo\nthree\n"
    assert _partials(state) == []
    up.stop()


@pytest.mark.parametrize("runtime_name", RUNTIMES)
def test_a_kill_before_the_commit_is_reported_never_silent(
    state: Path, runtime_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed after the checkpoint wrote its `.partial` image but before the commit: the
    unfinished image is removed and the actor, whose sandbox the checkpoint ended, is CRASHED
    saying what is lost; a revert takes it back to the image it started from."""
    _prepared(state, runtime_name, "b")
    up = _crashing(state, runtime_name, "after-checkpoint-before-commit", monkeypatch)
    _dies(up, up.stub.PauseActor, pb.PauseActorRequest(actor=object_ref("b")))
    assert _partials(state), "the crash phase comes after the image is written"

    up = Up(state, runtime_name, "--rootfs", "host", workers=2)
    actor = up.actors()["b"]
    assert state_of(actor) == "CRASHED"
    message = actor.status.crash.message
    assert message.startswith("pause failed: the backend stopped before its checkpoint")
    assert "lost: the sandbox's memory and files since its snapshot generation" in message
    assert _partials(state) == []
    with pytest.raises(grpc.RpcError) as refused:
        up.resume("b")
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    up.stop()


@pytest.mark.parametrize("runtime_name", RUNTIMES)
def test_a_kill_mid_resume_adopts_the_restored_sandbox(
    state: Path, runtime_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed after the sandbox was restored but before the record said RUNNING: the restart
    adopts that sandbox (same address, its memory: a job still running) instead of killing it."""
    _prepared(state, runtime_name, "c")
    up = Up(state, runtime_name, "--rootfs", "host", workers=2)
    up.http("c", "/v1/exec", {"id": "ctr", "command": "sleep 300", "timeout_s": 600})
    up.stub.PauseActor(pb.PauseActorRequest(actor=object_ref("c")))
    up.kill()

    up = _crashing(state, runtime_name, "mid-resume-after-restore", monkeypatch)
    _dies(up, up.stub.ResumeActor, pb.ResumeActorRequest(actor=object_ref("c")))
    up = Up(state, runtime_name, "--rootfs", "host", workers=2)
    actor = up.actors()["c"]
    assert state_of(actor) == "RUNNING", actor
    assert not actor.status.HasField("crash")
    assert _log(up, "c") == "one\n"
    assert up.http("c", "/v1/exec/ctr")["state"] == "running"
    up.stop()


@pytest.mark.parametrize("runtime_name", RUNTIMES)
def test_a_kill_mid_tag_copy_leaves_no_half_copy(
    state: Path, runtime_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tags and golden tags are copied into a `.partial` folder, fsynced and renamed, as pause
    images are. Killed before the rename, the restart removes the unfinished copy and its tag
    (CreateTag never answered; a golden build starts over) instead of leaving a tag whose
    folder is half a snapshot; CreateTag then works and an actor made from it has the files."""
    phase = "tag-copied-before-commit"
    # the golden build's own tag copy is the first to reach the phase: the start dies there
    up = _crashing(state, runtime_name, phase, monkeypatch)
    up.proc.wait(120)
    up.channel.close()
    assert _partials(state), "the crash phase comes after the copy is written"
    up = Up(state, runtime_name, "--rootfs", "host", workers=2)
    up.wait_golden()
    assert _partials(state) == []
    up.create("s")
    up.resume("s")
    _append(up, "s", "one")
    up.stub.SuspendActor(pb.SuspendActorRequest(actor=object_ref("s")))
    up.kill()

    up = _crashing(state, runtime_name, phase, monkeypatch)
    tag = pb.Tag(
        metadata=pb.ResourceMetadata(atespace="t", name="keep"),
        scope=pb.TAG_SCOPE_ATESPACE,
        source_actor=object_ref("s"),
    )
    _dies(up, up.stub.CreateTag, pb.CreateTagRequest(tag=tag))
    assert _partials(state)
    up = Up(state, runtime_name, "--rootfs", "host", workers=2)
    assert _partials(state) == []
    with pytest.raises(grpc.RpcError) as gone:
        up.stub.GetTag(pb.GetTagRequest(tag=object_ref("keep")))
    assert gone.value.code() == grpc.StatusCode.NOT_FOUND
    up.stub.CreateTag(pb.CreateTagRequest(tag=tag))
    up.stub.CreateActor(new_actor_request("from-tag", source_tag=object_ref("keep")))
    up.resume("from-tag")
    assert _log(up, "from-tag") == "one\n"
    up.stop()


def test_an_unknown_crash_phase_is_refused(tmp_path: Path) -> None:
    env = {**os.environ, CRASH_ENV: "never-heard-of-it"}
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "gym_substrate.cli", "local", "up", "--runtime", "process",
         "--state-dir", str(tmp_path / "s"), "--api-port", "0", "--router-port", "0",
         "--admin-port", "0", "--rootfs", "host"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode != 0
    assert f"{CRASH_ENV}='never-heard-of-it' names no crash phase" in result.stdout + result.stderr
