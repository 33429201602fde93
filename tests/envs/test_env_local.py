"""SandboxEnv end to end against the local backend (process runtime; gVisor where marked)."""

from __future__ import annotations

import functools
import warnings
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from envs_helpers import Operator
from gymnasium.utils.env_checker import check_env
from gymnasium.vector import AsyncVectorEnv

from gym_substrate.envs import (
    ENV_ID,
    ExitCodeReward,
    FileCreatedReward,
    RewardFn,
    SandboxEnv,
    SparseTaskReward,
    SparseTaskTermination,
    StepPenaltyReward,
)
from gym_substrate.envs.backend import BackgroundBackend
from gym_substrate.envs.env import READY_OBSERVATION


def hello_done(obs: str, info: dict[str, Any]) -> bool:
    return info["exit_code"] == 0 and "hello.txt" in obs


def never(obs: str, info: dict[str, Any]) -> bool:
    return False


def stop_requested(obs: str, info: dict[str, Any]) -> bool:
    return "stop" in obs


def run_readme_example(provider: dict[str, Any]) -> list[tuple[str, str, float, bool, bool]]:
    """The README's example, step for step."""
    env = gym.make(
        ENV_ID,
        reward_fn=ExitCodeReward(),
        termination_fn=SparseTaskTermination(success_fn=hello_done),
        provider=provider,
    )
    transcript = []
    try:
        obs, info = env.reset(options={"task": "Create hello.txt containing 'hello world'"})
        assert obs == READY_OBSERVATION
        assert info["task"] == "Create hello.txt containing 'hello world'"
        for action in ["cat hello.txt", "echo 'hello world' > hello.txt", "ls"]:
            obs, reward, terminated, truncated, info = env.step(action)
            transcript.append((action, obs, reward, terminated, truncated))
            if terminated or truncated:
                break
    finally:
        env.close()
    return transcript


def test_readme_example(operator: Operator) -> None:
    transcript = run_readme_example(operator.provider())
    (a1, obs1, r1, t1, _), (_, obs2, r2, t2, _), (_, obs3, r3, t3, _) = transcript
    assert obs1.startswith("[stderr]\n")
    assert "hello.txt" in obs1  # the error names the file, but exit code 1: not done
    assert (r1, t1) == (-1.0, False)
    assert (obs2, r2, t2) == ("", 1.0, False)
    assert "hello.txt\n" in obs3
    assert (r3, t3) == (1.0, True)
    assert operator.actors() == []


def test_files_persist_within_an_episode_and_not_across(operator: Operator) -> None:
    with SandboxEnv(ExitCodeReward(), SparseTaskTermination(never), operator.provider()) as env:
        _, info1 = env.reset()
        env.step("echo 'hello world' > hello.txt")
        assert env.step("cat hello.txt")[0] == "hello world\n"
        _, info2 = env.reset()
        assert info2["sandbox_id"] != info1["sandbox_id"]
        obs, _, _, _, info = env.step("cat hello.txt")
        assert info["exit_code"] != 0
        assert operator.actors() == [info2["sandbox_id"]]  # the first one went at reset
    assert operator.actors() == []


@pytest.mark.parametrize(
    ("reward_fn", "actions", "rewards"),
    [
        (ExitCodeReward(), ["true", "false", "exit 7"], [1.0, -1.0, -1.0]),
        (
            SparseTaskReward(lambda obs, info: obs.strip() == "42"),
            ["echo 41", "echo $((6 * 7))", "echo 42 >&2"],
            [0.0, 1.0, 0.0],
        ),
        (
            StepPenaltyReward(ExitCodeReward(), penalty=0.25),
            ["true", "ls /definitely-missing"],
            [0.75, -1.25],
        ),
        (
            FileCreatedReward("hello.txt"),
            ["ls", "touch hello.txt", "ls", "ls"],
            [0.0, 0.0, 1.0, 0.0],
        ),
    ],
    ids=["exit-code", "sparse-task", "step-penalty", "file-created"],
)
def test_builtin_rewards(
    operator: Operator, reward_fn: RewardFn, actions: list[str], rewards: list[float]
) -> None:
    with SandboxEnv(reward_fn, SparseTaskTermination(never), operator.provider()) as env:
        for episode in range(2):  # the second episode checks that reset() re-arms the function
            env.reset(options={"task": f"episode {episode}"})
            got = [env.step(action)[1] for action in actions]
            assert got == pytest.approx(rewards)


