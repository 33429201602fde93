"""Commands as agent jobs: submit with a client-chosen id, long-poll, map the job to Gym's result.

The router cuts every request at 10 s, so a command is a job that outlives any one request. A
lost response is recovered by sending the *same* id again, which the agent deduplicates, so a
command never runs twice; a router 503 resumes the actor first (`ManagedActor.call_agent`).
`SandboxExecResult` never raises for the command's own failure: sandbox trouble is return code
125 with `error_type="sandbox"`, a timeout 125 with `error_type="timeout"`.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Mapping
from typing import Any

from gym_substrate._agent_client import AgentClient
from gym_substrate._errors import AgentResponseError, RetryError, RouterError, SubstrateError
from gym_substrate._lifecycle import ManagedActor, ResumeFailedError
from gym_substrate.types import SandboxExecResult
from sandbox_agent.contract import MAX_TIMEOUT_S, ExecRequest, Job

__all__ = ["SANDBOX_RUNTIME_RETURN_CODE", "build_job", "job_result", "run_job", "sandbox_failure"]

log = logging.getLogger("gym_substrate.provider")

SANDBOX_RUNTIME_RETURN_CODE = 125


def build_job(
    command: str | list[str],
    *,
    shell: str,
    cwd: str | None,
    env: Mapping[str, str],
    timeout_s: float,
    user: str | int | None,
) -> ExecRequest:
    """The agent job for one `exec()`; a fresh id, reused on every resubmission."""
    return {
        "id": f"gx-{uuid.uuid4().hex}",
        # The agent refuses a blank command string (400); `sh -c ""` is a valid no-op, so send
        # that one as argv and keep its result a result, not a sandbox failure.
        "command": (
            [shell, "-c", command] if isinstance(command, str) and not command.strip() else command
        ),
        "shell": shell,
        "cwd": cwd,
        "env": dict(env),
        # Above the agent's bound (and JSON has no Infinity) means "no practical limit".
        "timeout_s": min(timeout_s, MAX_TIMEOUT_S),
        "user": user,
    }


async def run_job(
    managed: ManagedActor, job: ExecRequest, *, deadline: float, poll_wait_s: float
) -> SandboxExecResult:
    """Submit `job`, poll it until it finishes or `deadline` passes, and map the outcome."""
    job_id = str(job["id"])
    submitted = False

    async def step(agent: AgentClient) -> Job:
        nonlocal submitted
        wait = min(poll_wait_s, max(0.0, deadline - time.monotonic()))
        if submitted:
            return await agent.poll(job_id, wait)
        state = await agent.submit(job, wait)
        submitted = True
        return state

    while True:
        if deadline - time.monotonic() <= 0:
            return await _timed_out(managed, job, submitted, None)
        try:
            state = await managed.call_agent(step, what=f"exec {job_id}", deadline=deadline)
        except ResumeFailedError as exc:
            return sandbox_failure(
                f"the actor lost its worker and could not be resumed: {exc.__cause__}"
            )
        except RetryError as exc:  # the deadline passed while the router kept failing
            return await _timed_out(managed, job, submitted, exc.cause)
        except RouterError as exc:
            return sandbox_failure(f"the router could not reach the sandbox: {exc}")
        except AgentResponseError as exc:
            if exc.status == 404 and submitted:
                return sandbox_failure(
                    f"the sandbox lost job {job_id} (its agent restarted); the command may "
                    "have partly run"
                )
            return sandbox_failure(str(exc))
        if state.get("state") != "running":
            return job_result(state)
        if poll_wait_s < 0.05:  # poll_wait_s 0: do not spin on the agent
            await asyncio.sleep(0.05)


async def _timed_out(
    managed: ManagedActor, job: ExecRequest, submitted: bool, last_error: BaseException | None
) -> SandboxExecResult:
    stdout: str | None = None
    stderr: str | None = None
    if submitted:
        try:
            killed = await managed.services.agent(managed.actor).kill(str(job["id"]))
            stdout, stderr = killed.get("stdout"), killed.get("stderr")
        except SubstrateError as exc:
            log.warning("could not kill timed-out job %s: %s", job["id"], exc)
    elif last_error is not None:
        return sandbox_failure(f"could not submit the command: {last_error}")
    note = f"command timed out after {job['timeout_s']:g} s"
    return SandboxExecResult(
        stdout=stdout,
        stderr=f"{stderr or ''}{note}\n",
        return_code=SANDBOX_RUNTIME_RETURN_CODE,
        error_type="timeout",
    )


def sandbox_failure(message: str) -> SandboxExecResult:
    return SandboxExecResult(
        stdout=None, stderr=message, return_code=SANDBOX_RUNTIME_RETURN_CODE, error_type="sandbox"
    )


def job_result(job: Mapping[str, Any]) -> SandboxExecResult:
    """A finished agent job as Gym's result (exit code, 128+signal, or 125 with a reason)."""
    state = job.get("state")
    stdout, stderr = job.get("stdout"), job.get("stderr")
    if state == "exited":
        code = job.get("exit_code")
        if code is None:
            signal = job.get("signal")
            code = 128 + int(signal) if signal else SANDBOX_RUNTIME_RETURN_CODE
        return SandboxExecResult(stdout=stdout, stderr=stderr, return_code=int(code))
    if state == "timeout":
        return SandboxExecResult(
            stdout=stdout,
            stderr=stderr,
            return_code=SANDBOX_RUNTIME_RETURN_CODE,
            error_type="timeout",
        )
    reason = job.get("error") or f"job ended in state {state!r}"
    return SandboxExecResult(
        stdout=stdout,
        stderr=f"{stderr or ''}{reason}",
        return_code=SANDBOX_RUNTIME_RETURN_CODE,
        error_type="sandbox",
    )
