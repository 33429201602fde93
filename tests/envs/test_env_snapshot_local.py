"""The episode snapshot round trip end to end, on the local backend: a reset from `snapshot()`
gives the same observations, rewards and truncation for the same actions, in another env, in
the same env again, and in every worker of an `AsyncVectorEnv`."""

from __future__ import annotations

import functools
import uuid
from pathlib import Path
from typing import Any

import pytest
from envs_helpers import Operator
from gymnasium.vector import AsyncVectorEnv

from gym_substrate.envs import FileCreatedReward, SandboxEnv, SparseTaskTermination
from gym_substrate.envs.backend import BackgroundBackend

PREFIX = ["mkdir -p /tmp/ep && cd /tmp/ep && echo 1 > n", "ls /tmp/ep"]
REST = [
    "cd /tmp/ep && echo $(( $(cat n) * 7 )) > n && cat n",
    "ls /tmp/ep; touch /tmp/ep/goal.txt",
    "ls /tmp/ep",
    "cat /tmp/ep/n",
]


def goal_reached(obs: str, info: dict[str, Any]) -> bool:
    return "DONE" in obs


def make_env(provider: dict[str, Any]) -> SandboxEnv:
    # FileCreatedReward is stateful (it pays once): a restore must carry its state.
    return SandboxEnv(
        FileCreatedReward("goal.txt"),
        SparseTaskTermination(goal_reached),
        provider,
        max_episode_steps=6,
    )


def transcript(env: SandboxEnv, actions: list[str]) -> list[tuple[Any, ...]]:
    steps = []
    for action in actions:
        obs, reward, terminated, truncated, info = env.step(action)
        steps.append((obs, reward, terminated, truncated, info["step"], info["exit_code"]))
    return steps


def round_trip(op: Operator) -> None:
    with make_env(op.provider()) as source, make_env(op.provider()) as other:
        source.reset(options={"task": "reach goal.txt"})
        transcript(source, PREFIX)
        snap = source.snapshot()
        expected = transcript(source, REST)
        assert [s[1] for s in expected] == [0.0, 0.0, 1.0, 0.0]  # paid once, at the 2nd ls
        assert expected[-1][3] is True  # truncated at step 6
        assert expected[0][0] == "7\n"
        for env in (other, other):
            obs, info = env.reset(options={"snapshot": snap})
            assert obs == "n\n"  # what the agent saw last before the snapshot
            assert (info["step"], info["task"]) == (2, "reach goal.txt")
            assert transcript(env, REST) == expected
        source.delete_snapshot(snap)
    assert op.actors() == []


def test_the_episode_round_trip_on_the_process_runtime(operator: Operator) -> None:
    round_trip(operator)


@pytest.mark.runsc
def test_the_episode_round_trip_on_gvisor(
    gvisor_backend: BackgroundBackend, tmp_path: Path
) -> None:
    op = Operator(gvisor_backend, f"envtest-{uuid.uuid4().hex[:10]}", str(tmp_path / "ledger"))
    try:
        round_trip(op)
    finally:
        op.close()


def test_async_vector_env_workers_branch_from_one_snapshot(operator: Operator) -> None:
    """The snapshot pickles as a reference: each worker process makes its own sandbox from it."""
    with make_env(operator.provider()) as source:
        source.reset(options={"task": "t"})
        transcript(source, PREFIX)
        snap = source.snapshot()
        vec = AsyncVectorEnv(
            [functools.partial(make_env, operator.provider())] * 2, context="spawn"
        )
        try:
            obs, infos = vec.reset(options={"snapshot": snap})
            assert list(obs) == ["n\n", "n\n"]
            assert list(infos["step"]) == [2, 2]
            assert len(set(infos["sandbox_id"]) | {source.sandbox_id}) == 3
            obs, *_ = vec.step(("cat /tmp/ep/n", "echo 5 > /tmp/ep/n; cat /tmp/ep/n"))
            assert list(obs) == ["1\n", "5\n"]  # the same start, then each its own way
            obs, *_ = vec.step(("cat /tmp/ep/n", "cat /tmp/ep/n"))
            assert list(obs) == ["1\n", "5\n"]
        finally:
            vec.close()
        assert source.step("cat /tmp/ep/n")[0] == "1\n"  # the source is untouched
        source.delete_snapshot(snap)
    assert operator.actors() == []
