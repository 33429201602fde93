"""SandboxEnv semantics against an in-process fake provider (no backend needed)."""

from __future__ import annotations

import asyncio
import pickle
import re
import threading
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest
from envs_helpers import FakeProvider, result
from gymnasium import error as gym_error
from gymnasium.vector import SyncVectorEnv

from gym_substrate.envs import (
    ENV_ID,
    ExitCodeReward,
    SandboxEnv,
    SparseTaskTermination,
    register_envs,
)
from gym_substrate.envs.env import READY_OBSERVATION, TIMEOUT_EXIT_CODE


def never(obs: str, info: dict[str, Any]) -> bool:
    return False


def make(provider: Any, **kwargs: Any) -> SandboxEnv:
    return SandboxEnv(ExitCodeReward(), SparseTaskTermination(never), provider, **kwargs)


@pytest.fixture
def fake(tmp_path: Path) -> FakeProvider:
    return FakeProvider(root=str(tmp_path))


def test_reset_gives_a_fresh_sandbox_and_passes_the_task(fake: FakeProvider) -> None:
    with make(fake, image="python:3.12", template="local/sandbox") as env:
        obs, info = env.reset(options={"task": "make hello.txt"})
        assert obs == READY_OBSERVATION
        assert info == {"sandbox_id": "fake-1", "task": "make hello.txt"}
        assert fake.specs[0].image == "python:3.12"
        assert fake.specs[0].provider_options == {"template": "local/sandbox"}
        env.step("true")
        _, info = env.reset()
        assert info["sandbox_id"] == "fake-2"
        assert fake.closed == ["fake-1"]  # the mid-episode sandbox went at reset


def test_step_observation_and_info(fake: FakeProvider) -> None:
    with make(fake, cwd="/tmp", env={"GREETING": "hi"}) as env:
        env.reset()
        obs, reward, terminated, truncated, info = env.step("echo $GREETING; echo oops >&2; exit 3")
        assert obs == "hi\n\n[stderr]\noops\n"
        assert reward == -1.0
        assert (terminated, truncated) == (False, False)
        assert {k: v for k, v in info.items() if k != "elapsed_ms"} == {
            "exit_code": 3,
            "stdout": "hi\n",
            "stderr": "oops\n",
            "step": 1,
            "env_error": False,
            "error_type": None,
        }
        assert isinstance(info["elapsed_ms"], int)
        assert fake.calls[0].cwd == "/tmp"
        assert fake.calls[0].env == {"GREETING": "hi"}
        assert fake.calls[0].timeout_s == 60.0
        obs, *_ = env.step("true")
        assert obs == ""
        assert obs in env.observation_space


def test_long_output_is_cut_in_the_observation_but_whole_in_info(fake: FakeProvider) -> None:
    with make(fake, max_obs_length=100) as env:
        env.reset()
        obs, *_, info = env.step("seq 1 1000")
        assert len(obs) == 100
        assert obs.startswith("1\n2\n3\n")
        assert obs.endswith("999\n1000\n")
        assert "characters cut" in obs
        assert info["stdout"].count("\n") == 1000


def test_exception_is_an_env_error_and_the_episode_continues(fake: FakeProvider) -> None:
    async def boom(command: str) -> Any:
        if command == "explode":
            raise ConnectionResetError("connection lost")
        return None

    fake.handler = boom
    with make(fake) as env:
        env.reset()
        obs, reward, terminated, truncated, info = env.step("explode")
        assert obs == "[stderr]\nConnectionResetError: connection lost"
        assert (info["exit_code"], info["env_error"], info["error_type"]) == (-1, True, "sandbox")
        assert reward == -1.0
        assert not terminated
        assert not truncated
        _, _, _, _, info = env.step("true")
        assert (info["exit_code"], info["env_error"], info["step"]) == (0, False, 2)


def test_provider_error_results_map_to_env_error_or_timeout(fake: FakeProvider) -> None:
    scripted = {
        "broken": result(stderr="agent unreachable", code=125, error_type="sandbox"),
        "slow": result(code=125, error_type="timeout"),
    }

    async def script(command: str) -> Any:
        return scripted.get(command)

    fake.handler = script
    with make(fake, step_timeout_s=2) as env:
        env.reset()
        obs, _, _, _, info = env.step("broken")
        assert (info["exit_code"], info["env_error"]) == (-1, True)
        assert obs == "[stderr]\nagent unreachable"
        obs, _, _, _, info = env.step("slow")
        assert (info["exit_code"], info["env_error"]) == (TIMEOUT_EXIT_CODE, False)
        assert obs == "[stderr]\ncommand timed out after 2 s"


