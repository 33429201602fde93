"""A CRASHED sandbox through the provider's seam: what exec and status say, and on_crash.

Real (cmd/ateapi/internal/controlapi/crash.go): an actor whose worker's ateom restarted, or whose
resume failed on the node, is CRASHED with `status.crash.message`; ResumeActor, SuspendActor and
PauseActor refuse it with FAILED_PRECONDITION until RevertActor takes it back to SUSPENDED at its
last durable snapshot (§8). The router cannot resume it either: it answers 503 after its budget
(upstream-router.md §2), or a request parks until the client gives up (`hang_on_crash`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gym_substrate import SubstrateCreateVerificationError, SubstrateProvider, TransferError
from gym_substrate.nemo._metrics import METRICS
from gym_substrate.nemo.types import SandboxSpec, SandboxStatus

from .fakes import CRASHED, SUSPENDED, FakeAgents, FakeControl

CONN = {"api": "127.0.0.1:1", "router": "http://router.invalid", "tls": {"plaintext": True}}
CRASH = "ateom restarted while hosting the actor"


def _provider(
    control: FakeControl, *, on_crash: str = "fail", hang: bool = False
) -> SubstrateProvider:
    return SubstrateProvider(
        connection=CONN,
        create={"retry": {"initial": 0.001, "maximum": 0.01, "deadline": 5}},
        lifecycle={"on_crash": on_crash},
        control=control,
        http=FakeAgents(control, hang_on_crash=hang),
    )


def _count(action: str) -> float:
    return float(METRICS.crashes.labels(action)._value.get())


@pytest.mark.parametrize("hang", [False, True], ids=["router-503", "request-hangs"])
async def test_on_crash_fail_exec_says_why_and_status_is_error(hang: bool) -> None:
    control = FakeControl()
    before = _count("fail")
    async with _provider(control, hang=hang) as p:
        handle = await p.create(SandboxSpec())
        control.crash("gym", handle.sandbox_id, CRASH)
        result = await p.exec(handle, "echo hi")
        assert (result.return_code, result.error_type) == (125, "sandbox")
        assert f"sandbox {handle.sandbox_id} crashed: {CRASH}" in (result.stderr or "")
        assert "lifecycle.on_crash: revert" in (result.stderr or "")
        assert await p.status(handle) == SandboxStatus.ERROR
        assert handle.raw.status == "CRASHED"
        # Known crashed: the next call fails at once, without asking anyone.
        calls = sum(control.calls.values())
        again = await p.exec(handle, "echo hi")
        assert again.error_type == "sandbox"
        assert CRASH in (again.stderr or "")
        assert sum(control.calls.values()) == calls
        assert _count("fail") == before + 1
        await p.close(handle)  # a CRASHED actor is deletable
    assert control.actors == {}


async def test_on_crash_revert_reverts_resumes_and_the_next_result_says_state_was_lost() -> None:
    control = FakeControl()
    before = _count("revert")
    async with _provider(control, on_crash="revert") as p:
        handle = await p.create(SandboxSpec())
        control.crash("gym", handle.sandbox_id, CRASH)
        result = await p.exec(handle, "echo after")
        assert (result.return_code, result.stdout) == (0, "after\n")
        assert (result.stderr or "").startswith(
            f"[gym-substrate: sandbox {handle.sandbox_id} crashed ({CRASH}) and was reverted to "
            "its last durable snapshot"
        )
        assert control.calls["RevertActor"] == 1
        assert _count("revert") == before + 1
        assert await p.status(handle) == SandboxStatus.RUNNING
        nxt = await p.exec(handle, "echo next")
        assert (nxt.stdout, nxt.stderr) == ("next\n", "")  # said once
        await p.close(handle)


async def test_a_revert_someone_else_made_first_is_not_an_error() -> None:
    """Real: RevertActor of a SUSPENDED actor is FAILED_PRECONDITION (upstream-actors.md §8)."""
    control = FakeControl()
    async with _provider(control, on_crash="revert") as p:
        handle = await p.create(SandboxSpec())
        control.crash("gym", handle.sandbox_id, CRASH)
        real_revert = control.revert_actor

        async def revert_twice(atespace: str, name: str) -> Any:
            await real_revert(atespace, name)  # another process got there first
            return await real_revert(atespace, name)

        control.revert_actor = revert_twice  # type: ignore[method-assign]
        result = await p.exec(handle, "echo ok")
        assert result.stdout == "ok\n"
        assert CRASH in (result.stderr or "")
        await p.close(handle)


async def test_a_crash_while_parked_is_found_by_the_resume() -> None:
    """ResumeActor of a CRASHED actor is FAILED_PRECONDITION; GetActor tells a crash apart from
    a transition, so the resume neither hangs to its deadline nor hides the crash message."""
    control = FakeControl()
    async with _provider(control) as p:
        handle = await p.create(SandboxSpec())
        await p.pause(handle)
        control.actors[("gym", handle.sandbox_id)].state = CRASHED
        control.actors[("gym", handle.sandbox_id)].crash = "pause failed: node is unknown"
        result = await p.exec(handle, "echo hi")
        assert result.error_type == "sandbox"
        assert "crashed: pause failed: node is unknown" in (result.stderr or "")
        assert control.calls["ResumeActor"] == 2  # create's, and the refused one
        await p.close(handle)


async def test_a_crash_on_the_first_resume_fails_create_and_leaks_nothing() -> None:
    """Real: a wakeup probe that never answers crashes the actor during its resume (§5)."""
    control = FakeControl()
    control.crash_next_resume = 'wakeup probe for "agent" never returned 200 within 30s'
    async with _provider(control, on_crash="revert") as p:
        with pytest.raises(SubstrateCreateVerificationError, match="never returned 200"):
            await p.create(SandboxSpec())
    assert control.calls["RevertActor"] == 0  # a create never reverts: it fails
    assert control.actors == {}


async def test_status_of_a_crash_nobody_saw_yet_is_error() -> None:
    control = FakeControl()
    async with _provider(control) as p:
        handle = await p.create(SandboxSpec())
        control.crash("gym", handle.sandbox_id, CRASH)
        assert await p.status(handle) == SandboxStatus.ERROR
        await control.revert_actor("gym", handle.sandbox_id)  # someone reverted it
        assert control.actors[("gym", handle.sandbox_id)].state == SUSPENDED
        assert await p.status(handle) in (SandboxStatus.PAUSED, SandboxStatus.RUNNING)
        assert (await p.exec(handle, "echo back")).stdout == "back\n"
        await p.close(handle)


async def test_an_upload_to_a_crashed_sandbox_is_a_transfer_error_naming_the_crash(
    tmp_path: Path,
) -> None:
    control = FakeControl()
    async with _provider(control) as p:
        handle = await p.create(SandboxSpec())
        control.crash("gym", handle.sandbox_id, CRASH)
        src = tmp_path / "a.txt"
        src.write_text("x")
        with pytest.raises(TransferError, match=f"crashed: {CRASH}"):
            await p.upload_file(handle, src, "/tmp/a.txt")
        await p.close(handle)