def test_sparse_task_termination_ends_and_releases(operator: Operator) -> None:
    term = SparseTaskTermination(success_fn=lambda obs, info: obs.strip() == "done")
    with SandboxEnv(ExitCodeReward(), term, operator.provider()) as env:
        env.reset()
        assert env.step("echo not yet")[2] is False
        assert len(operator.actors()) == 1
        _, _, terminated, truncated, _ = env.step("echo done")
        assert (terminated, truncated) == (True, False)
        assert operator.actors() == []  # released by the step itself, not by the next reset
        with pytest.raises(RuntimeError, match="episode has ended"):
            env.step("true")


def test_truncation_at_max_episode_steps_releases(operator: Operator) -> None:
    with SandboxEnv(
        ExitCodeReward(), SparseTaskTermination(never), operator.provider(), max_episode_steps=3
    ) as env:
        env.reset()
        flags = [env.step("true")[2:4] for _ in range(3)]
        assert flags == [(False, False), (False, False), (False, True)]
        assert operator.actors() == []
        with pytest.raises(RuntimeError, match=r"episode has ended \(truncated\)"):
            env.step("true")


def test_env_error_when_the_sandbox_disappears(operator: Operator) -> None:
    with SandboxEnv(ExitCodeReward(), SparseTaskTermination(never), operator.provider()) as env:
        _, info = env.reset()
        assert env.step("echo alive")[0] == "alive\n"
        operator.delete_behind_the_providers_back(info["sandbox_id"])
        obs, reward, terminated, truncated, info = env.step("echo still there?")
        assert (info["exit_code"], info["env_error"], info["error_type"]) == (-1, True, "sandbox")
        assert obs.startswith("[stderr]\n")
        assert reward == -1.0
        assert (terminated, truncated) == (False, False)  # the episode continues
        assert env.step("true")[4]["env_error"] is True
        env.reset()  # a fresh sandbox brings the env back
        obs, _, _, _, info = env.step("echo back")
        assert (obs, info["env_error"]) == ("back\n", False)
    assert operator.actors() == []


def test_timeout_cwd_env_and_shell(operator: Operator) -> None:
    with SandboxEnv(
        ExitCodeReward(),
        SparseTaskTermination(never),
        operator.provider(),
        step_timeout_s=1,
        cwd="/tmp",
        env={"GREETING": "hi"},
        shell="bash",
    ) as env:
        env.reset()
        obs, reward, terminated, _, info = env.step("echo start; sleep 30; echo never")
        assert (info["exit_code"], info["error_type"], info["env_error"]) == (124, "timeout", False)
        assert obs.startswith("start\n")  # output up to the kill is kept
        assert "never" not in obs
        assert (reward, terminated) == (-1.0, False)
        obs, *_ = env.step('echo "$GREETING from $(pwd) in $0"')
        assert obs == "hi from /tmp in bash\n"


def test_long_and_binary_output(operator: Operator) -> None:
    with SandboxEnv(
        ExitCodeReward(), SparseTaskTermination(never), operator.provider(), max_obs_length=200
    ) as env:
        env.reset()
        obs, *_, info = env.step(
            "seq 1 100000; printf 'nul:\\0 bad:\\377 emoji:\\360\\237\\231\\202' >&2"
        )
        assert len(obs) == 200
        assert obs.startswith("1\n2\n3\n")
        assert obs.endswith("emoji:🙂")
        assert "characters cut" in obs
        assert obs in env.observation_space
        assert "nul:\x00" in info["stderr"]


