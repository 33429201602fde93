"""Retention of finished jobs, in-process with small limits (the contract's are 10 min / 1,024)."""

from __future__ import annotations

import pytest

from sandbox_agent._config import AgentConfig
from sandbox_agent._errors import ApiError
from sandbox_agent._jobs import FinishedJob, JobManager, parse_exec_request


async def _run(manager: JobManager, job_id: str) -> None:
    _, spec = parse_exec_request({"id": job_id, "command": ["true"]})
    job = await manager.submit(job_id, spec)
    await manager.wait(job, 8)
    assert job.finished


async def test_newest_n_are_kept_once_the_window_has_passed() -> None:
    manager = JobManager(AgentConfig(job_retention_s=0.0, job_retention_count=3))
    for i in range(6):
        await _run(manager, f"j{i}")
    await _run(manager, "trigger")  # eviction runs when a job is submitted
    kept = [f"j{i}" for i in range(6) if manager.get(f"j{i}") is not None]
    assert kept == ["j3", "j4", "j5"]
    assert isinstance(manager.get("j5"), FinishedJob)
    assert manager.get("j5").to_json()["state"] == "exited"  # type: ignore[union-attr]


async def test_window_keeps_more_than_n_but_never_beyond_the_hard_cap() -> None:
    manager = JobManager(AgentConfig(job_retention_s=600.0, job_retention_count=2, job_hard_cap=5))
    for i in range(4):
        await _run(manager, f"j{i}")
    await _run(manager, "t1")
    assert all(manager.get(f"j{i}") is not None for i in range(4)), "10 minutes not yet passed"
    for i in range(4, 8):
        await _run(manager, f"j{i}")
    await _run(manager, "t2")
    kept = [i for i in range(8) if manager.get(f"j{i}") is not None]
    assert kept == [4, 5, 6, 7], kept


async def test_a_retained_job_still_answers_idempotent_retries() -> None:
    manager = JobManager(AgentConfig())
    await _run(manager, "same")
    _, spec = parse_exec_request({"id": "same", "command": ["true"]})
    again = await manager.submit("same", spec)
    assert isinstance(again, FinishedJob)
    _, other = parse_exec_request({"id": "same", "command": ["false"]})
    with pytest.raises(ApiError) as info:
        await manager.submit("same", other)
    assert info.value.status == 409
    assert info.value.code == "id_conflict"
