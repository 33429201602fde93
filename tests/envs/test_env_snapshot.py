"""`SandboxEnv.snapshot()` and `reset(options={"snapshot": ...})` against the in-process fake.

The fake's sandboxes are folders and its snapshots copies of them, so what is checked here is the
env's side: the episode continues at the same step with the same task, last observation, and
reward/termination state, identically however many times it is restored. The end-to-end round
trip on the local backend is in test_env_local.py.
"""

from __future__ import annotations

import asyncio
import pickle
from pathlib import Path
from typing import Any

import pytest
from envs_helpers import FakeProvider
from gymnasium.vector import SyncVectorEnv

from gym_substrate import SandboxSnapshot
from gym_substrate.envs import (
    EnvSnapshot,
    ExitCodeReward,
    FileCreatedReward,
    SandboxEnv,
    SparseTaskTermination,
)

ACTIONS = ["echo one > a.txt", "ls", "echo two >> a.txt", "cat a.txt; ls", "wc -l < a.txt"]


def solved(obs: str, info: dict[str, Any]) -> bool:
    return "DONE" in obs


def make(provider: Any, **kwargs: Any) -> SandboxEnv:
    """A stateful reward: +1 the first time a.txt shows up in an observation, then 0."""
    kwargs.setdefault("max_episode_steps", 5)
    return SandboxEnv(FileCreatedReward("a.txt"), SparseTaskTermination(solved), provider, **kwargs)


def run(env: SandboxEnv, actions: list[str]) -> list[tuple[Any, ...]]:
    out = []
    for action in actions:
        obs, reward, terminated, truncated, info = env.step(action)
        out.append((obs, reward, terminated, truncated, info["step"], info["exit_code"]))
    return out


@pytest.fixture
def fake(tmp_path: Path) -> FakeProvider:
    return FakeProvider(root=str(tmp_path))


def test_a_restored_episode_continues_identically(fake: FakeProvider) -> None:
    with make(fake) as source, make(fake) as other:
        source.reset(options={"task": {"goal": "a.txt"}})
        before = run(source, ACTIONS[:2])
        assert before[1][:2] == ("a.txt\n", 1.0)  # the reward paid out at "ls"
        snap = source.snapshot(name="mid")
        assert isinstance(snap, SandboxSnapshot)
        assert (snap.ref, snap.step, snap.task) == ("fake/mid", 2, {"goal": "a.txt"})
        expected = run(source, ACTIONS[2:])
        assert expected[-1][3] is True  # truncated at max_episode_steps=5, as before

        for env in (other, source):  # another env, and the source itself, twice
            for _ in range(2):
                obs, info = env.reset(options={"snapshot": snap})
                assert obs == "a.txt\n"  # the last observation the agent saw
                assert (info["step"], info["task"], info["snapshot"]) == (
                    2,
                    {"goal": "a.txt"},
                    "fake/mid",
                )
                assert run(env, ACTIONS[2:]) == expected
        # The reward's state came along: a fresh FileCreatedReward would pay 1.0 at "cat; ls".
        assert [r[1] for r in expected] == [0.0, 0.0, 0.0]


def test_the_reset_observation_is_the_last_one_the_agent_saw(fake: FakeProvider) -> None:
    with make(fake) as env:
        env.reset()
        obs, *_ = env.step("echo seen")
        snap = env.snapshot()
        again, _ = env.reset(options={"snapshot": snap})
        assert again == obs == "seen\n"


def test_vector_envs_branch_from_one_snapshot(fake: FakeProvider) -> None:
    with make(fake) as source:
        source.reset()
        source.step("echo base > b.txt")
        snap = source.snapshot()
        vec = SyncVectorEnv([lambda: make(fake) for _ in range(3)])
        try:
            _, infos = vec.reset(options={"snapshot": snap})
            assert list(infos["step"]) == [1, 1, 1]
            assert len(set(infos["sandbox_id"])) == 3
            obs, rewards, *_ = vec.step(["cat b.txt", "cat b.txt", "cat b.txt"])
            assert list(obs) == ["base\n"] * 3
            assert list(rewards) == [0.0] * 3
        finally:
            vec.close()