@pytest.mark.parametrize("how", ["gym.make", "constructor"])
def test_check_env_passes(operator: Operator, how: str) -> None:
    kwargs: dict[str, Any] = {
        "reward_fn": ExitCodeReward(),
        "termination_fn": SparseTaskTermination(never),
        "provider": operator.provider(),
        "max_obs_length": 1024,
    }
    env = gym.make(ENV_ID, **kwargs) if how == "gym.make" else SandboxEnv(**kwargs)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a checker warning is a failure here
            check_env(env.unwrapped)
    finally:
        env.close()
    assert operator.actors() == []


def make_vector_member(provider: dict[str, Any]) -> SandboxEnv:
    return SandboxEnv(
        ExitCodeReward(), SparseTaskTermination(stop_requested), provider, max_episode_steps=4
    )


def test_async_vector_env_with_four_envs(operator: Operator) -> None:
    fn = functools.partial(make_vector_member, operator.provider())
    vec = AsyncVectorEnv([fn] * 4, context="spawn")
    try:
        obs, infos = vec.reset(options={"task": "count"})
        assert list(obs) == [READY_OBSERVATION] * 4
        assert len(set(infos["sandbox_id"])) == 4
        assert sorted(operator.actors()) == sorted(infos["sandbox_id"])

        obs, rewards, terminated, truncated, infos = vec.step(
            ("echo 0", "echo stop", "echo 2 >&2; exit 3", "echo 3")
        )
        assert list(obs) == ["0\n", "stop\n", "[stderr]\n2\n", "3\n"]
        assert list(rewards) == [1.0, 1.0, -1.0, 1.0]
        assert list(terminated) == [False, True, False, False]
        assert list(infos["exit_code"]) == [0, 0, 3, 0]
        assert len(operator.actors()) == 3  # env 1 released its sandbox as it terminated

        obs, *_ = vec.step(("true",) * 4)  # env 1 autoresets with a fresh sandbox
        assert obs[1] == READY_OBSERVATION
        assert len(operator.actors()) == 4
        for _ in range(2):
            _, _, terminated, truncated, _ = vec.step(("true",) * 4)
        assert list(truncated) == [True, False, True, True]  # 4 steps for envs 0, 2, 3
        assert isinstance(truncated, np.ndarray)
    finally:
        vec.close()
    assert operator.actors() == []


@pytest.mark.runsc
def test_readme_example_on_gvisor(gvisor_backend: BackgroundBackend, tmp_path: Path) -> None:
    import uuid

    op = Operator(gvisor_backend, f"envtest-{uuid.uuid4().hex[:10]}", str(tmp_path / "ledger"))
    try:
        transcript = run_readme_example(op.provider())
        assert [step[2:4] for step in transcript] == [(-1.0, False), (1.0, False), (1.0, True)]
        assert op.actors() == []
    finally:
        op.close()


FORKED_VECTOR_RUN = """
import json, sys
from gymnasium.vector import AsyncVectorEnv
from gym_substrate.envs import ExitCodeReward, SandboxEnv, SparseTaskTermination

def never(obs, info):
    return False

provider = json.loads(sys.argv[1])
# A parent that has never touched gRPC may fork its workers (Linux's default start method). The
# parent builds one env itself (the dummy AsyncVectorEnv reads the spaces from), so each worker
# must build its own loop thread and provider after the fork.
make = lambda: SandboxEnv(ExitCodeReward(), SparseTaskTermination(never), provider)
vec = AsyncVectorEnv([make] * 2, context="fork")
obs, infos = vec.reset()
obs, rewards, *_ = vec.step(("echo one", "echo two"))
vec.close()
print(json.dumps({"obs": list(obs), "rewards": rewards.tolist(), "ids": list(infos["sandbox_id"])}))
"""


def test_async_vector_env_with_forked_workers(operator: Operator) -> None:
    import json
    import subprocess
    import sys

    run = subprocess.run(
        [sys.executable, "-c", FORKED_VECTOR_RUN, json.dumps(operator.provider())],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["obs"] == ["one\n", "two\n"]
    assert out["rewards"] == [1.0, 1.0]
    assert len(set(out["ids"])) == 2
    assert operator.actors() == []
