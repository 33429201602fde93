"""Commands as agent jobs: submit with a client-chosen id, long-poll, map the job to Gym's result.

A command is a job that outlives any one request (each long poll stays short, well inside the
router's route timeout). A lost response is recovered by sending the *same* id again, which the
agent deduplicates, so a command never runs twice; a router 503 resumes the actor first
(`ManagedActor.call_agent`). `SandboxExecResult` never raises for the command's own failure:
sandbox trouble (a crash included) is return code 125 with `error_type="sandbox"`, a timeout 125
with `error_type="timeout"`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import posixpath
import shlex
import time
import uuid
from collections.abc import Mapping
from typing import Any

from gym_substrate.nemo._managed import ManagedActor, ResumeFailedError, WorkloadLostError
from gym_substrate.nemo.agent_client import AgentClient
from gym_substrate.nemo.errors import (
    ActorCrashedError,
    AgentResponseError,
    RetryError,
    RouterError,
    SubstrateError,
)
from gym_substrate.nemo.types import SandboxExecResult
from sandbox_agent.contract import MAX_TIMEOUT_S, ExecRequest, Job

__all__ = [
    "SANDBOX_RUNTIME_RETURN_CODE",
    "build_job",
    "job_result",
    "load_defaults",
    "resolve_path",
    "run_job",
    "sandbox_failure",
    "store_defaults",
    "timed_out_before_start",
    "with_notice",
]

log = logging.getLogger("gym_substrate.provider")

SANDBOX_RUNTIME_RETURN_CODE = 125


# Where a sandbox keeps its own workdir and env, so `connect({"sandbox_id": id})` (Gym's sandboxed
# agents reattach by id alone) still runs commands with them. Under $HOME of the agent's user:
# private to the sandbox on every runtime, and kept across pause and suspend.
_DEFAULTS = '"$HOME/.gym-substrate/sandbox.json"'


def resolve_path(path: str, base: str | None) -> str:
    """A relative sandbox path against the sandbox's workdir (else `/`), as Gym's local does."""
    return posixpath.normpath(posixpath.join(base or "/", path))


def build_job(
    command: str | list[str],
    *,
    shell: str,
    cwd: str | None,
    env: Mapping[str, str],
    timeout_s: float,
    user: str | int | None,
    max_output_bytes: int | None = None,
    stdin: str | None = None,
    background_services: bool = False,
) -> ExecRequest:
    """The agent job for one `exec()`; a fresh id, reused on every resubmission."""
    job: ExecRequest = {
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
    if max_output_bytes is not None:
        job["max_output_bytes"] = max_output_bytes
    if stdin is not None:
        job["stdin"] = stdin
    if background_services:
        job["background_services"] = True
    return job


async def store_defaults(
    managed: ManagedActor, *, shell: str, workdir: str | None, env: Mapping[str, str]
) -> SandboxExecResult:
    """Create the workdir and record workdir and env inside the sandbox (one job)."""
    steps = [f"mkdir -p {shlex.quote(workdir)}"] if workdir else []
    steps += ['mkdir -p "$HOME/.gym-substrate"', f"cat > {_DEFAULTS}"]
    job = build_job(
        " && ".join(steps),
        shell=shell,
        cwd="/",
        env={},
        timeout_s=30,
        user=None,
        stdin=json.dumps({"workdir": workdir, "env": dict(env)}),
    )
    return await run_job(managed, job, deadline=time.monotonic() + 35, poll_wait_s=8.0)


async def load_defaults(managed: ManagedActor, *, shell: str) -> tuple[str | None, dict[str, str]]:
    """The workdir and env `store_defaults` recorded; none for a sandbox that has no record."""
    job = build_job(
        f"cat {_DEFAULTS} 2>/dev/null || true",
        shell=shell,
        cwd="/",
        env={},
        timeout_s=30,
        user=None,
    )
    result = await run_job(managed, job, deadline=time.monotonic() + 35, poll_wait_s=8.0)
    if result.return_code != 0:
        raise SubstrateError(f"could not read the sandbox's defaults: {result.stderr}")
    try:
        stored = json.loads(result.stdout or "null") or {}
        workdir, env = stored.get("workdir"), dict(stored.get("env") or {})
    except (ValueError, AttributeError, TypeError):
        log.warning("sandbox %s: unreadable %s, ignored", managed.actor.actor_id, _DEFAULTS)
        return None, {}
    if not (workdir is None or isinstance(workdir, str)) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        log.warning("sandbox %s: malformed %s, ignored", managed.actor.actor_id, _DEFAULTS)
        return None, {}
    return workdir, env


def timed_out_before_start(timeout_s: float) -> SandboxExecResult:
    """`timeout_s <= 0`: the limit is over before the command could start (Gym's local)."""
    return SandboxExecResult(
        stdout=None,
        stderr=f"command timed out after {timeout_s:g} s (it was not started)\n",
        return_code=SANDBOX_RUNTIME_RETURN_CODE,
        error_type="timeout",
    )


async def run_job(
    managed: ManagedActor, job: ExecRequest, *, deadline: float, poll_wait_s: float
) -> SandboxExecResult:
    """Submit `job`, poll it until it finishes or `deadline` passes, and map the outcome."""
    job_id = str(job["id"])
    submitted = False
    reverts_before = managed.reverts

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
        except ActorCrashedError as exc:  # on_crash: fail (or a revert that crashed again)
            return sandbox_failure(str(exc))
        except ResumeFailedError as exc:
            if isinstance(exc.__cause__, WorkloadLostError):
                return sandbox_failure(str(exc.__cause__))
            return sandbox_failure(
                f"the actor lost its worker and could not be resumed: {exc.__cause__}"
            )
        except RetryError as exc:  # the deadline passed while the router kept failing
            return await _timed_out(managed, job, submitted, exc.cause)
        except RouterError as exc:
            return sandbox_failure(f"the router could not reach the sandbox: {exc}")
        except AgentResponseError as exc:
            if exc.status == 404 and submitted and managed.reverts != reverts_before:
                return sandbox_failure(
                    f"the sandbox crashed while job {job_id} ran and was reverted; the command "
                    "did not finish (it is not run again)"
                )
            if exc.status == 404 and submitted:
                return sandbox_failure(
                    f"the sandbox lost job {job_id} (its agent restarted); the command may "
                    "have partly run"
                )
            return sandbox_failure(str(exc))
        if state.get("state") != "running":
            return job_result(state, job.get("timeout_s"))
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


def with_notice(result: SandboxExecResult, notice: str | None) -> SandboxExecResult:
    """`result` with `notice` first in stderr (a revert the caller must know about).

    stderr, because Gym's result has no other free-text field and agents show stderr to the
    model (as with the truncation note); first, because it happened before the command.
    """
    if not notice:
        return result
    return SandboxExecResult(
        stdout=result.stdout,
        stderr=notice + (result.stderr or ""),
        return_code=result.return_code,
        error_type=result.error_type,
    )


def sandbox_failure(message: str) -> SandboxExecResult:
    return SandboxExecResult(
        stdout=None, stderr=message, return_code=SANDBOX_RUNTIME_RETURN_CODE, error_type="sandbox"
    )


def _truncation_note(job: Mapping[str, Any]) -> str:
    cut = [name for name in ("stdout", "stderr") if job.get(f"{name}_truncated")]
    if not cut:
        return ""
    log.warning(
        "job %s: %s over the output limit; head and tail kept around a "
        "'[... sandbox-agent: N bytes truncated ...]' line (raise exec.max_output_bytes)",
        job.get("id"),
        " and ".join(cut),
    )
    return (
        f"[gym-substrate: {' and '.join(cut)} truncated at the output limit; the middle was "
        "replaced by a '[... sandbox-agent: N bytes truncated ...]' line]\n"
    )


def job_result(job: Mapping[str, Any], timeout_s: float | None = None) -> SandboxExecResult:
    """A finished agent job as Gym's result (exit code, 128+signal, or 125 with a reason).

    Truncated output and timeouts are said in stderr, where an agent shows them to the model.
    """
    state = job.get("state")
    stdout, stderr, note = job.get("stdout"), job.get("stderr"), _truncation_note(job)
    if note:
        stderr = (stderr or "") + note
    if state == "exited":
        code = job.get("exit_code")
        if code is None:
            signal = job.get("signal")
            code = 128 + int(signal) if signal else SANDBOX_RUNTIME_RETURN_CODE
        return SandboxExecResult(stdout=stdout, stderr=stderr, return_code=int(code))
    if state == "timeout":
        limit = f" after {timeout_s:g} s" if timeout_s is not None else ""
        return SandboxExecResult(
            stdout=stdout,
            stderr=f"{stderr or ''}command timed out{limit}\n",
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