def test_truncation_releases_the_sandbox_and_further_steps_raise(fake: FakeProvider) -> None:
    with make(fake, max_episode_steps=2) as env:
        env.reset()
        assert env.step("true")[3] is False
        _, _, terminated, truncated, _ = env.step("true")
        assert (terminated, truncated) == (False, True)
        assert fake.open == {}
        assert env.sandbox_id is None
        message = (
            "This episode has ended (truncated) and its sandbox was released; "
            "call reset() to start a new one."
        )
        with pytest.raises(RuntimeError, match=f"^{re.escape(message)}$"):
            env.step("true")
        env.reset()
        assert env.step("true")[3] is False


def test_termination_releases_the_sandbox_right_away(fake: FakeProvider) -> None:
    term = SparseTaskTermination(lambda obs, info: "done" in obs)
    with SandboxEnv(ExitCodeReward(), term, fake) as env:
        env.reset()
        _, _, terminated, truncated, _ = env.step("echo done")
        assert (terminated, truncated) == (True, False)
        assert fake.open == {}
        assert fake.closed == ["fake-1"]
        with pytest.raises(RuntimeError, match=r"^This episode has ended \(terminated\)"):
            env.step("true")


def test_a_failing_release_is_reported_in_info(fake: FakeProvider) -> None:
    with make(fake, max_episode_steps=1) as env:
        env.reset()
        fake.close_error = RuntimeError("delete refused")
        *_, truncated, info = env.step("true")
        assert truncated is True
        assert info["release_error"] == "RuntimeError: delete refused"
        fake.close_error = None


def test_step_before_reset_and_use_after_close(fake: FakeProvider) -> None:
    """Out of turn, the env raises Gymnasium's own errors (ResetNeeded, ClosedEnvironmentError,
    gymnasium/error.py), which stay RuntimeErrors for callers written against the old ones."""
    env = make(fake)
    with pytest.raises(gym_error.ResetNeeded, match=r"^Call reset\(\) before step\(\)\.$"):
        env.step("true")
    with pytest.raises(gym_error.ResetNeeded, match="needs an episode in progress"):
        env.snapshot()
    assert repr(env).startswith("<SandboxEnv idle ")
    env.reset()
    env.close()
    env.close()  # idempotent
    assert fake.open == {}
    assert fake.aclosed == 0  # the caller owns a provider instance it passed in
    closed = "This SandboxEnv is closed; create a new one."
    with pytest.raises(gym_error.ClosedEnvironmentError, match=f"^{re.escape(closed)}$"):
        env.step("true")
    with pytest.raises(RuntimeError, match=f"^{re.escape(closed)}$"):
        env.reset()
    assert env.closed
    assert repr(env).startswith("<SandboxEnv closed ")


def test_one_loop_thread_per_env_reused_by_every_call(fake: FakeProvider) -> None:
    def loop_threads() -> set[threading.Thread]:
        return {t for t in threading.enumerate() if t.name == "gym-substrate-env-loop"}

    before = loop_threads()
    env = make(fake)
    assert loop_threads() == before  # nothing started until first use
    env.reset()
    for _ in range(5):
        env.step("true")
    threads = {c.thread for c in fake.calls}
    assert len(threads) == 1
    assert len({id(c.loop) for c in fake.calls}) == 1
    (thread,) = threads
    assert thread is not threading.current_thread()
    assert loop_threads() - before == {thread}
    env.close()
    assert not thread.is_alive()


def test_actions_outside_the_space_are_rejected(fake: FakeProvider) -> None:
    with make(fake) as env:
        env.reset()
        with pytest.raises(ValueError, match="^action is outside the action space"):
            env.step("echo \x00")
        with pytest.raises(TypeError, match="^action must be a str"):
            env.step(b"true")  # type: ignore[arg-type]


def test_shell_wraps_the_action(fake: FakeProvider) -> None:
    with make(fake, shell="bash") as env:
        env.reset()
        obs, *_ = env.step('echo $0 "it\'s"')
        assert fake.calls[-1].command == "bash -c 'echo $0 \"it'\"'\"'s\"'"
        assert obs == "bash it's\n"