def test_a_plain_sandbox_snapshot_starts_a_new_episode_on_its_state(fake: FakeProvider) -> None:
    with make(fake) as env:
        env.reset()
        env.step("echo kept > k.txt")
        assert env.sandbox_id is not None
        plain = asyncio.run(fake.take_snapshot(_handle(env.sandbox_id), name="plain"))
        obs, info = env.reset(options={"snapshot": plain, "task": "new"})
        assert (obs, info["task"], info["snapshot"]) == ("Sandbox ready.", "new", "fake/plain")
        assert "step" not in info
        assert env.step("cat k.txt")[0] == "kept\n"
        obs, info = env.reset(options={"snapshot": "fake/plain"})  # a provider's snapshot() id
        assert (obs, info["snapshot"]) == ("Sandbox ready.", "fake/plain")
        assert env.step("cat k.txt")[0] == "kept\n"


def _handle(sandbox_id: str) -> Any:
    from gym_substrate.nemo.types import SandboxHandle

    return SandboxHandle(sandbox_id=sandbox_id, provider_name="fake", raw=None)


def test_an_env_snapshot_pickles_by_value(fake: FakeProvider) -> None:
    with make(fake) as env:
        env.reset(options={"task": "t"})
        env.step("ls")
        snap = env.snapshot()
    again = pickle.loads(pickle.dumps(snap))
    assert isinstance(again, EnvSnapshot)
    assert (again.ref, again.step, again.task, again.observation) == (
        snap.ref,
        1,
        "t",
        snap.observation,
    )
    assert again.reward_fn is not snap.reward_fn  # a copy, with the same state
    assert vars(again.reward_fn) == vars(snap.reward_fn)


def test_snapshot_needs_an_episode_in_progress(fake: FakeProvider) -> None:
    with make(fake, max_episode_steps=1) as env:
        with pytest.raises(RuntimeError, match="needs an episode in progress: call reset"):
            env.snapshot()
        env.reset()
        env.step("true")  # truncated: the sandbox is released
        with pytest.raises(RuntimeError, match="this episode has ended \\(truncated\\)"):
            env.snapshot()


def test_reset_from_a_snapshot_checks_what_it_is_given(fake: FakeProvider) -> None:
    with make(fake) as env:
        env.reset()
        env.step("true")
        snap = env.snapshot()
        with pytest.raises(TypeError, match="takes what env.snapshot\\(\\)"):
            env.reset(options={"snapshot": 42})
        with pytest.raises(ValueError, match="must be 'atespace/tag'"):
            env.reset(options={"snapshot": "not-a-ref"})
        with pytest.raises(ValueError, match="got both 'snapshot' and 'task'"):
            env.reset(options={"snapshot": snap, "task": "x"})
        with pytest.raises(ValueError, match="unknown keys \\['seed'\\]"):
            env.reset(options={"seed": 1})
    other = SandboxEnv(ExitCodeReward(), SparseTaskTermination(solved), fake)
    with other, pytest.raises(ValueError, match="whose reward_fn is FileCreatedReward"):
        other.reset(options={"snapshot": snap})
    short = make(fake, max_episode_steps=1)
    with short, pytest.raises(ValueError, match="taken at step 1.*max_episode_steps=1"):
        short.reset(options={"snapshot": snap})


def test_a_provider_without_snapshots_says_so(tmp_path: Path) -> None:
    class NoSnapshots:
        def __init__(self) -> None:
            self.inner = FakeProvider(root=str(tmp_path))

        async def create(self, spec: Any) -> Any:
            return await self.inner.create(spec)

        async def exec(self, handle: Any, command: str, **kw: Any) -> Any:
            return await self.inner.exec(handle, command, **kw)

        async def close(self, handle: Any) -> None:
            await self.inner.close(handle)

        async def aclose(self) -> None:
            pass

    with make(NoSnapshots()) as env:
        env.reset()
        with pytest.raises(TypeError, match="cannot snapshot sandboxes: it has no snapshot"):
            env.snapshot()