def test_render_ansi(fake: FakeProvider) -> None:
    with make(fake, render_mode="ansi") as env:
        env.reset()
        assert env.render() == READY_OBSERVATION
        env.step("echo hi")
        assert env.render() == "$ echo hi\nhi\n\n[exit code 0]"


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (
            {"provider": {"docker": {}}},
            ValueError,
            "SandboxEnv(provider=...) as a mapping must have exactly one key, 'substrate', "
            "holding the provider config (as in a NeMo Gym `sandbox:` block), got keys ['docker']",
        ),
        (
            {"provider": {"substrate": 3}},
            TypeError,
            "SandboxEnv(provider={'substrate': ...}) must map to the provider config "
            "(a mapping), got int",
        ),
        (
            {"provider": "substrate"},
            TypeError,
            "SandboxEnv(provider=...) must be a mapping {'substrate': {...provider config...}} "
            "or a sandbox provider instance (with create/exec/close), got <class 'str'>",
        ),
        (
            {"max_episode_steps": 0},
            ValueError,
            "SandboxEnv(max_episode_steps=...) must be >= 1, got 0",
        ),
        (
            {"max_episode_steps": True},
            TypeError,
            "SandboxEnv(max_episode_steps=...) must be an integer, got True",
        ),
        (
            {"step_timeout_s": -1},
            ValueError,
            "SandboxEnv(step_timeout_s=...) must be >= 0.001, got -1",
        ),
        (
            {"max_obs_length": 10},
            ValueError,
            "SandboxEnv(max_obs_length=...) must be >= 64, got 10",
        ),
        (
            {"template": "sandbox"},
            ValueError,
            "SandboxEnv(template=...) must be 'namespace/name', got 'sandbox'",
        ),
        (
            {"env": {"A": 1}},
            TypeError,
            "SandboxEnv(env=...) must map variable names to string values",
        ),
        (
            {"shell": ""},
            ValueError,
            "SandboxEnv(shell=...) must not be empty, got ''",
        ),
        (
            {"render_mode": "human"},
            ValueError,
            "SandboxEnv(render_mode=...) must be None or one of ['ansi'], got 'human'",
        ),
    ],
)
def test_bad_constructor_arguments(
    fake: FakeProvider, kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    kwargs = {"provider": fake, **kwargs}
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        SandboxEnv(ExitCodeReward(), SparseTaskTermination(never), **kwargs)


def test_reward_and_termination_types_are_checked(fake: FakeProvider) -> None:
    with pytest.raises(TypeError, match="^reward_fn must be a RewardFn instance"):
        SandboxEnv(lambda *a: 1.0, SparseTaskTermination(never), fake)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="^termination_fn must be a TerminationFn instance"):
        SandboxEnv(ExitCodeReward(), never, fake)  # type: ignore[arg-type]


def test_reset_options_are_validated(fake: FakeProvider) -> None:
    with make(fake) as env, pytest.raises(ValueError, match=r"unknown keys \['seed'\]"):
        env.reset(options={"seed": 1})


CONNECTION = {"api": "127.0.0.1:1", "router": "http://127.0.0.1:2", "tls": {"plaintext": True}}


def test_pickles_by_constructor_arguments() -> None:
    env = make({"substrate": {"connection": CONNECTION}}, max_episode_steps=7)
    clone = pickle.loads(pickle.dumps(env))
    assert isinstance(clone, SandboxEnv)
    assert clone is not env
    assert clone.max_episode_steps == 7
    assert clone._init_kwargs["provider"] == {"substrate": {"connection": CONNECTION}}
    assert not clone._runtime.loop.started
    env.close()
    clone.close()


def test_an_env_around_a_provider_instance_refuses_to_pickle(fake: FakeProvider) -> None:
    with make(fake) as env, pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(env)


def test_registered_and_made_through_gym_make(fake: FakeProvider) -> None:
    register_envs()
    register_envs()  # harmless
    env = gym.make(
        ENV_ID,
        reward_fn=ExitCodeReward(),
        termination_fn=SparseTaskTermination(never),
        provider=fake,
    )
    try:
        assert env.spec is not None
        assert env.spec.nondeterministic
        obs, _ = env.reset()
        assert obs == READY_OBSERVATION
        assert env.step("echo hi")[0] == "hi\n"
    finally:
        env.close()
    assert fake.open == {}


def test_sync_vector_env_autoresets_with_fresh_sandboxes(fake: FakeProvider) -> None:
    term = SparseTaskTermination(lambda obs, info: "stop" in obs)
    vec = SyncVectorEnv([lambda: SandboxEnv(ExitCodeReward(), term, fake) for _ in range(2)])
    try:
        obs, infos = vec.reset()
        assert list(obs) == [READY_OBSERVATION] * 2
        obs, rewards, terminated, truncated, infos = vec.step(("echo stop", "echo go"))
        assert list(terminated) == [True, False]
        assert len(fake.open) == 1  # the finished one is already released
        obs, *_ = vec.step(("echo ignored", "echo go"))  # next-step autoreset of env 0
        assert obs[0] == READY_OBSERVATION
        assert len(fake.open) == 2
    finally:
        vec.close()
    assert fake.open == {}


def test_garbage_collected_env_releases_its_sandbox(fake: FakeProvider) -> None:
    import gc

    env = make(fake)
    env.reset()
    del env
    gc.collect()
    assert fake.open == {}


def test_loop_is_not_the_callers(fake: FakeProvider) -> None:
    async def inside_a_running_loop() -> None:
        with make(fake) as env:  # a sync env used from async code still works
            env.reset()
            assert env.step("echo x")[0] == "x\n"

    asyncio.run(inside_a_running_loop())


def test_a_failed_create_leaves_no_episode(fake: FakeProvider) -> None:
    from gym_substrate.nemo.types import SandboxCreateError

    with make(fake) as env:
        env.reset()
        original = fake.create

        async def refuse(spec: Any) -> Any:
            raise SandboxCreateError("no free workers")

        fake.create = refuse  # type: ignore[method-assign]
        with pytest.raises(SandboxCreateError, match="^no free workers$"):
            env.reset()
        assert fake.open == {}  # the previous episode's sandbox was still released
        with pytest.raises(RuntimeError, match=r"^Call reset\(\) before step\(\)\.$"):
            env.step("true")
        fake.create = original  # type: ignore[method-assign]
        env.reset()
        assert env.step("echo ok")[0] == "ok\n"


def _run_in_child(loop: Any, queue: Any) -> None:
    import os

    async def whoami() -> int:
        return os.getpid()

    queue.put(loop.run(whoami(), timeout=10))


def test_loop_thread_is_recreated_after_fork() -> None:
    import multiprocessing
    import os

    from gym_substrate.envs._loop import LoopThread

    async def whoami() -> int:
        return os.getpid()

    loop = LoopThread()
    assert loop.run(whoami()) == os.getpid()  # the parent's thread is running
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_run_in_child, args=(loop, queue))
    child.start()
    child.join(30)
    assert child.exitcode == 0
    assert queue.get(timeout=5) == child.pid  # a new loop thread ran it in the child
    assert loop.run(whoami()) == os.getpid()  # the parent's is untouched
    loop.close()


def test_a_bad_provider_config_fails_in_the_constructor() -> None:
    from gym_substrate.nemo.errors import ConfigError

    with pytest.raises(ConfigError, match="^connection: missing required key"):
        make({"substrate": {"connection": {"api": "127.0.0.1:1"}}})
    with pytest.raises(ConfigError, match="^exec.shell: must be an absolute path"):
        make({"substrate": {"connection": CONNECTION, "exec": {"shell": "sh"}}})


def _child_uses_forked_env(env: SandboxEnv, fake: FakeProvider, queue: Any) -> None:
    try:
        env.step("true")
    except RuntimeError as exc:
        stepped = str(exc)
    else:
        stepped = "stepped the parent's sandbox"
    _, info = env.reset()
    queue.put((stepped, list(fake.closed), info["sandbox_id"], env.step("echo child")[0]))
    env.close()


def test_a_forked_copy_never_touches_the_parents_sandbox(fake: FakeProvider) -> None:
    import multiprocessing

    with make(fake) as env:
        _, info = env.reset()
        ctx = multiprocessing.get_context("fork")
        queue = ctx.Queue()
        child = ctx.Process(target=_child_uses_forked_env, args=(env, fake, queue))
        child.start()
        child.join(30)
        assert child.exitcode == 0
        stepped, closed_in_child, child_sandbox, child_obs = queue.get(timeout=5)
        assert stepped == (
            "this episode's sandbox belongs to the process that started it; call reset()"
        )
        assert closed_in_child == []  # the child's reset did not close the parent's sandbox
        assert child_sandbox != info["sandbox_id"]
        assert child_obs == "child\n"
        assert env.step("echo parent")[0] == "parent\n"  # the parent's episode goes on
